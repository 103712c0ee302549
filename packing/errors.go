package packing

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns matches one of them with
// errors.Is; the more specific ones also match ErrInvalid.
var (
	// ErrInvalid matches every error caused by a bad argument.
	ErrInvalid = errors.New("packing: invalid argument")
	// ErrBadShape: rows or cols not positive, or too large for a 32-bit BLAS.
	ErrBadShape = fmt.Errorf("packing: bad block shape: %w", ErrInvalid)
	// ErrBadDType: an element type other than the four this package knows.
	ErrBadDType = fmt.Errorf("packing: unknown dtype: %w", ErrInvalid)
	// ErrDuplicateID: two blocks of one plan share an id.
	ErrDuplicateID = fmt.Errorf("packing: duplicate block id: %w", ErrInvalid)
	// ErrOverflow: the layout would not fit in 2^50 bytes.
	ErrOverflow = fmt.Errorf("packing: layout too large: %w", ErrInvalid)
	// ErrBadAlign: an alignment that is not a power of two in range.
	ErrBadAlign = fmt.Errorf("packing: bad alignment: %w", ErrInvalid)
	// ErrOutOfRange: a block index, offset or buffer size outside the layout.
	ErrOutOfRange = fmt.Errorf("packing: out of range: %w", ErrInvalid)
	// ErrOverlap: two blocks of a manifest share bytes, or a copy's source and
	// destination do.
	ErrOverlap = fmt.Errorf("packing: overlapping blocks: %w", ErrInvalid)
	// ErrFreed is returned for any use of a Coalesced, or of one of its views,
	// after Free.
	ErrFreed = errors.New("packing: coalesced buffer already freed")
	// ErrNotHostAccessible: a host slice was asked of device memory.
	ErrNotHostAccessible = errors.New("packing: memory not addressable from Go")
	// ErrUnavailable: a device copy method is not available (no CUDA runtime,
	// no NVRTC, a runtime too old).
	ErrUnavailable = errors.New("packing: device copy method unavailable")
)

// BlockError names the descriptor that a plan could not accept.
type BlockError struct {
	Index  int    // position in the descriptor list
	ID     uint64 // its id
	Reason string
	Err    error // the sentinel: ErrBadShape, ErrBadDType, ErrDuplicateID, ErrOverflow, ErrOutOfRange, ErrOverlap
}

func (e *BlockError) Error() string {
	return fmt.Sprintf("packing: block %d (id %d): %s: %v", e.Index, e.ID, e.Reason, e.Err)
}

// Unwrap exposes the sentinel.
func (e *BlockError) Unwrap() error { return e.Err }
