package devalloc

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/stretchr/testify/require"
)

func TestBins(t *testing.T) {
	for _, size := range []int64{256, 257, 300, 320, 384, 448, 511, 512, 1 << 20, 1<<20 + 1, 3 << 30} {
		b := binFloor(size)
		require.LessOrEqual(t, binLower(b), size)
		if b+1 < numBins {
			require.Greater(t, binLower(b+1), size)
		}
		c := binCeil(size)
		require.GreaterOrEqual(t, binLower(c), size)
	}
}

func TestHostPoolSplitCoalesceTrim(t *testing.T) {
	p := newHostPool()
	c1, p1, err := p.alloc(4096, nil)
	require.NoError(t, err)
	c2, p2, err := p.alloc(8192, nil)
	require.NoError(t, err)
	require.Equal(t, c1.seg, c2.seg, "small allocations share a segment")
	require.EqualValues(t, smallSegment, p.usage().reservedCur)
	require.EqualValues(t, 4096+8192, p.usage().usedCur)
	require.NoError(t, p.free(uintptr(p1)))
	require.NoError(t, p.free(uintptr(p2)))
	require.Error(t, p.free(uintptr(p2)), "unknown address")
	// Everything coalesced back into one free chunk covering the segment.
	whole := p.small.bins[binFloor(smallSegment)]
	require.NotNil(t, whole)
	require.Nil(t, whole.nextFree)
	require.Zero(t, whole.off)
	require.EqualValues(t, smallSegment, whole.size)
	require.NoError(t, p.trim(0))
	require.Zero(t, p.usage().reservedCur)
	require.EqualValues(t, smallSegment, p.usage().reservedHigh)
}

func TestHostPoolRandomNoOverlap(t *testing.T) {
	p := newHostPool()
	rng := rand.New(rand.NewPCG(1, 2))
	type span struct{ lo, hi uintptr }
	live := map[uintptr]span{}
	for i := 0; i < 5000; i++ {
		if len(live) > 0 && rng.IntN(3) == 0 {
			for a := range live {
				require.NoError(t, p.free(a))
				delete(live, a)
				break
			}
			continue
		}
		size := alignUp(int64(1+rng.IntN(300_000)), allocAlign)
		_, ptr, err := p.alloc(size, nil)
		require.NoError(t, err)
		s := span{uintptr(ptr), uintptr(ptr) + uintptr(size)}
		for _, o := range live {
			require.False(t, s.lo < o.hi && o.lo < s.hi, "overlapping allocations")
		}
		live[s.lo] = s
	}
	var used int64
	for _, s := range live {
		used += int64(s.hi - s.lo)
	}
	require.Equal(t, used, p.usage().usedCur)
	for a := range live {
		require.NoError(t, p.free(a))
	}
	require.NoError(t, p.trim(0))
	require.Zero(t, p.usage().reservedCur)
}

func TestHostPoolThresholdAtSyncPoint(t *testing.T) {
	p := newHostPool()
	_, ptr, err := p.alloc(8<<20, nil)
	require.NoError(t, err)
	require.NoError(t, p.free(uintptr(ptr)))
	p.syncPoint()
	require.EqualValues(t, 8<<20, p.usage().reservedCur, "retain: the default threshold keeps everything")
	p.setThreshold(0)
	p.syncPoint()
	require.Zero(t, p.usage().reservedCur)
}

func TestHostPoolMmapFailure(t *testing.T) {
	p := newHostPool()
	p.mmap = func(int64) ([]byte, error) { return nil, errors.New("ENOMEM") }
	_, _, err := p.alloc(4096, nil)
	require.ErrorIs(t, err, distbuf.ErrOutOfMemory)
	require.ErrorContains(t, err, "ENOMEM")
}

