package gemm

import (
	"errors"
	"fmt"
)

// Sentinel errors; the specific ones also match ErrInvalid.
var (
	// ErrInvalid matches every error caused by a bad argument.
	ErrInvalid = errors.New("gemm: invalid argument")
	// ErrShape: the blocks of a triple do not multiply (op(A) is m x k,
	// op(B) k x n, C m x n).
	ErrShape = fmt.Errorf("gemm: mismatched shapes: %w", ErrInvalid)
	// ErrDType: blocks of different element types, or a complex scalar for
	// a real product.
	ErrDType = fmt.Errorf("gemm: dtype mismatch: %w", ErrInvalid)
	// ErrAlias: a C block shares memory with an A or B block of the problem.
	ErrAlias = fmt.Errorf("gemm: C block aliases an input: %w", ErrInvalid)
	// ErrOutOfRange: a triple names a block its buffer does not have.
	ErrOutOfRange = fmt.Errorf("gemm: block index out of range: %w", ErrInvalid)
	// ErrLayout: Engine.RunOn was given an operand laid out by another
	// packing plan or group than the plan's: the block structure changed,
	// so plan again.
	ErrLayout = fmt.Errorf("gemm: operand layout differs from the plan's: %w", ErrInvalid)
	// ErrUnavailable: the backend cannot run the plan (no cuBLAS, host
	// memory on a CUDA engine or the reverse).
	ErrUnavailable = errors.New("gemm: backend unavailable")
)

// TripleError names the triple a plan could not accept.
type TripleError struct {
	Index  int // position in Problem.Triples
	Triple Triple
	Reason string
	Err    error
}

func (e *TripleError) Error() string {
	return fmt.Sprintf("gemm: triple %d (A %d, B %d, C %d): %s: %v", e.Index, e.Triple.A, e.Triple.B, e.Triple.C, e.Reason, e.Err)
}

// Unwrap exposes the sentinel.
func (e *TripleError) Unwrap() error { return e.Err }
