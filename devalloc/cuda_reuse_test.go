//go:build cgo

package devalloc_test

import (
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

// TestCUDAFakeReuse checks the pool's same-stream reuse on the fake
// runtime, TestCUDAReuse on the GPU.
func TestCUDAFakeReuse(t *testing.T) {
	testReuse(t, func(t *testing.T) { useFakeCUDA(t) })
}

func TestCUDAReuse(t *testing.T) {
	requireCUDA(t)
	testReuse(t, func(*testing.T) {})
}

func openReuse(t *testing.T, cache int64) *devalloc.Allocator {
	t.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{Cache: cache}, Warn: func(string) {}})
	require.NoError(t, err)
	if !a.Info().Pool {
		require.NoError(t, a.Close())
		t.Skipf("the pool is not in use (%s)", a.Info().Description)
	}
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

func allocAddr(t *testing.T, a *devalloc.Allocator, n int64, s *devalloc.Stream) (*devalloc.Buffer, uintptr) {
	t.Helper()
	b, err := a.Alloc(n, s)
	require.NoError(t, err)
	addr, _, _, err := b.Region()
	require.NoError(t, err)
	return b, addr
}

// requireKeptTaken requires that the one block a kept has gone to an
// allocation.
func requireKeptTaken(t *testing.T, a *devalloc.Allocator) {
	t.Helper()
	st := a.Stats()
	require.EqualValues(t, 0, st.ReuseKept)
	require.EqualValues(t, 1, st.ReuseHits)
}

