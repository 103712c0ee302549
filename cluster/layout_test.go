package cluster

import (
	"errors"
	"math"
	"testing"

	"github.com/distbuf/distbuf"
)

// layoutCases are the sizes around every boundary of the large-message
// arithmetic.
var layoutCases = []int64{
	0, 1, 4096, math.MaxInt32 - 1, math.MaxInt32, math.MaxInt32 + 1,
	1 << 31, 1<<31 + 1, 3<<30 - 1, 3 << 30, 3<<30 + 1, 1 << 32, 1<<32 + 12345,
	5<<30 + (1<<30 - 1), 1 << 40, maxMessageBytes - 1, maxMessageBytes,
}

func TestLayoutArithmetic(t *testing.T) {
	for _, n := range layoutCases {
		l, err := layoutFor(n)
		if err != nil {
			t.Fatalf("layoutFor(%d): %v", n, err)
		}
		if l.bytes() != n {
			t.Fatalf("layoutFor(%d) = %+v describes %d bytes", n, l, l.bytes())
		}
		if l.blocks < 0 || l.tail < 0 || l.blockBytes < 0 {
			t.Fatalf("layoutFor(%d) = %+v: negative field", n, l)
		}
		switch {
		case n <= math.MaxInt32:
			if l.blockBytes != 0 || l.blocks != 0 {
				t.Fatalf("layoutFor(%d) = %+v: a count that fits needs no derived type", n, l)
			}
		default:
			if l.blockBytes != largeBlockBytes || l.tail >= l.blockBytes || l.blocks < 2 {
				t.Fatalf("layoutFor(%d) = %+v: want 2^30-byte blocks and a shorter tail", n, l)
			}
		}
	}
	for _, n := range []int64{-1, math.MinInt64} {
		if _, err := layoutFor(n); !errors.Is(err, distbuf.ErrInvalid) {
			t.Fatalf("layoutFor(%d): %v, want distbuf.ErrInvalid", n, err)
		}
	}
	for _, n := range []int64{maxMessageBytes + 1, math.MaxInt64} {
		if _, err := layoutFor(n); !errors.Is(err, distbuf.ErrInvalid) {
			t.Fatalf("layoutFor(%d): %v, want distbuf.ErrInvalid", n, err)
		}
	}
}

func FuzzLayout(f *testing.F) {
	for _, n := range layoutCases {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		l, err := layoutFor(n)
		if n < 0 || n > maxMessageBytes {
			if err == nil {
				t.Fatalf("layoutFor(%d) accepted", n)
			}
			return
		}
		if err != nil || l.bytes() != n || l.tail < 0 || l.blocks < 0 {
			t.Fatalf("layoutFor(%d) = %+v, %v", n, l, err)
		}
	})
}
