package gemm

import (
	"fmt"

	"github.com/distbuf/distbuf"
)

// The problems a plan or a run refuses, each named in the error's text and
// matching distbuf.ErrInvalid.
var (
	// errShape: the blocks of a triple do not multiply (op(A) is m x k,
	// op(B) k x n, C m x n).
	errShape = fmt.Errorf("gemm: mismatched shapes: %w", distbuf.ErrInvalid)
	// errDType: blocks of different element types, or a complex scalar for
	// a real product.
	errDType = fmt.Errorf("gemm: dtype mismatch: %w", distbuf.ErrInvalid)
	// errAlias: a C block shares memory with an A or B block of the problem.
	errAlias = fmt.Errorf("gemm: C block aliases an input: %w", distbuf.ErrInvalid)
	// errOutOfRange: a triple names a block its buffer does not have.
	errOutOfRange = fmt.Errorf("gemm: block index out of range: %w", distbuf.ErrInvalid)
	// errLayout: Engine.RunOn was given an operand laid out by another
	// packing plan or group than the plan's: the block structure changed,
	// so plan again.
	errLayout = fmt.Errorf("gemm: operand layout differs from the plan's: %w", distbuf.ErrInvalid)
)

// TripleError names the triple a plan could not accept. It matches
// distbuf.ErrInvalid.
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
