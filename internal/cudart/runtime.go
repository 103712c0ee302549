//go:build cgo

package cudart

/*
#cgo nocallback dbc_malloc_from_pool
#cgo nocallback dbc_free_async
#cgo nocallback dbc_memset_async
#cgo nocallback dbc_memcpy_async
#cgo nocallback dbc_event_record
#cgo nocallback dbc_event_query
#cgo nocallback dbc_stream_wait_event
#cgo noescape dbc_calls_snapshot
#cgo nocallback dbc_calls_snapshot
#include <stdlib.h>
#include "cudart_calls.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime/cgo"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/distbuf/distbuf/internal/dl"
)

// Compile-time proof that the Go error codes equal the header's.
const (
	_ uint = C.DBC_ERROR_MEMORY_ALLOCATION - codeMemoryAllocation
	_ uint = codeMemoryAllocation - C.DBC_ERROR_MEMORY_ALLOCATION
	_ uint = C.DBC_ERROR_NO_DEVICE - codeNoDevice
	_ uint = codeNoDevice - C.DBC_ERROR_NO_DEVICE
	_ uint = C.DBC_ERROR_INSUFFICIENT_DRIVER - codeInsufficientDriver
	_ uint = codeInsufficientDriver - C.DBC_ERROR_INSUFFICIENT_DRIVER
	_ uint = C.DBC_ERROR_NOT_READY - codeNotReady
	_ uint = codeNotReady - C.DBC_ERROR_NOT_READY
	_ uint = C.DBC_ERROR_NOT_SUPPORTED - codeNotSupported
	_ uint = codeNotSupported - C.DBC_ERROR_NOT_SUPPORTED
	_ uint = C.DBC_ERROR_STUB_LIBRARY - codeStubLibrary
	_ uint = codeStubLibrary - C.DBC_ERROR_STUB_LIBRARY
	_ uint = C.DBC_ERROR_DEVICES_UNAVAILABLE - codeDevicesUnavailable
	_ uint = codeDevicesUnavailable - C.DBC_ERROR_DEVICES_UNAVAILABLE
	_ uint = C.DBC_ERROR_INITIALIZATION - codeInitialization
	_ uint = codeInitialization - C.DBC_ERROR_INITIALIZATION
	_ uint = C.DBC_ERROR_SYSTEM_DRIVER_MISMATCH - codeSystemDriverMismatch
	_ uint = codeSystemDriverMismatch - C.DBC_ERROR_SYSTEM_DRIVER_MISMATCH
	_ uint = C.DBC_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE - codeCompatNotSupportedDevice
	_ uint = codeCompatNotSupportedDevice - C.DBC_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
)

// Runtime is one loaded libcudart. It is safe for concurrent use and lives
// until the process exits.
type Runtime struct {
	lib            *dl.Library
	api            *C.dbc_api
	table          C.uintptr_t // api as an integer, for the hot path's calls (cudart_calls.h)
	caps           Capabilities
	runtimeVersion int
	driverVersion  int
}

var (
	loadMu sync.Mutex
	loaded = map[string]*Runtime{}
)

// Load returns the process's runtime, opening it on first use. A failure is
// not remembered: each call reports it and the next call tries again.
func Load() (*Runtime, error) {
	key := strings.TrimSpace(os.Getenv(EnvCUDART)) + "\x00" + strings.TrimSpace(os.Getenv(EnvSetDevice))
	loadMu.Lock()
	defer loadMu.Unlock()
	if rt := loaded[key]; rt != nil {
		return rt, nil
	}
	rt, err := open()
	if err != nil {
		return nil, err
	}
	loaded[key] = rt
	return rt, nil
}

func open() (*Runtime, error) {
	lib, err := dl.Open(EnvCUDART, Candidates...)
	if err != nil {
		return nil, &LoadError{Cause: err}
	}
	api := (*C.dbc_api)(C.calloc(1, C.sizeof_dbc_api))
	if api == nil {
		_ = lib.Close()
		return nil, fmt.Errorf("cudart: allocate the function table: %w", ErrOutOfMemory)
	}
	var table []dl.Symbol
	groups := map[string]int{}
	for i := range int(C.dbc_num_symbols()) {
		s := C.dbc_symbol_at(C.size_t(i))
		if s.group == C.DBC_GROUP_DRIVER {
			continue
		}
		name := C.GoString(s.name)
		groups[name] = int(s.group)
		table = append(table, dl.Symbol{
			Name:     name,
			Ptr:      (*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(api), uintptr(s.offset))),
			Optional: s.group != C.DBC_GROUP_REQUIRED,
		})
	}
	absent, err := lib.Bind(table)
	if err != nil {
		_ = lib.Close()
		C.free(unsafe.Pointer(api))
		return nil, &LoadError{Cause: err}
	}
	rt := &Runtime{lib: lib, api: api, table: C.uintptr_t(uintptr(unsafe.Pointer(api)))}
	C.dbc_init_setter(api)
	rt.caps.Absent = absent
	rt.caps.MemoryPools, rt.caps.KernelLaunch, rt.caps.MemcpyBatch, rt.caps.IPC = true, true, true, true
	for _, name := range absent {
		switch groups[name] {
		case C.DBC_GROUP_POOL:
			rt.caps.MemoryPools = false
		case C.DBC_GROUP_KERNEL:
			rt.caps.KernelLaunch = false
		case C.DBC_GROUP_BATCH:
			rt.caps.MemcpyBatch = false
		case C.DBC_GROUP_IPC:
			rt.caps.IPC = false
		}
	}
	rt.caps.DriverEntryPoint = api.cudaGetDriverEntryPointByVersion != nil || api.cudaGetDriverEntryPoint != nil
	if rt.caps.DriverEntryPoint {
		C.dbc_resolve_driver(api)
	}
	rt.caps.StreamWaitValue = api.cuStreamWaitValue32 != nil
	rt.caps.DeviceName = api.cuDeviceGet != nil && api.cuDeviceGetName != nil
	rt.caps.CurrentContext = api.cuCtxGetCurrent != nil
	rt.caps.AddressRange = api.cuMemGetAddressRange != nil
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvSetDevice))); v {
	case "", "auto":
	case "always":
		api.set_device_always = 1
	default:
		_ = lib.Close()
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("cudart: %s=%q: want auto or always: %w", EnvSetDevice, v, ErrInvalid)
	}
	var v C.int
	if C.dbc_runtime_version(api, &v) == 0 {
		rt.runtimeVersion = int(v)
	}
	if C.dbc_driver_version(api, &v) == 0 {
		rt.driverVersion = int(v)
	}
	if rt.runtimeVersion < 12080 {
		// cudaLaunchKernel takes a cudaKernel_t, and cudaMemcpyBatchAsync
		// exists, from CUDA 12.8 on.
		rt.caps.KernelLaunch, rt.caps.MemcpyBatch = false, false
	}
	if rt.runtimeVersion < 12000 {
		// Before CUDA 12, cudaSetDevice may leave the device's primary
		// context uninitialised, and so not current: what cuCtxGetCurrent
		// shows after it need not be that device's context.
		api.set_device_always = 1
	}
	return rt, nil
}

var (
	symbolNamesOnce sync.Once
	symbolNames     []string // by the index of dbc_symbols, which DBC_I_* follow
)

// Calls returns how many calls the loader's trampolines have made to each
// entry point since the process started, over every thread and every loaded
// runtime. Counting costs a plain increment of a per-thread counter on each
// call; reading sums them. Calls made with a runtime's function table by
// other code (other loaders, the benchmark's C baselines) are not counted.
func Calls() Counts {
	var t Tally
	t.Read()
	return t.Counts()
}

// CallsTotal is the sum of Calls, read without allocating: cheap enough to
// take around every solve without changing what it measures.
func CallsTotal() uint64 {
	var raw [C.DBC_I_COUNT]C.uint64_t
	C.dbc_calls_snapshot(&raw[0], nil)
	var n uint64
	for _, k := range raw {
		n += uint64(k)
	}
	return n
}

// readCalls reads the counters into n and the nanoseconds into ns, each
// grown to the number of entry points, indexed as dbc_symbols.
func readCalls(n, ns []uint64) ([]uint64, []uint64) {
	var raw, rawNS [C.DBC_I_COUNT]C.uint64_t
	C.dbc_calls_snapshot(&raw[0], &rawNS[0])
	n = slices.Grow(n[:0], len(raw))[:len(raw)]
	ns = slices.Grow(ns[:0], len(raw))[:len(raw)]
	for i := range raw {
		n[i], ns[i] = uint64(raw[i]), uint64(rawNS[i])
	}
	return n, ns
}

// SetTiming turns the timing of runtime calls on or off for the whole
// process (it starts off). While on, every counted call also adds its
// duration, read by Tally.Durations: two reads of the monotonic clock per
// call, tens of nanoseconds, so leave it off where per-call overhead is
// what is measured.
func SetTiming(on bool) {
	v := C.int(0)
	if on {
		v = 1
	}
	C.dbc_set_timing(v)
}

// EntryPoints names every entry point the loader counts, in a fixed order
// (the same in every process of one build).
func EntryPoints() []string { return slices.Clone(symbolNamesFor(int(C.DBC_I_COUNT))) }

// symbolNamesFor returns the entry points' names by index (n of them).
func symbolNamesFor(n int) []string {
	symbolNamesOnce.Do(func() {
		for i := range int(C.dbc_num_symbols()) {
			symbolNames = append(symbolNames, C.GoString(C.dbc_symbol_at(C.size_t(i)).name))
		}
	})
	return symbolNames[:n]
}

// Table is the address of the runtime's function table, a struct dbc_api of
// cudart_decl.h, for C code in this module that calls the runtime without
// the trampolines: the allocation benchmark's C baseline, which makes the
// calls a C program makes. Calls made through it are not counted by Calls.
// It lives as long as the Runtime.
func (rt *Runtime) Table() unsafe.Pointer { return unsafe.Pointer(rt.api) }

// SetDeviceFunc is how other loaders' C trampolines (cuBLAS, NCCL) set the
// device before each of their calls, as this package's own calls do: a
// const dbc_device_setter * of cudart_setdev.h, called with DBC_SET_DEVICE.
// It skips cudaSetDevice when the device's primary context is already
// current, counts its calls in Calls, and clears the thread's last error
// after a failure. It lives as long as the Runtime.
func (rt *Runtime) SetDeviceFunc() unsafe.Pointer { return unsafe.Pointer(&rt.api.setter) }

// Path is the library name or path that was opened.
func (rt *Runtime) Path() string { return rt.lib.Name }

// Capabilities reports the optional parts that resolved.
func (rt *Runtime) Capabilities() Capabilities {
	c := rt.caps
	c.Absent = append([]string(nil), c.Absent...)
	return c
}

// RuntimeVersion is cudaRuntimeGetVersion (e.g. 13000), 0 if unknown.
func (rt *Runtime) RuntimeVersion() int { return rt.runtimeVersion }

// DriverVersion is cudaDriverGetVersion (e.g. 13000), 0 without a driver.
func (rt *Runtime) DriverVersion() int { return rt.driverVersion }

func (rt *Runtime) fail(op string, dev int, code C.int) error {
	if code == 0 {
		return nil
	}
	return &Error{
		Op: op, Device: dev, Code: int(code),
		Name: C.GoString(C.dbc_error_name(rt.api, code)),
		Text: C.GoString(C.dbc_error_string(rt.api, code)),
	}
}

// failDriver interprets a trampoline result: positive values are
// cudaError_t from setting the device, negative ones are -CUresult.
func (rt *Runtime) failDriver(op string, dev int, code C.int) error {
	switch {
	case code == 0:
		return nil
	case code > 0:
		return rt.fail(op, dev, code)
	}
	return &DriverError{Op: op, Device: dev, Code: int(-code)}
}

// DeviceCount is cudaGetDeviceCount. With no device or no usable driver it
// returns an error matching ErrUnavailable.
func (rt *Runtime) DeviceCount() (int, error) {
	var n C.int
	if err := rt.fail("cudaGetDeviceCount", -1, C.dbc_device_count(rt.api, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device returns a handle for calls on device ordinal. It does not check that
// the device exists; the first call does.
func (rt *Runtime) Device(ordinal int) *Device { return &Device{rt: rt, ord: C.int(ordinal)} }

// Device makes calls on one device, setting it as current in each call.
type Device struct {
	rt  *Runtime
	ord C.int
}

// DeviceAttr is an enum cudaDeviceAttr value.
type DeviceAttr int

// The device attributes distbuf reads.
const (
	AttrMultiProcessorCount    DeviceAttr = C.DBC_DEV_ATTR_MULTIPROCESSOR_COUNT
	AttrCanMapHostMemory       DeviceAttr = C.DBC_DEV_ATTR_CAN_MAP_HOST_MEMORY
	AttrUnifiedAddressing      DeviceAttr = C.DBC_DEV_ATTR_UNIFIED_ADDRESSING
	AttrComputeCapabilityMajor DeviceAttr = C.DBC_DEV_ATTR_COMPUTE_CAPABILITY_MAJOR
	AttrComputeCapabilityMinor DeviceAttr = C.DBC_DEV_ATTR_COMPUTE_CAPABILITY_MINOR
	AttrMemoryPoolsSupported   DeviceAttr = C.DBC_DEV_ATTR_MEMORY_POOLS_SUPPORTED
	// AttrMPSEnabled is 1 when the device's contexts are shared through MPS
	// (CUDA 12.3+; older runtimes refuse the attribute).
	AttrMPSEnabled DeviceAttr = C.DBC_DEV_ATTR_MPS_ENABLED
)

// PoolAttr is an enum cudaMemPoolAttr value.
type PoolAttr int

// The pool attributes distbuf reads and sets.
const (
	PoolReuseFollowEventDependencies   PoolAttr = C.DBC_MEMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES
	PoolReuseAllowOpportunistic        PoolAttr = C.DBC_MEMPOOL_REUSE_ALLOW_OPPORTUNISTIC
	PoolReuseAllowInternalDependencies PoolAttr = C.DBC_MEMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES
	PoolAttrReleaseThreshold           PoolAttr = C.DBC_MEMPOOL_ATTR_RELEASE_THRESHOLD
	PoolAttrReservedMemCurrent         PoolAttr = C.DBC_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
	PoolAttrReservedMemHigh            PoolAttr = C.DBC_MEMPOOL_ATTR_RESERVED_MEM_HIGH
	PoolAttrUsedMemCurrent             PoolAttr = C.DBC_MEMPOOL_ATTR_USED_MEM_CURRENT
	PoolAttrUsedMemHigh                PoolAttr = C.DBC_MEMPOOL_ATTR_USED_MEM_HIGH
)

// HostAllocFlags are cudaHostAlloc flags.
type HostAllocFlags uint

// The cudaHostAlloc flags distbuf uses.
const (
	HostAllocPortable HostAllocFlags = C.DBC_HOST_ALLOC_PORTABLE
	HostAllocMapped   HostAllocFlags = C.DBC_HOST_ALLOC_MAPPED
)

// Ordinal is the device number.
func (d *Device) Ordinal() int { return int(d.ord) }

// Runtime is the library the device's calls go through.
func (d *Device) Runtime() *Runtime { return d.rt }

func (d *Device) fail(op string, code C.int) error { return d.rt.fail(op, int(d.ord), code) }

func size(op string, n int64) (C.size_t, error) {
	if n < 0 {
		return 0, fmt.Errorf("cudart: %s: negative size %d: %w", op, n, ErrInvalid)
	}
	return C.size_t(n), nil
}

// Attribute is cudaDeviceGetAttribute.
func (d *Device) Attribute(attr DeviceAttr) (int, error) {
	var v C.int
	if err := d.fail("cudaDeviceGetAttribute", C.dbc_attribute(d.rt.api, d.ord, C.int(attr), &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// MPSEnabled reports whether the device's contexts are shared through
// NVIDIA's Multi-Process Service: whether processes on it run their work
// side by side rather than in turns. False where the runtime cannot say
// (before CUDA 12.3).
func (d *Device) MPSEnabled() bool {
	v, err := d.Attribute(AttrMPSEnabled)
	return err == nil && v == 1
}

// Name is the device's product name (cuDeviceGetName).
func (d *Device) Name() (string, error) {
	if !d.rt.caps.DeviceName {
		return "", fmt.Errorf("cudart: device name: cuDeviceGetName not available: %w", ErrNotSupported)
	}
	var buf [256]C.char
	if err := d.rt.failDriver("cuDeviceGetName", int(d.ord), C.dbc_cu_device_name(d.rt.api, d.ord, &buf[0], C.int(len(buf)-1))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// MemGetInfo is cudaMemGetInfo: free and total device memory in bytes.
func (d *Device) MemGetInfo() (free, total int64, err error) {
	var f, t C.size_t
	if err := d.fail("cudaMemGetInfo", C.dbc_mem_info(d.rt.api, d.ord, &f, &t)); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

// StreamCreate makes a stream with cudaStreamNonBlocking: it never
// synchronises with the legacy default stream.
func (d *Device) StreamCreate() (Stream, error) {
	var s C.uintptr_t
	if err := d.fail("cudaStreamCreateWithFlags", C.dbc_stream_create(d.rt.api, d.ord, &s)); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// StreamDestroy is cudaStreamDestroy.
func (d *Device) StreamDestroy(s Stream) error {
	return d.fail("cudaStreamDestroy", C.dbc_stream_destroy(d.rt.api, d.ord, C.uintptr_t(s)))
}

// StreamSynchronize is cudaStreamSynchronize.
func (d *Device) StreamSynchronize(s Stream) error {
	return d.fail("cudaStreamSynchronize", C.dbc_stream_sync(d.rt.table, d.ord, C.uintptr_t(s)))
}

// StreamWaitEvent is cudaStreamWaitEvent: work enqueued on s later waits for ev.
func (d *Device) StreamWaitEvent(s Stream, ev Event) error {
	return d.fail("cudaStreamWaitEvent", C.dbc_stream_wait_event(d.rt.table, d.ord, C.uintptr_t(s), C.uintptr_t(ev)))
}

// StreamWaitValueGEQ is cuStreamWaitValue32 with CU_STREAM_WAIT_VALUE_GEQ:
// work enqueued on s later waits until the 32-bit word at addr (a device
// address, e.g. of mapped pinned memory) reaches value, compared cyclically.
func (d *Device) StreamWaitValueGEQ(s Stream, addr uintptr, value uint32) error {
	if !d.rt.caps.StreamWaitValue {
		return fmt.Errorf("cudart: cuStreamWaitValue32 not available: %w", ErrNotSupported)
	}
	return d.rt.failDriver("cuStreamWaitValue32", int(d.ord),
		C.dbc_cu_wait_value32(d.rt.api, d.ord, C.uintptr_t(s), C.uintptr_t(addr), C.uint32_t(value)))
}

// EventCreate makes an event with cudaEventDisableTiming.
func (d *Device) EventCreate() (Event, error) {
	var ev C.uintptr_t
	if err := d.fail("cudaEventCreateWithFlags", C.dbc_event_create(d.rt.api, d.ord, C.DBC_EVENT_DISABLE_TIMING, &ev)); err != nil {
		return 0, err
	}
	return Event(ev), nil
}

// EventRecord is cudaEventRecord.
func (d *Device) EventRecord(ev Event, s Stream) error {
	return d.fail("cudaEventRecord", C.dbc_event_record(d.rt.table, d.ord, C.uintptr_t(ev), C.uintptr_t(s)))
}

// EventQuery reports without blocking whether the work before ev has run.
func (d *Device) EventQuery(ev Event) (bool, error) {
	code := C.dbc_event_query(d.rt.table, d.ord, C.uintptr_t(ev))
	if code == codeNotReady {
		return false, nil
	}
	if err := d.fail("cudaEventQuery", code); err != nil {
		return false, err
	}
	return true, nil
}

// EventSynchronize blocks until the work before ev has run.
func (d *Device) EventSynchronize(ev Event) error {
	return d.fail("cudaEventSynchronize", C.dbc_event_sync(d.rt.api, d.ord, C.uintptr_t(ev)))
}

// EventDestroy is cudaEventDestroy.
func (d *Device) EventDestroy(ev Event) error {
	return d.fail("cudaEventDestroy", C.dbc_event_destroy(d.rt.api, d.ord, C.uintptr_t(ev)))
}

// LaunchHostFunc is cudaLaunchHostFunc: fn runs on a runtime thread once the
// work enqueued on s before it has run. fn must not call CUDA, must not
// block for long (host functions of all streams may share one thread) and
// must not panic.
func (d *Device) LaunchHostFunc(s Stream, fn func()) error {
	if fn == nil {
		return fmt.Errorf("cudart: cudaLaunchHostFunc: nil function: %w", ErrInvalid)
	}
	h := cgo.NewHandle(fn)
	if err := d.fail("cudaLaunchHostFunc", C.dbc_launch_host_func(d.rt.api, d.ord, C.uintptr_t(s), C.uintptr_t(h))); err != nil {
		h.Delete()
		return err
	}
	return nil
}

// Malloc is cudaMalloc.
func (d *Device) Malloc(n int64) (uintptr, error) {
	sz, err := size("cudaMalloc", n)
	if err != nil {
		return 0, err
	}
	var p C.uintptr_t
	if err := d.fail("cudaMalloc", C.dbc_malloc(d.rt.api, d.ord, &p, sz)); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// Free is cudaFree. It may wait for all work on the device.
func (d *Device) Free(p uintptr) error {
	return d.fail("cudaFree", C.dbc_free(d.rt.api, d.ord, C.uintptr_t(p)))
}

// MemcpyAsync is cudaMemcpyAsync with cudaMemcpyDefault: any direction
// between device, pinned and (with unified addressing) host memory.
func (d *Device) MemcpyAsync(dst, src uintptr, n int64, s Stream) error {
	sz, err := size("cudaMemcpyAsync", n)
	if err != nil {
		return err
	}
	return d.fail("cudaMemcpyAsync", C.dbc_memcpy_async(d.rt.table, d.ord, C.uintptr_t(dst), C.uintptr_t(src), sz, C.uintptr_t(s)))
}

// MemsetAsync is cudaMemsetAsync.
func (d *Device) MemsetAsync(dst uintptr, val byte, n int64, s Stream) error {
	sz, err := size("cudaMemsetAsync", n)
	if err != nil {
		return err
	}
	return d.fail("cudaMemsetAsync", C.dbc_memset_async(d.rt.table, d.ord, C.uintptr_t(dst), C.int(val), sz, C.uintptr_t(s)))
}

// HostAlloc is cudaHostAlloc: page-locked host memory, outside the Go heap.
func (d *Device) HostAlloc(n int64, flags HostAllocFlags) (unsafe.Pointer, error) {
	sz, err := size("cudaHostAlloc", n)
	if err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	if err := d.fail("cudaHostAlloc", C.dbc_host_alloc(d.rt.api, d.ord, &p, sz, C.uint(flags))); err != nil {
		return nil, err
	}
	return p, nil
}

// FreeHost is cudaFreeHost. It may wait for all work on the device.
func (d *Device) FreeHost(p unsafe.Pointer) error {
	return d.fail("cudaFreeHost", C.dbc_free_host(d.rt.api, d.ord, p))
}

// HostDevicePointer is cudaHostGetDevicePointer: the device address of
// mapped pinned memory.
func (d *Device) HostDevicePointer(p unsafe.Pointer) (uintptr, error) {
	var dp C.uintptr_t
	if err := d.fail("cudaHostGetDevicePointer", C.dbc_host_device_pointer(d.rt.api, d.ord, &dp, p)); err != nil {
		return 0, err
	}
	return uintptr(dp), nil
}

func (d *Device) needPools(op string) error {
	if !d.rt.caps.MemoryPools {
		return fmt.Errorf("cudart: %s: the runtime has no stream-ordered pool functions: %w", op, ErrNotSupported)
	}
	return nil
}

// MemPoolCreate makes a private pool of device memory on this device
// (pinned allocation type, no export handles, default maximum size).
func (d *Device) MemPoolCreate() (MemPool, error) {
	if err := d.needPools("cudaMemPoolCreate"); err != nil {
		return 0, err
	}
	var p C.uintptr_t
	if err := d.fail("cudaMemPoolCreate", C.dbc_pool_create(d.rt.api, d.ord, &p)); err != nil {
		return 0, err
	}
	return MemPool(p), nil
}

// MemPoolDestroy is cudaMemPoolDestroy. Memory still allocated from the pool
// stays valid; the pool goes away once it is all freed.
func (d *Device) MemPoolDestroy(p MemPool) error {
	if err := d.needPools("cudaMemPoolDestroy"); err != nil {
		return err
	}
	return d.fail("cudaMemPoolDestroy", C.dbc_pool_destroy(d.rt.api, d.ord, C.uintptr_t(p)))
}

// MemPoolSetUint64 sets a cuuint64_t pool attribute.
func (d *Device) MemPoolSetUint64(p MemPool, attr PoolAttr, v uint64) error {
	if err := d.needPools("cudaMemPoolSetAttribute"); err != nil {
		return err
	}
	return d.fail("cudaMemPoolSetAttribute", C.dbc_pool_set_u64(d.rt.api, d.ord, C.uintptr_t(p), C.int(attr), C.uint64_t(v)))
}

// MemPoolSetInt sets an int pool attribute (the reuse flags).
func (d *Device) MemPoolSetInt(p MemPool, attr PoolAttr, v int) error {
	if err := d.needPools("cudaMemPoolSetAttribute"); err != nil {
		return err
	}
	return d.fail("cudaMemPoolSetAttribute", C.dbc_pool_set_int(d.rt.api, d.ord, C.uintptr_t(p), C.int(attr), C.int(v)))
}

// MemPoolGetUint64 reads a cuuint64_t pool attribute.
func (d *Device) MemPoolGetUint64(p MemPool, attr PoolAttr) (uint64, error) {
	if err := d.needPools("cudaMemPoolGetAttribute"); err != nil {
		return 0, err
	}
	var v C.uint64_t
	if err := d.fail("cudaMemPoolGetAttribute", C.dbc_pool_get_u64(d.rt.api, d.ord, C.uintptr_t(p), C.int(attr), &v)); err != nil {
		return 0, err
	}
	return uint64(v), nil
}

// MemPoolGetInt reads an int pool attribute (the reuse flags).
func (d *Device) MemPoolGetInt(p MemPool, attr PoolAttr) (int, error) {
	if err := d.needPools("cudaMemPoolGetAttribute"); err != nil {
		return 0, err
	}
	var v C.int
	if err := d.fail("cudaMemPoolGetAttribute", C.dbc_pool_get_int(d.rt.api, d.ord, C.uintptr_t(p), C.int(attr), &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// MemPoolTrimTo is cudaMemPoolTrimTo: releases unused memory until at most
// keep bytes stay reserved.
func (d *Device) MemPoolTrimTo(p MemPool, keep int64) error {
	if err := d.needPools("cudaMemPoolTrimTo"); err != nil {
		return err
	}
	sz, err := size("cudaMemPoolTrimTo", keep)
	if err != nil {
		return err
	}
	return d.fail("cudaMemPoolTrimTo", C.dbc_pool_trim(d.rt.api, d.ord, C.uintptr_t(p), sz))
}

// MallocFromPoolAsync is cudaMallocFromPoolAsync: n bytes from pool p,
// usable in the order of s.
func (d *Device) MallocFromPoolAsync(n int64, p MemPool, s Stream) (uintptr, error) {
	if err := d.needPools("cudaMallocFromPoolAsync"); err != nil {
		return 0, err
	}
	sz, err := size("cudaMallocFromPoolAsync", n)
	if err != nil {
		return 0, err
	}
	r := C.dbc_malloc_from_pool(d.rt.table, d.ord, sz, C.uintptr_t(p), C.uintptr_t(s))
	if err := d.fail("cudaMallocFromPoolAsync", r.err); err != nil {
		return 0, err
	}
	return uintptr(r.ptr), nil
}

// FreeAsync is cudaFreeAsync: the memory returns to its pool in the order of s.
func (d *Device) FreeAsync(ptr uintptr, s Stream) error {
	if err := d.needPools("cudaFreeAsync"); err != nil {
		return err
	}
	return d.fail("cudaFreeAsync", C.dbc_free_async(d.rt.table, d.ord, C.uintptr_t(ptr), C.uintptr_t(s)))
}
