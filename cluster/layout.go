package cluster

import (
	"fmt"
	"math"

	"github.com/distbuf/distbuf"
)

// MPI counts are C ints. A message of more than math.MaxInt32 bytes is sent
// as one element of a derived datatype: blocks of 2^30 bytes (a contiguous
// type of a contiguous type) followed by a tail of fewer than 2^30 bytes (a
// struct of the two). The type signature is n MPI_BYTEs either way, so a
// sender and a receiver that describe the same bytes differently still
// match, and a receiver may post a larger buffer than the message.
const (
	largeBlockShift = 30
	largeBlockBytes = 1 << largeBlockShift
	// maxMessageBytes keeps the block count within a C int.
	maxMessageBytes = int64(math.MaxInt32) << largeBlockShift
)

// byteLayout describes n bytes to MPI. With blockBytes == 0 it is tail
// MPI_BYTEs; otherwise blocks*blockBytes bytes then tail bytes.
type byteLayout struct {
	blockBytes, blocks, tail int32
}

func layoutFor(n int64) (byteLayout, error) {
	switch {
	case n < 0:
		return byteLayout{}, fmt.Errorf("cluster: negative size %d: %w", n, distbuf.ErrInvalid)
	case n <= math.MaxInt32:
		return byteLayout{tail: int32(n)}, nil
	case n > maxMessageBytes:
		return byteLayout{}, fmt.Errorf("cluster: %d bytes exceed the largest describable message (%d): %w", n, maxMessageBytes, distbuf.ErrInvalid)
	}
	return byteLayout{
		blockBytes: largeBlockBytes,
		blocks:     int32(n >> largeBlockShift),
		tail:       int32(n & (largeBlockBytes - 1)),
	}, nil
}

// bytes is the length the layout describes.
func (l byteLayout) bytes() int64 {
	return int64(l.blockBytes)*int64(l.blocks) + int64(l.tail)
}
