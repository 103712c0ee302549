package cukernel

import (
	"errors"
	"fmt"
)

// ErrUnavailable means the CUDA runtime cannot be loaded or lacks a function.
var ErrUnavailable = errors.New("cukernel: CUDA runtime unavailable")

// ErrCUDA matches every *Error.
var ErrCUDA = errors.New("cukernel: CUDA call failed")

// Error is a failed runtime call.
type Error struct {
	Call string
	Code int
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cukernel: %s: cuda error %d: %s", e.Call, e.Code, e.Msg)
}

// Is makes errors.Is(err, ErrCUDA) true.
func (e *Error) Is(target error) bool { return target == ErrCUDA }

// Kernel is a loaded kernel (a cudaKernel_t).
type Kernel uintptr

// Event is a CUDA event handle (a cudaEvent_t) used for timing.
type Event uintptr

// EnvCUDART overrides the runtime library path.
const EnvCUDART = "DISTBUF_CUDART"

var libNames = []string{"libcudart.so.13", "libcudart.so.12"}
