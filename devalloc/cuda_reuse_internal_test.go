//go:build cgo

package devalloc

import (
	"errors"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
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
	s.shared = true
	kept, _ = r.put(s, 256, 0x30001)
	require.False(t, kept, "without events, the reclamation stream keeps nothing")
}

// TestStreamReuseSharesReclaimedBlocks: a block freed on the reclamation
// stream serves an allocation on another stream only once the event
// recorded at its free has completed, the oldest first; a block of the
// allocating stream's own comes first; draining frees the shared blocks on
// the reclamation stream and gives their events back.
func TestStreamReuseSharesReclaimedBlocks(t *testing.T) {
	type freed struct {
		addr uintptr
		s    *cudaStream
	}
	var frees []freed
	r := newStreamReuse(1<<20, func(addr uintptr, s *cudaStream) error {
		frees = append(frees, freed{addr, s})
		return nil
	})
	var next cudart.Event
	done := map[cudart.Event]bool{}
	var recycled []cudart.Event
	var markErr error
	r.mark = func(*cudaStream) (cudart.Event, error) {
		if markErr != nil {
			return 0, markErr
		}
		next++
		return next, nil
	}
	r.reached = func(ev cudart.Event) bool { return done[ev] }
	r.recycle = func(ev cudart.Event) { recycled = append(recycled, ev) }
	rec, user := &cudaStream{shared: true}, &cudaStream{}

	for _, addr := range []uintptr{0xa000, 0xb000} {
		kept, err := r.put(rec, 256, addr)
		require.True(t, kept)
		require.NoError(t, err)
	}
	_, ok := r.take(user, 256)
	require.False(t, ok, "the first free has not run yet")
	done[1] = true
	addr, ok := r.take(user, 256)
	require.True(t, ok)
	require.Equal(t, uintptr(0xa000), addr, "the block freed first")
	require.Equal(t, []cudart.Event{1}, recycled)
	_, ok = r.take(user, 256)
	require.False(t, ok, "the second free has not run yet")
	_, ok = r.take(user, 512)
	require.False(t, ok, "no block of that size")

	kept, err := r.put(user, 256, 0xc000)
	require.True(t, kept)
	require.NoError(t, err)
	done[2] = true
	addr, ok = r.take(user, 256)
	require.True(t, ok)
	require.Equal(t, uintptr(0xc000), addr, "the stream's own block first")

	markErr = errors.New("record failed")
	kept, err = r.put(rec, 256, 0xd000)
	require.False(t, kept, "no event, no keeping: the caller frees it")
	require.ErrorIs(t, err, markErr)

	markErr = nil
	for i := range maxSharedKept - 1 { // one is kept already
		kept, err := r.put(rec, 512, uintptr(0x100000+i*512))
		require.True(t, kept)
		require.NoError(t, err)
	}
	kept, err = r.put(rec, 512, 0xe000)
	require.False(t, kept, "past maxSharedKept blocks (an event each), the caller frees it")
	require.NoError(t, err)
	_, ok = r.take(user, 512)
	require.False(t, ok, "their frees have not run")

	require.NoError(t, r.drain(nil))
	require.Len(t, frees, maxSharedKept, "every block kept there")
	require.Contains(t, frees, freed{0xb000, rec})
	for _, f := range frees {
		require.Same(t, rec, f.s, "freed in the reclamation stream's order")
	}
	require.Len(t, recycled, 1+maxSharedKept, "every event back")
	require.Zero(t, r.sharedN)
	require.Nil(t, r.shared)
	keptBytes, hits := r.stats()
	require.Zero(t, keptBytes)
	require.EqualValues(t, 2, hits)
}
