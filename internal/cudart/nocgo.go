//go:build !cgo

package cudart

import (
	"unsafe"

	"github.com/distbuf/distbuf/internal/dl"
)

// Without cgo no runtime can be loaded: Load always fails, so no Runtime or
// Device ever exists. The declarations below give this file the API of the
// cgo build, so that every package calling the runtime compiles with
// CGO_ENABLED=0; each method reports the load error (matching ErrUnavailable
// and dl.ErrNoCgo).

var errNoCgo = &LoadError{Cause: dl.ErrNoCgo}

// Runtime is a loaded libcudart; without cgo none can be loaded.
type Runtime struct{}

// Device makes calls on one device; without cgo there is none.
type Device struct{}

// DeviceAttr is an enum cudaDeviceAttr value. The values are cudart_decl.h's;
// without cgo none ever reaches a runtime.
type DeviceAttr int

// The device attributes distbuf reads.
const (
	AttrMultiProcessorCount    DeviceAttr = 16
	AttrCanMapHostMemory       DeviceAttr = 19
	AttrUnifiedAddressing      DeviceAttr = 41
	AttrComputeCapabilityMajor DeviceAttr = 75
	AttrComputeCapabilityMinor DeviceAttr = 76
	AttrMemoryPoolsSupported   DeviceAttr = 115
	AttrMPSEnabled             DeviceAttr = 133
)

// PoolAttr is an enum cudaMemPoolAttr value.
type PoolAttr int

// The pool attributes distbuf reads and sets.
const (
	PoolReuseFollowEventDependencies   PoolAttr = 1
	PoolReuseAllowOpportunistic        PoolAttr = 2
	PoolReuseAllowInternalDependencies PoolAttr = 3
	PoolAttrReleaseThreshold           PoolAttr = 4
	PoolAttrReservedMemCurrent         PoolAttr = 5
	PoolAttrReservedMemHigh            PoolAttr = 6
	PoolAttrUsedMemCurrent             PoolAttr = 7
	PoolAttrUsedMemHigh                PoolAttr = 8
)

// HostAllocFlags are cudaHostAlloc flags.
type HostAllocFlags uint

// The cudaHostAlloc flags distbuf uses.
const (
	HostAllocPortable HostAllocFlags = 0x01
	HostAllocMapped   HostAllocFlags = 0x02
)

// Load always fails without cgo: shared libraries cannot be opened.
func Load() (*Runtime, error) { return nil, errNoCgo }

// Calls is empty without cgo: no runtime is ever called.
func Calls() Counts      { return Counts{} }
func CallsTotal() uint64 { return 0 }

func readCalls(n, ns []uint64) ([]uint64, []uint64) { return n[:0], ns[:0] }

// EntryPoints is empty without cgo.
func EntryPoints() []string { return nil }

// SetTiming does nothing without cgo: no runtime is ever called.
func SetTiming(bool)              {}
func symbolNamesFor(int) []string { return nil }

func (rt *Runtime) Device(int) *Device            { return &Device{} }
func (rt *Runtime) DeviceCount() (int, error)     { return 0, errNoCgo }
func (rt *Runtime) Path() string                  { return "" }
func (rt *Runtime) RuntimeVersion() int           { return 0 }
func (rt *Runtime) DriverVersion() int            { return 0 }
func (rt *Runtime) Capabilities() Capabilities    { return Capabilities{} }
func (rt *Runtime) Table() unsafe.Pointer         { return nil }
func (rt *Runtime) SetDeviceFunc() unsafe.Pointer { return nil }

func (d *Device) Ordinal() int                      { return 0 }
func (d *Device) Runtime() *Runtime                 { return &Runtime{} }
func (d *Device) MPSEnabled() bool                  { return false }
func (d *Device) Attribute(DeviceAttr) (int, error) { return 0, errNoCgo }
func (d *Device) Name() (string, error)             { return "", errNoCgo }
func (d *Device) MemGetInfo() (int64, int64, error) {
	return 0, 0, errNoCgo
}
func (d *Device) ComputeCapability() (int, int, error) { return 0, 0, errNoCgo }
func (d *Device) Synchronize() error                   { return errNoCgo }

