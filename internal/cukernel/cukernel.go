//go:build cgo

package cukernel

/*
#cgo CFLAGS: -I${SRCDIR}
#include <stdint.h>
#include <stdlib.h>
#include "decl.h"

static dbk_err k_set_device(void *f, int dev) { return ((dbk_SetDevice_fn)f)(dev); }

static const char *k_error_string(void *f, int code) { return ((dbk_GetErrorString_fn)f)(code); }

static dbk_err k_runtime_version(void *f, int *v) { return ((dbk_RuntimeGetVersion_fn)f)(v); }

static dbk_err k_device_attr(void *setdev, void *f, int dev, int attr, int *v) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_DeviceGetAttribute_fn)f)(v, attr, dev);
}

static dbk_err k_load_kernel(void *setdev, void *load, void *get, int dev, const void *image, const char *name, uintptr_t *kernel) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	dbk_library lib;
	e = ((dbk_LibraryLoadData_fn)load)(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
	if (e != DBK_SUCCESS) return e;
	dbk_kernel k;
	e = ((dbk_LibraryGetKernel_fn)get)(&k, lib, name);
	if (e != DBK_SUCCESS) return e;
	*kernel = (uintptr_t)k;
	return DBK_SUCCESS;
}

static dbk_err k_load_kernels(void *setdev, void *load, void *get, int dev, const void *image,
		const char *const *names, int n, uintptr_t *kernels) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	dbk_library lib;
	e = ((dbk_LibraryLoadData_fn)load)(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
	if (e != DBK_SUCCESS) return e;
	for (int i = 0; i < n; i++) {
		dbk_kernel k;
		e = ((dbk_LibraryGetKernel_fn)get)(&k, lib, names[i]);
		if (e != DBK_SUCCESS) return e;
		kernels[i] = (uintptr_t)k;
	}
	return DBK_SUCCESS;
}

// Launches with every parameter passed in an 8-byte slot: pointers, 64-bit
// integers and doubles fill it, and a 32-bit int is read from its first
// four bytes, which on a little-endian host hold its value.
#define K_MAX_ARGS 16
static dbk_err k_launch(void *setdev, void *launch, int dev, uintptr_t kernel, unsigned gx, unsigned gy, unsigned bx,
		size_t shmem, uintptr_t stream, uint64_t *slots, int n) {
	if (n > K_MAX_ARGS) return 1; // cudaErrorInvalidValue
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	void *args[K_MAX_ARGS];
	for (int i = 0; i < n; i++) args[i] = &slots[i];
	dbk_dim3 g = {gx, gy, 1}, bl = {bx, 1, 1};
	return ((dbk_LaunchKernel_fn)launch)((const void *)kernel, g, bl, args, shmem, (dbk_stream)stream);
}

static dbk_err k_launch_ptr_int_int(void *setdev, void *launch, int dev, uintptr_t kernel, unsigned grid, unsigned block,
		uintptr_t stream, uintptr_t p, int a, int b) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	void *pp = (void *)p;
	void *args[3] = {&pp, &a, &b};
	dbk_dim3 g = {grid, 1, 1}, bl = {block, 1, 1};
	return ((dbk_LaunchKernel_fn)launch)((const void *)kernel, g, bl, args, 0, (dbk_stream)stream);
}

static dbk_err k_memcpy_each(void *setdev, void *f, int dev, uintptr_t stream,
		const uintptr_t *dsts, const uintptr_t *srcs, const uintptr_t *sizes, size_t n) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	for (size_t i = 0; i < n; i++) {
		e = ((dbk_MemcpyAsync_fn)f)((void *)dsts[i], (const void *)srcs[i], sizes[i], DBK_MEMCPY_DEFAULT, (dbk_stream)stream);
		if (e != DBK_SUCCESS) return e;
	}
	return DBK_SUCCESS;
}

static dbk_err k_memcpy_batch(void *setdev, void *f, int v13, int dev, uintptr_t stream,
		const uintptr_t *dsts, const uintptr_t *srcs, const uintptr_t *sizes, size_t n) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	dbk_memcpy_attrs attrs = {0};
	attrs.srcAccessOrder = DBK_SRC_ACCESS_ORDER_STREAM;
	size_t idx = 0;
	if (v13) {
		return ((dbk_MemcpyBatchAsync_fn)f)((void *const *)dsts, (const void *const *)srcs, (const size_t *)sizes, n, &attrs, &idx, 1, (dbk_stream)stream);
	}
	size_t fail = 0;
	return ((dbk_MemcpyBatchAsync12_fn)f)((void **)dsts, (void **)srcs, (size_t *)sizes, n, &attrs, &idx, 1, &fail, (dbk_stream)stream);
}

static dbk_err k_event_create(void *setdev, void *f, int dev, uintptr_t *ev) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	dbk_event x;
	e = ((dbk_EventCreate_fn)f)(&x);
	*ev = (uintptr_t)x;
	return e;
}

static dbk_err k_event_record(void *setdev, void *f, int dev, uintptr_t ev, uintptr_t stream) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_EventRecord_fn)f)((dbk_event)ev, (dbk_stream)stream);
}

static dbk_err k_event_call(void *setdev, void *f, int dev, uintptr_t ev) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_EventSynchronize_fn)f)((dbk_event)ev);
}

static dbk_err k_event_elapsed(void *setdev, void *f, int dev, uintptr_t a, uintptr_t b, float *ms) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_EventElapsedTime_fn)f)(ms, (dbk_event)a, (dbk_event)b);
}

static dbk_err k_malloc(void *setdev, void *f, int dev, size_t n, uintptr_t *p) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	void *x = NULL;
	e = ((dbk_Malloc_fn)f)(&x, n);
	*p = (uintptr_t)x;
	return e;
}

static dbk_err k_free(void *setdev, void *f, int dev, uintptr_t p) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_Free_fn)f)((void *)p);
}

static dbk_err k_memcpy(void *setdev, void *f, int dev, uintptr_t dst, uintptr_t src, size_t n) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_Memcpy_fn)f)((void *)dst, (const void *)src, n, DBK_MEMCPY_DEFAULT);
}

static dbk_err k_memcpy_to_host(void *setdev, void *f, int dev, void *dst, uintptr_t src, size_t n) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_Memcpy_fn)f)(dst, (const void *)src, n, DBK_MEMCPY_DEFAULT);
}

static dbk_err k_memcpy_from_host(void *setdev, void *f, int dev, uintptr_t dst, const void *src, size_t n) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_Memcpy_fn)f)((void *)dst, src, n, DBK_MEMCPY_DEFAULT);
}

static dbk_err k_sync(void *setdev, void *f, int dev) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_DeviceSynchronize_fn)f)();
}

static dbk_err k_stream_sync(void *setdev, void *f, int dev, uintptr_t stream) {
	dbk_err e = ((dbk_SetDevice_fn)setdev)(dev);
	if (e != DBK_SUCCESS) return e;
	return ((dbk_StreamSynchronize_fn)f)((dbk_stream)stream);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/distbuf/distbuf/internal/dl"
)

// Runtime is the loaded CUDA runtime.
type Runtime struct {
	lib     *dl.Library
	version int

	setDevice, errorString, runtimeVersion, deviceAttr unsafe.Pointer
	libraryLoadData, libraryGetKernel, launchKernel    unsafe.Pointer
	memcpyAsync, memcpy, memcpyBatch                   unsafe.Pointer
	eventCreate, eventRecord, eventSync, eventElapsed  unsafe.Pointer
	eventDestroy, malloc, free, devSync, streamSync    unsafe.Pointer

	absent []string
}

var (
	loadOnce sync.Once
	loaded   *Runtime
	loadErr  error
)

// Load opens the runtime on first use and returns it; later calls return the
// same Runtime or the same error.
func Load() (*Runtime, error) {
	loadOnce.Do(func() { loaded, loadErr = load() })
	return loaded, loadErr
}

func load() (*Runtime, error) {
	lib, err := dl.Open(EnvCUDART, libNames...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	r := &Runtime{lib: lib}
	absent, err := lib.Bind([]dl.Symbol{
		{Name: "cudaSetDevice", Ptr: &r.setDevice},
		{Name: "cudaGetErrorString", Ptr: &r.errorString},
		{Name: "cudaRuntimeGetVersion", Ptr: &r.runtimeVersion},
		{Name: "cudaDeviceGetAttribute", Ptr: &r.deviceAttr},
		{Name: "cudaMemcpyAsync", Ptr: &r.memcpyAsync},
		{Name: "cudaMemcpy", Ptr: &r.memcpy},
		{Name: "cudaEventCreate", Ptr: &r.eventCreate},
		{Name: "cudaEventRecord", Ptr: &r.eventRecord},
		{Name: "cudaEventSynchronize", Ptr: &r.eventSync},
		{Name: "cudaEventElapsedTime", Ptr: &r.eventElapsed},
		{Name: "cudaEventDestroy", Ptr: &r.eventDestroy},
		{Name: "cudaMalloc", Ptr: &r.malloc},
		{Name: "cudaFree", Ptr: &r.free},
		{Name: "cudaDeviceSynchronize", Ptr: &r.devSync},
		{Name: "cudaStreamSynchronize", Ptr: &r.streamSync},
		{Name: "cudaLibraryLoadData", Ptr: &r.libraryLoadData, Optional: true},
		{Name: "cudaLibraryGetKernel", Ptr: &r.libraryGetKernel, Optional: true},
		{Name: "cudaLaunchKernel", Ptr: &r.launchKernel, Optional: true},
		{Name: "cudaMemcpyBatchAsync", Ptr: &r.memcpyBatch, Optional: true},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	r.absent = absent
	var v C.int
	if e := C.k_runtime_version(r.runtimeVersion, &v); e != 0 {
		return nil, r.err("cudaRuntimeGetVersion", e)
	}
	r.version = int(v)
	return r, nil
}

func (r *Runtime) err(call string, code C.dbk_err) error {
	if code == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(code), Msg: C.GoString(C.k_error_string(r.errorString, C.int(code)))}
}

// SetDeviceFunc is the address of cudaSetDevice, for other loaders' C
// trampolines that must set the device before each call.
func (r *Runtime) SetDeviceFunc() unsafe.Pointer { return r.setDevice }

// Library is the name the runtime was loaded from.
func (r *Runtime) Library() string { return r.lib.Name }

// Version is cudaRuntimeGetVersion: 1000*major + 10*minor.
func (r *Runtime) Version() int { return r.version }

// CanLaunch reports whether kernel images can be loaded and launched through
// the runtime: cudaLibrary* and launching a cudaKernel_t need CUDA 12.8.
func (r *Runtime) CanLaunch() error {
	if r.libraryLoadData == nil || r.libraryGetKernel == nil || r.launchKernel == nil {
		return fmt.Errorf("%w: %s lacks cudaLibraryLoadData/cudaLibraryGetKernel/cudaLaunchKernel", ErrUnavailable, r.lib.Name)
	}
	if r.version < 12080 {
		return fmt.Errorf("%w: runtime %d is older than 12.8, which launching a library kernel needs", ErrUnavailable, r.version)
	}
	return nil
}

// HasMemcpyBatch reports whether cudaMemcpyBatchAsync (CUDA 12.8+) is present.
func (r *Runtime) HasMemcpyBatch() bool { return r.memcpyBatch != nil && r.version >= 12080 }

// Attribute reads a device attribute (cudaDeviceGetAttribute).
func (r *Runtime) attribute(dev, attr int) (int, error) {
	var v C.int
	if e := C.k_device_attr(r.setDevice, r.deviceAttr, C.int(dev), C.int(attr), &v); e != 0 {
		return 0, r.err("cudaDeviceGetAttribute", e)
	}
	return int(v), nil
}

// ComputeCapability returns the device's major and minor compute capability.
func (r *Runtime) ComputeCapability(dev int) (major, minor int, err error) {
	if major, err = r.attribute(dev, C.DBK_ATTR_CC_MAJOR); err != nil {
		return 0, 0, err
	}
	minor, err = r.attribute(dev, C.DBK_ATTR_CC_MINOR)
	return major, minor, err
}

// SMCount is the number of multiprocessors.
func (r *Runtime) SMCount(dev int) (int, error) { return r.attribute(dev, C.DBK_ATTR_SM_COUNT) }

// LoadKernel loads a CUBIN or PTX image on device dev and returns the named
// kernel. The image is copied by the runtime; the kernel lives as long as the
// process.
func (r *Runtime) LoadKernel(dev int, image []byte, name string) (Kernel, error) {
	if err := r.CanLaunch(); err != nil {
		return 0, err
	}
	if len(image) == 0 {
		return 0, fmt.Errorf("cukernel: empty kernel image: %w", ErrUnavailable)
	}
	cimg := C.CBytes(image)
	defer C.free(cimg)
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var k C.uintptr_t
	if e := C.k_load_kernel(r.setDevice, r.libraryLoadData, r.libraryGetKernel, C.int(dev), cimg, cname, &k); e != 0 {
		return 0, r.err("cudaLibraryLoadData/cudaLibraryGetKernel "+name, e)
	}
	return Kernel(k), nil
}

// LoadKernels loads a CUBIN or PTX image on device dev once and returns its
// kernels of the given names, in order. They live as long as the process.
func (r *Runtime) LoadKernels(dev int, image []byte, names ...string) ([]Kernel, error) {
	if err := r.CanLaunch(); err != nil {
		return nil, err
	}
	if len(image) == 0 || len(names) == 0 {
		return nil, fmt.Errorf("cukernel: empty kernel image or no kernel name: %w", ErrUnavailable)
	}
	cimg := C.CBytes(image)
	defer C.free(cimg)
	cnames := C.malloc(C.size_t(len(names)) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(cnames)
	list := unsafe.Slice((**C.char)(cnames), len(names))
	for i, n := range names {
		list[i] = C.CString(n)
		defer C.free(unsafe.Pointer(list[i]))
	}
	ks := make([]C.uintptr_t, len(names))
	if e := C.k_load_kernels(r.setDevice, r.libraryLoadData, r.libraryGetKernel, C.int(dev), cimg, (**C.char)(cnames), C.int(len(names)), &ks[0]); e != 0 {
		return nil, r.err(fmt.Sprintf("cudaLibraryLoadData/cudaLibraryGetKernel %v", names), e)
	}
	out := make([]Kernel, len(names))
	for i, k := range ks {
		out[i] = Kernel(k)
	}
	return out, nil
}

// MaxLaunchArgs is the most parameters Launch passes.
const MaxLaunchArgs = 16

// Launch launches kernel k on a grid of gridX x gridY blocks of block
// threads, with shmem bytes of dynamic shared memory, in stream. Each kernel
// parameter takes one 8-byte slot of args: pointers, 64-bit integers and
// doubles (math.Float64bits) fill it; a 32-bit integer goes in its low four
// bytes. The runtime copies the parameters at the call.
func (r *Runtime) Launch(dev int, k Kernel, gridX, gridY, block int, shmem int, stream uintptr, args ...uint64) error {
	if err := r.CanLaunch(); err != nil {
		return err
	}
	if len(args) == 0 || len(args) > MaxLaunchArgs {
		return fmt.Errorf("cukernel: launch with %d parameters (1 to %d): %w", len(args), MaxLaunchArgs, ErrUnavailable)
	}
	var slots [MaxLaunchArgs]C.uint64_t
	for i, a := range args {
		slots[i] = C.uint64_t(a)
	}
	e := C.k_launch(r.setDevice, r.launchKernel, C.int(dev), C.uintptr_t(k), C.unsigned(gridX), C.unsigned(gridY), C.unsigned(block),
		C.size_t(shmem), C.uintptr_t(stream), &slots[0], C.int(len(args)))
	return r.err("cudaLaunchKernel", e)
}

// LaunchPtrIntInt launches a kernel whose parameters are (pointer, int, int)
// on grid x block threads in stream.
func (r *Runtime) LaunchPtrIntInt(dev int, k Kernel, grid, block int, stream, p uintptr, a, b int32) error {
	if err := r.CanLaunch(); err != nil {
		return err
	}
	e := C.k_launch_ptr_int_int(r.setDevice, r.launchKernel, C.int(dev), C.uintptr_t(k), C.unsigned(grid), C.unsigned(block),
		C.uintptr_t(stream), C.uintptr_t(p), C.int(a), C.int(b))
	return r.err("cudaLaunchKernel", e)
}

func checkCopyArgs(dsts, srcs, sizes []uintptr) error {
	if len(dsts) != len(srcs) || len(dsts) != len(sizes) {
		return fmt.Errorf("cukernel: memcpy list lengths %d, %d, %d differ: %w", len(dsts), len(srcs), len(sizes), ErrCUDA)
	}
	return nil
}

// MemcpyEach enqueues one cudaMemcpyAsync (cudaMemcpyDefault) per entry in
// one C call.
func (r *Runtime) MemcpyEach(dev int, stream uintptr, dsts, srcs, sizes []uintptr) error {
	if err := checkCopyArgs(dsts, srcs, sizes); err != nil || len(dsts) == 0 {
		return err
	}
	e := C.k_memcpy_each(r.setDevice, r.memcpyAsync, C.int(dev), C.uintptr_t(stream),
		(*C.uintptr_t)(unsafe.Pointer(&dsts[0])), (*C.uintptr_t)(unsafe.Pointer(&srcs[0])), (*C.uintptr_t)(unsafe.Pointer(&sizes[0])), C.size_t(len(dsts)))
	return r.err("cudaMemcpyAsync", e)
}

// MemcpyBatch enqueues the copies with one cudaMemcpyBatchAsync, in stream
// order (cudaMemcpySrcAccessOrderStream). The real runtime refuses the legacy
// default stream (0) here.
func (r *Runtime) MemcpyBatch(dev int, stream uintptr, dsts, srcs, sizes []uintptr) error {
	if !r.HasMemcpyBatch() {
		return fmt.Errorf("%w: cudaMemcpyBatchAsync needs CUDA 12.8 (runtime %d)", ErrUnavailable, r.version)
	}
	if err := checkCopyArgs(dsts, srcs, sizes); err != nil || len(dsts) == 0 {
		return err
	}
	v13 := C.int(0)
	if r.version >= 13000 {
		v13 = 1
	}
	e := C.k_memcpy_batch(r.setDevice, r.memcpyBatch, v13, C.int(dev), C.uintptr_t(stream),
		(*C.uintptr_t)(unsafe.Pointer(&dsts[0])), (*C.uintptr_t)(unsafe.Pointer(&srcs[0])), (*C.uintptr_t)(unsafe.Pointer(&sizes[0])), C.size_t(len(dsts)))
	return r.err("cudaMemcpyBatchAsync", e)
}

// NewEvent creates an event on device dev.
func (r *Runtime) NewEvent(dev int) (Event, error) {
	var ev C.uintptr_t
	if e := C.k_event_create(r.setDevice, r.eventCreate, C.int(dev), &ev); e != 0 {
		return 0, r.err("cudaEventCreate", e)
	}
	return Event(ev), nil
}

// Record records ev in stream.
func (r *Runtime) Record(dev int, ev Event, stream uintptr) error {
	return r.err("cudaEventRecord", C.k_event_record(r.setDevice, r.eventRecord, C.int(dev), C.uintptr_t(ev), C.uintptr_t(stream)))
}

// WaitEvent blocks until ev has completed.
func (r *Runtime) WaitEvent(dev int, ev Event) error {
	return r.err("cudaEventSynchronize", C.k_event_call(r.setDevice, r.eventSync, C.int(dev), C.uintptr_t(ev)))
}

// Elapsed is the time in milliseconds between two completed events.
func (r *Runtime) Elapsed(dev int, start, end Event) (float64, error) {
	var ms C.float
	if e := C.k_event_elapsed(r.setDevice, r.eventElapsed, C.int(dev), C.uintptr_t(start), C.uintptr_t(end), &ms); e != 0 {
		return 0, r.err("cudaEventElapsedTime", e)
	}
	return float64(ms), nil
}

// DestroyEvent destroys ev.
func (r *Runtime) DestroyEvent(dev int, ev Event) error {
	return r.err("cudaEventDestroy", C.k_event_call(r.setDevice, r.eventDestroy, C.int(dev), C.uintptr_t(ev)))
}

// Malloc allocates device memory with cudaMalloc, for tests and benchmarks
// of the loaders; production memory comes from devalloc.
func (r *Runtime) Malloc(dev int, n int64) (uintptr, error) {
	var p C.uintptr_t
	if e := C.k_malloc(r.setDevice, r.malloc, C.int(dev), C.size_t(n), &p); e != 0 {
		return 0, r.err("cudaMalloc", e)
	}
	return uintptr(p), nil
}

// Free releases memory from Malloc.
func (r *Runtime) Free(dev int, p uintptr) error {
	return r.err("cudaFree", C.k_free(r.setDevice, r.free, C.int(dev), C.uintptr_t(p)))
}

// CopyToDevice copies host bytes to device memory synchronously (tests).
func (r *Runtime) CopyToDevice(dev int, dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	c := C.CBytes(src)
	defer C.free(c)
	return r.err("cudaMemcpy", C.k_memcpy_from_host(r.setDevice, r.memcpy, C.int(dev), C.uintptr_t(dst), c, C.size_t(len(src))))
}

// CopyFromDevice copies device memory into dst synchronously (tests).
func (r *Runtime) CopyFromDevice(dev int, dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	c := C.malloc(C.size_t(len(dst)))
	defer C.free(c)
	if e := C.k_memcpy_to_host(r.setDevice, r.memcpy, C.int(dev), c, C.uintptr_t(src), C.size_t(len(dst))); e != 0 {
		return r.err("cudaMemcpy", e)
	}
	copy(dst, unsafe.Slice((*byte)(c), len(dst)))
	return nil
}

// Synchronize waits for all work on the device (tests).
func (r *Runtime) Synchronize(dev int) error {
	return r.err("cudaDeviceSynchronize", C.k_sync(r.setDevice, r.devSync, C.int(dev)))
}

// StreamSynchronize waits for the work on one stream.
func (r *Runtime) StreamSynchronize(dev int, stream uintptr) error {
	return r.err("cudaStreamSynchronize", C.k_stream_sync(r.setDevice, r.streamSync, C.int(dev), C.uintptr_t(stream)))
}
