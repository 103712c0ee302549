package wire

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCRCCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 5))
	for _, n := range []int{0, 1, 2, 3, 7, 64, 100, 4096, 32000, 70001} {
		a := make([]byte, 1+rng.IntN(100))
		b := make([]byte, n)
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		shift := newCRCShift(uint64(n))
		require.Equal(t, Checksum(append(a, b...)), crcCombine(Checksum(a), Checksum(b), &shift), "len(B) = %d", n)
	}
}