// Streams, events and host functions.
func (d *Device) StreamCreate() (Stream, error)                    { return 0, errNoCgo }
func (d *Device) StreamDestroy(Stream) error                       { return errNoCgo }
func (d *Device) StreamSynchronize(Stream) error                   { return errNoCgo }
func (d *Device) StreamWaitEvent(Stream, Event) error              { return errNoCgo }
func (d *Device) StreamWaitValueGEQ(Stream, uintptr, uint32) error { return errNoCgo }
func (d *Device) EventCreate() (Event, error)                      { return 0, errNoCgo }
func (d *Device) EventCreateTiming() (Event, error)                { return 0, errNoCgo }
func (d *Device) EventRecord(Event, Stream) error                  { return errNoCgo }
func (d *Device) EventQuery(Event) (bool, error)                   { return false, errNoCgo }
func (d *Device) EventSynchronize(Event) error                     { return errNoCgo }
func (d *Device) EventElapsedTime(Event, Event) (float64, error)   { return 0, errNoCgo }
func (d *Device) EventDestroy(Event) error                         { return errNoCgo }
func (d *Device) LaunchHostFunc(Stream, func()) error              { return errNoCgo }

// Memory: device, pinned and pooled.
func (d *Device) Malloc(int64) (uintptr, error)                           { return 0, errNoCgo }
func (d *Device) Free(uintptr) error                                      { return errNoCgo }
func (d *Device) HostAlloc(int64, HostAllocFlags) (unsafe.Pointer, error) { return nil, errNoCgo }
func (d *Device) FreeHost(unsafe.Pointer) error                           { return errNoCgo }
func (d *Device) HostDevicePointer(unsafe.Pointer) (uintptr, error)       { return 0, errNoCgo }
func (d *Device) MemPoolCreate() (MemPool, error)                         { return 0, errNoCgo }
func (d *Device) MemPoolDestroy(MemPool) error                            { return errNoCgo }
func (d *Device) MemPoolSetUint64(MemPool, PoolAttr, uint64) error        { return errNoCgo }
func (d *Device) MemPoolSetInt(MemPool, PoolAttr, int) error              { return errNoCgo }
func (d *Device) MemPoolGetUint64(MemPool, PoolAttr) (uint64, error)      { return 0, errNoCgo }
func (d *Device) MemPoolGetInt(MemPool, PoolAttr) (int, error)            { return 0, errNoCgo }
func (d *Device) MemPoolTrimTo(MemPool, int64) error                      { return errNoCgo }
func (d *Device) MallocFromPoolAsync(int64, MemPool, Stream) (uintptr, error) {
	return 0, errNoCgo
}
func (d *Device) FreeAsync(uintptr, Stream) error { return errNoCgo }

// Copies.
func (d *Device) Memcpy(uintptr, uintptr, int64) error                      { return errNoCgo }
func (d *Device) MemcpyAsync(uintptr, uintptr, int64, Stream) error         { return errNoCgo }
func (d *Device) MemsetAsync(uintptr, byte, int64, Stream) error            { return errNoCgo }
func (d *Device) MemcpyEach(Stream, []uintptr, []uintptr, []uintptr) error  { return errNoCgo }
func (d *Device) MemcpyBatch(Stream, []uintptr, []uintptr, []uintptr) error { return errNoCgo }
func (d *Device) CopyToDevice(uintptr, []byte) error                        { return errNoCgo }
func (d *Device) CopyFromDevice([]byte, uintptr) error                      { return errNoCgo }

// Kernels.
func (d *Device) LoadKernel([]byte, string) (Kernel, error)       { return 0, errNoCgo }
func (d *Device) LoadKernels([]byte, ...string) ([]Kernel, error) { return nil, errNoCgo }
func (d *Device) Launch(Kernel, int, int, int, int, Stream, ...uint64) error {
	return errNoCgo
}

// Interprocess memory and events.
func (d *Device) IpcGetMemHandle(uintptr) (IpcMemHandle, error)  { return IpcMemHandle{}, errNoCgo }
func (d *Device) IpcOpenMemHandle(IpcMemHandle) (uintptr, error) { return 0, errNoCgo }
func (d *Device) IpcCloseMemHandle(uintptr) error                { return errNoCgo }
func (d *Device) AddressRange(uintptr) (uintptr, int64, error)   { return 0, 0, errNoCgo }
func (d *Device) EventCreateInterprocess() (Event, error)        { return 0, errNoCgo }
func (d *Device) IpcGetEventHandle(Event) (IpcEventHandle, error) {
	return IpcEventHandle{}, errNoCgo
}
func (d *Device) IpcOpenEventHandle(IpcEventHandle) (Event, error) { return 0, errNoCgo }
