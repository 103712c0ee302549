//go:build cgo

package devalloc_test

import (
	"maps"
	"runtime"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

// callsSince is the driver calls made since before, by entry point.
func callsSince(before map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for name, n := range devalloc.DriverCalls() {
		if d := n - before[name]; d > 0 {
			out[name] = d
		}
	}
	return out
}

// TestCUDAFakeDriverCalls counts the driver calls of the hot path on the
// fake runtime, TestCUDADriverCalls on the GPU.
func TestCUDAFakeDriverCalls(t *testing.T) {
	testDriverCalls(t, func(t *testing.T) { useFakeCUDA(t) })
}

func TestCUDADriverCalls(t *testing.T) {
	requireCUDA(t)
	testDriverCalls(t, func(*testing.T) {})
}

// testDriverCalls counts the driver calls of the hot path, once warm, on
// one thread (a goroutine that moves to a thread where the device is not
// current pays one cudaSetDevice more): a Memset is one memset after a
// look at the thread's context; no event, no pool query. The sizes recur
// on one stream, so on the pool an Alloc takes the block the last cycle's
// Free kept there, and neither calls the driver, as on the cudaMalloc
// fallback; with reuse off (cache:off) an Alloc is one pool allocation and
// a Free one stream-ordered free, each after a look at the context.
func testDriverCalls(t *testing.T, setup func(*testing.T)) {
	for _, tc := range []struct {
		name          string
		poolOff       bool
		noReuse       bool
		alloc, free   map[string]uint64
		memset, cycle map[string]uint64
	}{
		{
			name:   "pool",
			alloc:  map[string]uint64{},
			free:   map[string]uint64{},
			memset: map[string]uint64{"cudaMemsetAsync": 1, "cuCtxGetCurrent": 1},
		},
		{
			name:    "pool without reuse",
			noReuse: true,
			alloc:   map[string]uint64{"cudaMallocFromPoolAsync": 1, "cuCtxGetCurrent": 1},
			free:    map[string]uint64{"cudaFreeAsync": 1, "cuCtxGetCurrent": 1},
			memset:  map[string]uint64{"cudaMemsetAsync": 1, "cuCtxGetCurrent": 1},
		},
		{
			name:    "fallback",
			poolOff: true,
			alloc:   map[string]uint64{},
			free:    map[string]uint64{},
			memset:  map[string]uint64{"cudaMemsetAsync": 1, "cuCtxGetCurrent": 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			setup(t)
			if tc.poolOff {
				defer devalloc.ForceCUDAPoolOff()()
			}
			cfg := &devalloc.Config{}
			if tc.noReuse {
				cfg.Cache = -1
			}
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: cfg, Warn: func(string) {}})
			require.NoError(t, err)
			s := a.DefaultStream()
			sizes := []int64{100, 4096, 1 << 20, 3 << 20, 100, 64 << 10}
			bufs := make([]*devalloc.Buffer, len(sizes))
			cycle := func(check bool) {
				for i, n := range sizes {
					before := devalloc.DriverCalls()
					bufs[i], err = a.Alloc(n, s)
					require.NoError(t, err)
					if check {
						require.Equal(t, tc.alloc, callsSince(before), "Alloc of %d bytes", n)
					}
				}
				for i, b := range bufs {
					before := devalloc.DriverCalls()
					require.NoError(t, s.Memset(b, 0, sizes[i], 7))
					if check {
						require.Equal(t, tc.memset, callsSince(before), "Memset")
					}
					before = devalloc.DriverCalls()
					require.NoError(t, b.Free())
					if check {
						require.Equal(t, tc.free, callsSince(before), "Free")
					}
				}
				before := devalloc.DriverCalls()
				require.NoError(t, s.Synchronize())
				if check {
					got := callsSince(before)
					require.EqualValues(t, 1, got["cudaStreamSynchronize"], "%v", got)
					delete(got, "cudaStreamSynchronize")
					delete(got, "cuCtxGetCurrent")
					if !tc.poolOff {
						// The pool's usage is not sampled under Retain.
						require.Empty(t, got)
					}
				}
			}
			cycle(false) // warm: the pool reserves, the fallback fills its cache
			cycle(true)
			cycle(true)
			require.Zero(t, a.Stats().LedgerEvents)
			require.NoError(t, a.Close())
		})
	}
}

// TestCUDAFakeDriverCallsCounted: the counts are the loader's, not a
// constant: a cross-stream read records the mark it waits for.
func TestCUDAFakeDriverCallsCounted(t *testing.T) {
	useFakeCUDA(t)
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}, Warn: func(string) {}})
	require.NoError(t, err)
	s := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	b, err := a.Alloc(4096, s)
	require.NoError(t, err)
	c, err := a.Alloc(4096, s2)
	require.NoError(t, err)
	before := maps.Clone(devalloc.DriverCalls())
	require.NoError(t, s2.Copy(c, 0, b, 0, 4096))
	got := callsSince(before)
	require.EqualValues(t, 1, got["cudaEventRecord"], "%v", got)
	require.EqualValues(t, 1, got["cudaStreamWaitEvent"], "%v", got)
	require.EqualValues(t, 1, got["cudaMemcpyAsync"], "%v", got)
	require.NoError(t, b.Free())
	require.NoError(t, c.Free())
	require.NoError(t, a.Close())
}

// TestCUDAFakeAutoEndPhaseCalls: under Auto a phase end reads the pool and
// the device while the phases change, and makes no driver call once they
// hold still (within 100 ms of its last look).
func TestCUDAFakeAutoEndPhaseCalls(t *testing.T) {
	useFakeCUDA(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}, Warn: func(string) {}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	require.Equal(t, devalloc.Auto, a.Info().Config.Policy)
	s := a.DefaultStream()
	phase := func(sizes ...int64) map[string]uint64 {
		for _, n := range sizes {
			b, err := a.Alloc(n, s)
			require.NoError(t, err)
			require.NoError(t, b.Free())
		}
		before := devalloc.DriverCalls()
		require.NoError(t, a.EndPhase())
		return callsSince(before)
	}
	looks := func(calls map[string]uint64) bool { return calls["cudaMemGetInfo"] > 0 }
	require.True(t, looks(phase(8<<20, 1<<20)), "the first phase grew")
	require.True(t, looks(phase(8<<20, 1<<20)), "one phase at a size is not yet steady")
	for range 3 {
		require.Empty(t, phase(8<<20, 1<<20), "steady")
	}
	require.True(t, looks(phase(64<<20, 1<<20)), "a larger working set is looked at")
}
