package packing

import (
	"fmt"

	"github.com/distbuf/distbuf"
)

// BlockError names the block descriptor or manifest entry that a plan could
// not accept, and why. It matches distbuf.ErrInvalid.
type BlockError struct {
	Index  int    // position in the descriptor or entry list
	ID     uint64 // its id
	Reason string // the problem: a bad shape or dtype, a duplicate id, an overlap...
}

func (e *BlockError) Error() string {
	return fmt.Sprintf("packing: block %d (id %d): %s: %v", e.Index, e.ID, e.Reason, distbuf.ErrInvalid)
}

// Unwrap returns distbuf.ErrInvalid.
func (e *BlockError) Unwrap() error { return distbuf.ErrInvalid }
