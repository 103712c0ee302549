//go:build cgo

package devalloc

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStreamReuseEvictsOldestKept: a block taken and kept again counts as
// kept anew, so the bound gives back the block kept longest ago, not a hot
// one that happened to be kept first; many rounds of take and keep
// compact the order without changing it.
func TestStreamReuseEvictsOldestKept(t *testing.T) {
	var freed []uintptr
	const limit = 48 * 256 // blocks of up to 768 bytes are kept
	r := newStreamReuse(limit, func(addr uintptr, _ *cudaStream) error {
		freed = append(freed, addr)
		return nil
	})
	s := &cudaStream{}
	keep := func(size int64, addr uintptr) {
		t.Helper()
		kept, err := r.put(s, size, addr)
		require.True(t, kept)
		require.NoError(t, err)
	}
	const hot = uintptr(0x1000)
	keep(512, hot)
	for i := range 44 {
		keep(256, uintptr(0x10000+i))
	}
	reuseHot := func(rounds int) {
		t.Helper()
		for range rounds {
			addr, ok := r.take(s, 512)
			require.True(t, ok)
			require.Equal(t, hot, addr)
			keep(512, addr)
		}
	}
	reuseHot(100) // fewer entries than compaction waits for: the stale ones stay listed
	keep(256, 0x20000)
	keep(256, 0x20001)
	require.Empty(t, freed, "within the bound")
	keep(256, 0x20002)
	require.Equal(t, []uintptr{0x10000}, freed, "the block kept longest ago goes back")
	addr, ok := r.take(s, 512)
	require.True(t, ok)
	require.Equal(t, hot, addr, "the hot block stays")
	require.EqualValues(t, limit-512, r.bytes)
	keep(512, hot)
	reuseHot(1000)
	require.LessOrEqual(t, len(r.order), 4*r.n+1, "taken entries are compacted away")

	kept, err := r.put(s, 1024, 0x30000)
	require.False(t, kept, "above a sixteenth of the bound")
	require.NoError(t, err)
	s.noReuse = true
	kept, _ = r.put(s, 256, 0x30001)
	require.False(t, kept, "a stream that allocates nothing keeps nothing")
}
