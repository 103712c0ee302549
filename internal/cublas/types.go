package cublas

import (
	"errors"

	"github.com/distbuf/distbuf/internal/dl"
)

// ErrUnavailable means libcublas cannot be loaded or lacks a function.
var ErrUnavailable = errors.New("cublas: library unavailable")

// ErrCUBLAS matches every *Error.
var ErrCUBLAS = errors.New("cublas: call failed")

// Error is a failed cuBLAS (or cudaSetDevice, status -1) call, matching
// ErrCUBLAS.
type Error = dl.CallError

// DType is the BLAS precision prefix.
type DType int

const (
	S DType = iota // float32
	D              // float64
	C              // complex64
	Z              // complex128
)

func (d DType) String() string { return [...]string{"S", "D", "C", "Z"}[d] }

// Op is a cuBLAS operation on an operand.
type Op int32

const (
	N Op = 0 // CUBLAS_OP_N
	T Op = 1 // CUBLAS_OP_T
)

// Group is one group of a grouped batched call: Size problems of one shape.
type Group struct {
	TransA, TransB Op
	M, N, K        int32
	Alpha, Beta    float64
	LdA, LdB, LdC  int32
	Size           int32
}

// EnvCUBLAS overrides the library path.
const EnvCUBLAS = "DISTBUF_CUBLAS"

var libNames = []string{"libcublas.so.13", "libcublas.so.12"}
