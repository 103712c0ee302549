package nccl

import (
	"errors"

	"github.com/distbuf/distbuf/internal/dl"
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

// Error is a failed NCCL call (or cudaSetDevice, code -1), with NCCL's own
// description, matching ErrNCCL.
type Error = dl.CallError
