package nccl

import (
	"errors"
	"fmt"
)

// EnvNCCL overrides the library opened by Load.
const EnvNCCL = "DISTBUF_NCCL"

var (
	// ErrUnavailable means libnccl (or the CUDA runtime) cannot be loaded.
	ErrUnavailable = errors.New("nccl: library unavailable")
	// ErrNCCL matches every *Error.
	ErrNCCL = errors.New("nccl: call failed")
	// ErrInvalid reports a bad argument or a closed communicator.
	ErrInvalid = errors.New("nccl: invalid argument")
)

// Error is a failed NCCL call, with NCCL's own description.
type Error struct {
	Call   string
	Result int
	Msg    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("nccl: %s: result %d: %s", e.Call, e.Result, e.Msg)
}

// Is makes errors.Is(err, ErrNCCL) true.
func (e *Error) Is(target error) bool { return target == ErrNCCL }