// The ladder order on a real backend failure: sync, trim, then the callback.
func TestLadderOrderOnBackendFailure(t *testing.T) {
	var steps []string
	var a *Allocator
	a, err := Open(Options{Backend: BackendHost, Config: &Config{}, OnOutOfMemory: func(report *OutOfMemoryError) bool {
		st := a.Stats()
		steps = append(steps, "callback")
		require.EqualValues(t, 1, st.Trims, "trim ran before the callback")
		require.EqualValues(t, 2, st.OOMRetries, "sync and trim retries ran before the callback")
		require.Equal(t, 2, report.Retries, "the report counts them")
		require.ErrorIs(t, report, distbuf.ErrOutOfMemory)
		return false
	}})
	require.NoError(t, err)
	hb := a.be.(*hostBackend)
	hb.pool.mmap = func(int64) ([]byte, error) { steps = append(steps, "mmap"); return nil, errors.New("ENOMEM") }
	_, err = a.Alloc(4096, a.DefaultStream())
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, 2, oom.Retries)
	require.Equal(t, []string{"mmap", "mmap", "mmap", "callback"}, steps)
	require.NoError(t, a.Close())
}

// TestHostPoolReusesInStreamOrder reproduces the growth of the retained
// host pool in long runs: when the next solve allocates while the stream is
// still busy with the last one, the last solve's frees wait in the stream,
// and a pool that could not reuse that memory reserved it twice, for good
// under Retain. As on the CUDA pool, memory freed in a stream's order is
// reusable at once by allocations on that stream.
func TestHostPoolReusesInStreamOrder(t *testing.T) {
	a, err := Open(Options{Backend: BackendHost, Config: &Config{}})
	require.NoError(t, err)
	s := a.DefaultStream()
	// The sizes of one rank's solve in the main job: A, B, the C blocks
	// by destination and the received ones.
	sizes := []int64{647680, 677376, 138240, 203264, 200192, 195584, 177664, 148480, 187904, 203264}
	solve := func(busy bool) {
		bufs := make([]*Buffer, len(sizes))
		for i, n := range sizes {
			bufs[i], err = a.Alloc(n, s)
			require.NoError(t, err)
			require.NoError(t, s.Memset(bufs[i], 0, n, byte(i)))
		}
		var release chan struct{}
		if busy { // the stream is still working when the solve ends
			release = make(chan struct{})
			require.NoError(t, s.Enqueue(func() error { <-release; return nil }))
		}
		for _, b := range bufs {
			require.NoError(t, b.Free())
		}
		if busy {
			defer close(release)
		}
	}
	solve(false)
	require.NoError(t, a.Sync())
	warm := a.Stats().ReservedCurrent
	for range 20 {
		solve(true) // the next solve starts while the last one's frees wait
	}
	require.NoError(t, a.Sync())
	require.Equal(t, warm, a.Stats().ReservedCurrent, "the pool grew past the first solve's reservation")
	require.NoError(t, a.Close())
}

// TestHostPoolOrderedTickets: a queued free overtaken by a reuse and a second
// free leaves the chunk to the second one.
func TestHostPoolOrderedTickets(t *testing.T) {
	p := newHostPool()
	s := newHostStream()
	defer func() { require.NoError(t, s.destroy()) }()
	c, ptr, err := p.alloc(4096, s)
	require.NoError(t, err)
	addr := uintptr(ptr)
	t1, err := p.order(addr, s)
	require.NoError(t, err)
	_, err = p.order(addr, s)
	require.ErrorIs(t, err, distbuf.ErrInvalid, "a chunk whose free is queued cannot be freed again")
	require.ErrorIs(t, p.free(addr), distbuf.ErrInvalid)
	again, ptr2, err := p.alloc(4096, s)
	require.NoError(t, err)
	require.Same(t, c, again, "reused on its stream")
	require.Equal(t, ptr, ptr2)
	_, _, err = p.alloc(4096, nil)
	require.NoError(t, err)
	t2, err := p.order(addr, s)
	require.NoError(t, err)
	require.NoError(t, p.freeOrdered(addr, t1), "the stale free does nothing")
	require.Contains(t, p.live, addr)
	require.NoError(t, p.freeOrdered(addr, t2))
	require.NotContains(t, p.live, addr)
	other := newHostStream()
	defer func() { require.NoError(t, other.destroy()) }()
	_, ptr3, err := p.alloc(8192, s)
	require.NoError(t, err)
	_, err = p.order(uintptr(ptr3), s)
	require.NoError(t, err)
	_, ptr4, err := p.alloc(8192, other)
	require.NoError(t, err)
	require.NotEqual(t, ptr3, ptr4, "memory freed in one stream's order is not handed to another")
}
