//go:build !cgo

package cukernel

import (
	"fmt"
	"unsafe"
)

// Runtime is unavailable without cgo.
type Runtime struct{}

var errNoCgo = fmt.Errorf("%w: built without cgo", ErrUnavailable)

// Load always fails without cgo.
func Load() (*Runtime, error) { return nil, errNoCgo }

func (r *Runtime) Library() string                         { return "" }
func (r *Runtime) Version() int                            { return 0 }
func (r *Runtime) CanLaunch() error                        { return errNoCgo }
func (r *Runtime) HasMemcpyBatch() bool                    { return false }
func (r *Runtime) ComputeCapability(int) (int, int, error) { return 0, 0, errNoCgo }
func (r *Runtime) SMCount(int) (int, error)                { return 0, errNoCgo }
func (r *Runtime) LoadKernel(int, []byte, string) (Kernel, error) {
	return 0, errNoCgo
}
func (r *Runtime) LoadKernels(int, []byte, ...string) ([]Kernel, error) { return nil, errNoCgo }

// MaxLaunchArgs is the most parameters Launch passes.
const MaxLaunchArgs = 16

func (r *Runtime) Launch(int, Kernel, int, int, int, int, uintptr, ...uint64) error { return errNoCgo }
func (r *Runtime) LaunchPtrIntInt(int, Kernel, int, int, uintptr, uintptr, int32, int32) error {
	return errNoCgo
}
func (r *Runtime) MemcpyEach(int, uintptr, []uintptr, []uintptr, []uintptr) error  { return errNoCgo }
func (r *Runtime) MemcpyBatch(int, uintptr, []uintptr, []uintptr, []uintptr) error { return errNoCgo }
func (r *Runtime) NewEvent(int) (Event, error)                                     { return 0, errNoCgo }
func (r *Runtime) Record(int, Event, uintptr) error                                { return errNoCgo }
func (r *Runtime) WaitEvent(int, Event) error                                      { return errNoCgo }
func (r *Runtime) Elapsed(int, Event, Event) (float64, error)                      { return 0, errNoCgo }
func (r *Runtime) DestroyEvent(int, Event) error                                   { return errNoCgo }
func (r *Runtime) Malloc(int, int64) (uintptr, error)                              { return 0, errNoCgo }
func (r *Runtime) Free(int, uintptr) error                                         { return errNoCgo }
func (r *Runtime) CopyToDevice(int, uintptr, []byte) error                         { return errNoCgo }
func (r *Runtime) CopyFromDevice(int, []byte, uintptr) error                       { return errNoCgo }
func (r *Runtime) Synchronize(int) error                                           { return errNoCgo }
func (r *Runtime) StreamSynchronize(int, uintptr) error                            { return errNoCgo }
func (r *Runtime) SetDeviceFunc() unsafe.Pointer                                   { return nil }
