//go:build cgo

package cudart

/*
#cgo nocallback dbc_launch
#cgo noescape dbc_launch
#cgo nocallback dbc_memcpy_each
#cgo noescape dbc_memcpy_each
#cgo nocallback dbc_memcpy_batch
#cgo noescape dbc_memcpy_batch
#include <stdlib.h>
#include "cudart_calls.h"
*/
import "C"

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Compile-time proof that the Go limits equal the header's.
const (
	_ uint = C.DBC_MAX_LAUNCH_ARGS - MaxLaunchArgs
	_ uint = MaxLaunchArgs - C.DBC_MAX_LAUNCH_ARGS
)

// ComputeCapability is the device's compute capability, e.g. 9, 0.
func (d *Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	minor, err = d.Attribute(AttrComputeCapabilityMinor)
	return major, minor, err
}

func (d *Device) needKernels(op string) error {
	if !d.rt.caps.KernelLaunch {
		return fmt.Errorf("cudart: %s: the runtime (%s) cannot launch library kernels (cudaLibraryLoadData, cudaLibraryGetKernel and cudaLaunchKernel of CUDA 12.8 or later): %w",
			op, FormatVersion(d.rt.runtimeVersion), ErrNotSupported)
	}
	return nil
}

// LoadKernels loads a CUBIN or PTX image (cudaLibraryLoadData) on the
// device once and returns its kernels of the given names, in order
// (cudaLibraryGetKernel). The runtime keeps its own copy of the image; the
// library and its kernels live as long as the process.
func (d *Device) LoadKernels(image []byte, names ...string) ([]Kernel, error) {
	if err := d.needKernels("cudaLibraryLoadData"); err != nil {
		return nil, err
	}
	if len(image) == 0 || len(names) == 0 {
		return nil, fmt.Errorf("cudart: cudaLibraryLoadData: %d-byte image, %d kernel name(s): %w", len(image), len(names), ErrInvalid)
	}
	cimg := C.CBytes(image)
	defer C.free(cimg)
	list := (**C.char)(C.malloc(C.size_t(len(names)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	defer C.free(unsafe.Pointer(list))
	cnames := unsafe.Slice(list, len(names))
	for i, n := range names {
		cnames[i] = C.CString(n)
		defer C.free(unsafe.Pointer(cnames[i]))
	}
	ks := make([]C.uintptr_t, len(names))
	code := C.dbc_load_kernels(d.rt.api, d.ord, cimg, list, C.int(len(names)), &ks[0])
	if err := d.fail(fmt.Sprintf("cudaLibraryLoadData/cudaLibraryGetKernel %v", names), code); err != nil {
		return nil, err
	}
	out := make([]Kernel, len(names))
	for i, k := range ks {
		out[i] = Kernel(k)
		kernelNames.Store(out[i], names[i])
	}
	return out, nil
}

// kernelNames maps every loaded kernel to its name, for launch errors;
// kernels live as long as the process, and so do their entries.
var kernelNames sync.Map

// LoadKernel loads an image and returns its one kernel of that name.
func (d *Device) LoadKernel(image []byte, name string) (Kernel, error) {
	ks, err := d.LoadKernels(image, name)
	if err != nil {
		return 0, err
	}
	return ks[0], nil
}

func dim(op, what string, v int) (C.unsigned, error) {
	if v <= 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("cudart: %s: %s %d: %w", op, what, v, ErrInvalid)
	}
	return C.unsigned(v), nil
}

// Launch is cudaLaunchKernel: kernel k on a grid of gridX x gridY blocks of
// block threads, with shmem bytes of dynamic shared memory, in s. Each
// kernel parameter takes one 8-byte slot of args: pointers, 64-bit integers
// and doubles (math.Float64bits) fill it; a 32-bit integer goes in its low
// four bytes. The runtime copies the parameters during the call.
func (d *Device) Launch(k Kernel, gridX, gridY, block, shmem int, s Stream, args ...uint64) error {
	const op = "cudaLaunchKernel"
	if err := d.needKernels(op); err != nil {
		return err
	}
	if len(args) > MaxLaunchArgs {
		return fmt.Errorf("cudart: %s: %d parameters, at most %d: %w", op, len(args), MaxLaunchArgs, ErrInvalid)
	}
	gx, err := dim(op, "grid x", gridX)
	if err != nil {
		return err
	}
	gy, err := dim(op, "grid y", gridY)
	if err != nil {
		return err
	}
	bx, err := dim(op, "block", block)
	if err != nil {
		return err
	}
	sm, err := size(op, int64(shmem))
	if err != nil {
		return err
	}
	var slots [MaxLaunchArgs]C.uint64_t
	for i, a := range args {
		slots[i] = C.uint64_t(a)
	}
	if err := d.fail(op, C.dbc_launch(d.rt.api, d.ord, C.uintptr_t(k), gx, gy, bx, sm, C.uintptr_t(s), &slots[0], C.int(len(args)))); err != nil {
		name, ok := kernelNames.Load(k)
		if !ok {
			name = fmt.Sprintf("%#x (not from LoadKernels)", uintptr(k))
		}
		return fmt.Errorf("cudart: kernel %v: %w", name, err)
	}
	return nil
}

func copyLists(op string, dsts, srcs, sizes []uintptr) error {
	if len(dsts) != len(srcs) || len(dsts) != len(sizes) {
		return fmt.Errorf("cudart: %s: list lengths %d, %d, %d differ: %w", op, len(dsts), len(srcs), len(sizes), ErrInvalid)
	}
	return nil
}

// MemcpyEach enqueues one cudaMemcpyAsync (cudaMemcpyDefault) per entry on
// s, in order, in one cgo call; it stops at the first failure.
func (d *Device) MemcpyEach(s Stream, dsts, srcs, sizes []uintptr) error {
	const op = "cudaMemcpyAsync"
	if err := copyLists(op, dsts, srcs, sizes); err != nil || len(dsts) == 0 {
		return err
	}
	return d.fail(op, C.dbc_memcpy_each(d.rt.api, d.ord, C.uintptr_t(s), (*C.uintptr_t)(unsafe.Pointer(&dsts[0])),
		(*C.uintptr_t)(unsafe.Pointer(&srcs[0])), (*C.uintptr_t)(unsafe.Pointer(&sizes[0])), C.size_t(len(dsts))))
}

// MemcpyBatch enqueues the copies with one cudaMemcpyBatchAsync in the
// order of s (cudaMemcpySrcAccessOrderStream). The runtime refuses the
// legacy default stream (0) here.
func (d *Device) MemcpyBatch(s Stream, dsts, srcs, sizes []uintptr) error {
	const op = "cudaMemcpyBatchAsync"
	if !d.rt.caps.MemcpyBatch {
		return fmt.Errorf("cudart: %s needs CUDA 12.8 (runtime %s): %w", op, FormatVersion(d.rt.runtimeVersion), ErrNotSupported)
	}
	if err := copyLists(op, dsts, srcs, sizes); err != nil || len(dsts) == 0 {
		return err
	}
	v13 := C.int(0)
	if d.rt.runtimeVersion >= 13000 {
		v13 = 1
	}
	return d.fail(op, C.dbc_memcpy_batch(d.rt.api, d.ord, v13, C.uintptr_t(s), (*C.uintptr_t)(unsafe.Pointer(&dsts[0])),
		(*C.uintptr_t)(unsafe.Pointer(&srcs[0])), (*C.uintptr_t)(unsafe.Pointer(&sizes[0])), C.size_t(len(dsts))))
}

// EventCreateTiming makes an event that records a time (cudaEventDefault),
// for EventElapsedTime. Such events cost more to record than EventCreate's.
func (d *Device) EventCreateTiming() (Event, error) {
	var ev C.uintptr_t
	if err := d.fail("cudaEventCreateWithFlags", C.dbc_event_create(d.rt.api, d.ord, C.DBC_EVENT_DEFAULT, &ev)); err != nil {
		return 0, err
	}
	return Event(ev), nil
}

// EventElapsedTime is cudaEventElapsedTime: milliseconds between two
// completed records of events from EventCreateTiming.
func (d *Device) EventElapsedTime(start, end Event) (float64, error) {
	var ms C.float
	if err := d.fail("cudaEventElapsedTime", C.dbc_event_elapsed(d.rt.api, d.ord, C.uintptr_t(start), C.uintptr_t(end), &ms)); err != nil {
		return 0, err
	}
	return float64(ms), nil
}

// Synchronize is cudaDeviceSynchronize: it waits for all work on the device.
func (d *Device) Synchronize() error {
	return d.fail("cudaDeviceSynchronize", C.dbc_device_sync(d.rt.api, d.ord))
}

// Memcpy is cudaMemcpy with cudaMemcpyDefault: it returns once the copy is
// done (tests and one-off uploads; the data path copies in stream order).
func (d *Device) Memcpy(dst, src uintptr, n int64) error {
	sz, err := size("cudaMemcpy", n)
	if err != nil {
		return err
	}
	return d.fail("cudaMemcpy", C.dbc_memcpy(d.rt.api, d.ord, C.uintptr_t(dst), C.uintptr_t(src), sz))
}

// CopyToDevice copies src into the device memory at dst (cudaMemcpy).
func (d *Device) CopyToDevice(dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	c := C.CBytes(src)
	defer C.free(c)
	return d.fail("cudaMemcpy", C.dbc_memcpy(d.rt.api, d.ord, C.uintptr_t(dst), C.uintptr_t(uintptr(c)), C.size_t(len(src))))
}

// CopyFromDevice copies the device memory at src into dst (cudaMemcpy).
func (d *Device) CopyFromDevice(dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	c := C.malloc(C.size_t(len(dst)))
	defer C.free(c)
	if err := d.fail("cudaMemcpy", C.dbc_memcpy(d.rt.api, d.ord, C.uintptr_t(uintptr(c)), C.uintptr_t(src), C.size_t(len(dst)))); err != nil {
		return err
	}
	copy(dst, unsafe.Slice((*byte)(c), len(dst)))
	return nil
}