func testReuse(t *testing.T, setup func(*testing.T)) {
	t.Run("same size, same stream", func(t *testing.T) {
		setup(t)
		a := openReuse(t, 0)
		s := a.DefaultStream()
		b, addr := allocAddr(t, a, 1000, s)
		require.NoError(t, s.Memset(b, 0, 1000, 1))
		require.NoError(t, b.Free())
		require.EqualValues(t, 1024, a.Stats().ReuseKept, "the block is kept (1000 bytes round to 1024)")
		before := devalloc.DriverCalls()
		b2, addr2 := allocAddr(t, a, 1000, s)
		require.Equal(t, addr, addr2, "the next allocation of that size on that stream takes it")
		require.Empty(t, callsSince(before), "without a driver call")
		requireKeptTaken(t, a)

		// Another size, or another stream, gets memory of its own: the
		// kept block waits for its stream.
		require.NoError(t, b2.Free())
		other, err := a.NewStream()
		require.NoError(t, err)
		b3, addr3 := allocAddr(t, a, 1000, other)
		require.NotEqual(t, addr, addr3, "another stream")
		b4, addr4 := allocAddr(t, a, 2000, s)
		require.NotEqual(t, addr, addr4, "another size")
		require.NoError(t, b3.Free())
		require.NoError(t, b4.Free())
		require.NoError(t, other.Close())
		require.NoError(t, s.Synchronize())
	})

	t.Run("freed after another stream's work, for every stream once the free ran", func(t *testing.T) {
		setup(t)
		a := openReuse(t, 0)
		s := a.DefaultStream()
		other, err := a.NewStream()
		require.NoError(t, err)
		b, addr := allocAddr(t, a, 1000, s)
		require.NoError(t, s.Memset(b, 0, 1000, 1))
		require.NoError(t, other.Memset(b, 0, 1000, 2)) // the last use is on another stream
		require.NoError(t, b.Free())
		require.EqualValues(t, 1024, a.Stats().ReuseKept, "kept by the reclamation stream")
		require.NoError(t, a.Sync()) // the free has run
		before := devalloc.DriverCalls()
		b2, addr2 := allocAddr(t, a, 1000, other)
		require.Equal(t, addr, addr2, "an allocation of that size on any stream takes it")
		calls := callsSince(before)
		require.NotContains(t, calls, "cudaMallocFromPoolAsync")
		require.Contains(t, calls, "cudaEventQuery", "it asked whether the free had run")
		requireKeptTaken(t, a)
		require.NoError(t, b2.Free())
		require.NoError(t, other.Close())
		require.NoError(t, s.Synchronize())
	})

	t.Run("given back", func(t *testing.T) {
		setup(t)
		a := openReuse(t, 0)
		s := a.DefaultStream()
		keep := func() {
			b, _ := allocAddr(t, a, 64<<10, s)
			require.NoError(t, b.Free())
			require.EqualValues(t, 64<<10, a.Stats().ReuseKept)
		}
		// Trim: the kept block goes back and the pool releases it.
		keep()
		before := devalloc.DriverCalls()
		require.NoError(t, a.Trim(0))
		require.EqualValues(t, 1, callsSince(before)["cudaFreeAsync"])
		require.Zero(t, a.Stats().ReuseKept)
		require.Zero(t, a.Stats().ReservedCurrent, "trimmed to nothing")

		// A stream's blocks go back before it is destroyed.
		other, err := a.NewStream()
		require.NoError(t, err)
		b, _ := allocAddr(t, a, 4096, other)
		require.NoError(t, b.Free())
		require.EqualValues(t, 4096, a.Stats().ReuseKept)
		require.NoError(t, other.Close())
		require.Zero(t, a.Stats().ReuseKept)

		// Leaving Retain gives them back and keeps no more.
		keep()
		require.NoError(t, a.SetPolicy(devalloc.AggressiveFree))
		require.Zero(t, a.Stats().ReuseKept)
		b, _ = allocAddr(t, a, 64<<10, s)
		before = devalloc.DriverCalls()
		require.NoError(t, b.Free())
		require.EqualValues(t, 1, callsSince(before)["cudaFreeAsync"], "freed to the pool at once")
		require.Zero(t, a.Stats().ReuseKept)
		require.NoError(t, a.SetPolicy(devalloc.Retain))
		keep()
	})

	t.Run("bounded, oldest given back first", func(t *testing.T) {
		setup(t)
		const block, fit = 4096, 16
		a := openReuse(t, fit*block) // blocks of up to a sixteenth of the bound are kept
		s := a.DefaultStream()
		var addrs []uintptr
		var bufs []*devalloc.Buffer
		for range fit + 1 {
			b, addr := allocAddr(t, a, block, s)
			bufs, addrs = append(bufs, b), append(addrs, addr)
		}
		for _, b := range bufs {
			require.NoError(t, b.Free())
		}
		require.EqualValues(t, fit*block, a.Stats().ReuseKept, "all but one fit")
		got := map[uintptr]bool{}
		for range fit {
			b, addr := allocAddr(t, a, block, s)
			got[addr] = true
			defer func() { require.NoError(t, b.Free()) }()
		}
		require.Len(t, got, fit)
		require.False(t, got[addrs[0]], "the first freed went back to the pool")
		for _, addr := range addrs[1:] {
			require.True(t, got[addr])
		}
		big, _ := allocAddr(t, a, 2*block, s)
		require.NoError(t, big.Free())
		require.Zero(t, a.Stats().ReuseKept, "a block of more than a sixteenth of the bound is not kept")
	})

	t.Run("off", func(t *testing.T) {
		setup(t)
		a := openReuse(t, -1)
		s := a.DefaultStream()
		b, addr := allocAddr(t, a, 1000, s)
		require.NoError(t, b.Free())
		require.Zero(t, a.Stats().ReuseKept)
		b, _ = allocAddr(t, a, 1000, s)
		require.NoError(t, b.Free())
		require.Zero(t, a.Stats().ReuseHits)
		_ = addr
	})
}

// TestCUDAFakeReuseOutOfMemory: an allocation that finds the device full
// while a block is kept for another stream gets it back through the
// out-of-memory ladder's first step (synchronise and retry), without a
// trim.
func TestCUDAFakeReuseOutOfMemory(t *testing.T) {
	useFakeCUDA(t, "FAKE_MEMORY=67108864")
	a := openReuse(t, 1<<30) // keeps blocks of up to 64 MiB
	other, err := a.NewStream()
	require.NoError(t, err)
	b, _ := allocAddr(t, a, 40<<20, other)
	require.NoError(t, b.Free())
	require.EqualValues(t, 40<<20, a.Stats().ReuseKept)
	b, _ = allocAddr(t, a, 40<<20, a.DefaultStream())
	st := a.Stats()
	require.Zero(t, st.ReuseKept)
	require.Positive(t, st.OOMRetries)
	require.Zero(t, st.Trims, "the first retry, after the synchronisation, found the memory")
	require.NoError(t, b.Free())
	require.NoError(t, other.Close())
}
