//go:build !cgo

package cudart

import "github.com/distbuf/distbuf/internal/dl"

// Without cgo no runtime can be loaded: Load always fails, so no Runtime or
// Device ever exists. The methods below let code that calls the runtime
// compile; each reports the load error.

var errNoCgo = &LoadError{Cause: dl.ErrNoCgo}

// Runtime is a loaded libcudart; without cgo none can be loaded.
type Runtime struct{}

// Device makes calls on one device; without cgo there is none.
type Device struct{}

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

func (rt *Runtime) Device(int) *Device                      { return &Device{} }
func (rt *Runtime) DeviceCount() (int, error)               { return 0, errNoCgo }
func (rt *Runtime) Path() string                            { return "" }
func (rt *Runtime) RuntimeVersion() int                     { return 0 }
func (rt *Runtime) DriverVersion() int                      { return 0 }
func (rt *Runtime) Capabilities() Capabilities              { return Capabilities{} }
func (d *Device) Ordinal() int                              { return 0 }
func (d *Device) MPSEnabled() bool                          { return false }
func (d *Device) Runtime() *Runtime                         { return &Runtime{} }
func (d *Device) ComputeCapability() (int, int, error)      { return 0, 0, errNoCgo }
func (d *Device) LoadKernel([]byte, string) (Kernel, error) { return 0, errNoCgo }
func (d *Device) LoadKernels([]byte, ...string) ([]Kernel, error) {
	return nil, errNoCgo
}
func (d *Device) Launch(Kernel, int, int, int, int, Stream, ...uint64) error { return errNoCgo }
func (d *Device) MemcpyEach(Stream, []uintptr, []uintptr, []uintptr) error   { return errNoCgo }
func (d *Device) MemcpyBatch(Stream, []uintptr, []uintptr, []uintptr) error  { return errNoCgo }
func (d *Device) EventCreateTiming() (Event, error)                          { return 0, errNoCgo }
func (d *Device) EventRecord(Event, Stream) error                            { return errNoCgo }
func (d *Device) EventSynchronize(Event) error                               { return errNoCgo }
func (d *Device) EventElapsedTime(Event, Event) (float64, error)             { return 0, errNoCgo }
func (d *Device) EventDestroy(Event) error                                   { return errNoCgo }
func (d *Device) Malloc(int64) (uintptr, error)                              { return 0, errNoCgo }
func (d *Device) Free(uintptr) error                                         { return errNoCgo }
func (d *Device) CopyToDevice(uintptr, []byte) error                         { return errNoCgo }
func (d *Device) CopyFromDevice([]byte, uintptr) error                       { return errNoCgo }
func (d *Device) Synchronize() error                                         { return errNoCgo }
func (d *Device) StreamCreate() (Stream, error)                              { return 0, errNoCgo }
func (d *Device) StreamDestroy(Stream) error                                 { return errNoCgo }
func (d *Device) StreamSynchronize(Stream) error                             { return errNoCgo }
func (d *Device) StreamWaitEvent(Stream, Event) error                        { return errNoCgo }
func (d *Device) EventCreate() (Event, error)                                { return 0, errNoCgo }
func (d *Device) EventQuery(Event) (bool, error)                             { return false, errNoCgo }
func (d *Device) MemcpyAsync(uintptr, uintptr, int64, Stream) error {
	return errNoCgo
}
func (d *Device) IpcGetMemHandle(uintptr) (IpcMemHandle, error)  { return IpcMemHandle{}, errNoCgo }
func (d *Device) IpcOpenMemHandle(IpcMemHandle) (uintptr, error) { return 0, errNoCgo }
func (d *Device) IpcCloseMemHandle(uintptr) error                { return errNoCgo }
func (d *Device) AddressRange(uintptr) (uintptr, int64, error)   { return 0, 0, errNoCgo }
func (d *Device) EventCreateInterprocess() (Event, error)        { return 0, errNoCgo }
func (d *Device) IpcGetEventHandle(Event) (IpcEventHandle, error) {
	return IpcEventHandle{}, errNoCgo
}
func (d *Device) IpcOpenEventHandle(IpcEventHandle) (Event, error) { return 0, errNoCgo }
