package devalloc_test

import (
	"errors"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

// growingSizes is a two-site solve's working set at bond dimension m, in the
// proportions of shared/anchors' maxm.cu (environments, wavefunction,
// result, temporaries, in units of m*m doubles) and a tail of tiny blocks.
func growingSizes(m int) []int64 {
	u := int64(m) * int64(m) * 8
	out := []int64{5 * u, 5 * u, 4 * u, 4 * u, 10 * u, 10 * u, 2 * u}
	s := uint32(12345 + m)
	for range 200 {
		s = s*1103515245 + 12345
		out = append(out, 64+int64(s>>8)%16384)
	}
	return out
}

// growUntilFull runs the growing sweep of ranks allocators sharing the host
// backend's memory (DISTBUF_HOST_MEMORY), as ranks share a GPU: m grows by
// 1.12 a step, two solves a step, the ranks allocating in turn, buffer by
// buffer, each solve freeing all and ending its phase. It returns the
// largest m every rank completed, and the first allocation error.

func growUntilFull(t *testing.T, backend devalloc.Backend, policy devalloc.Policy, ranks int) (maxM int, stop error) {
	t.Helper()
	as := make([]*devalloc.Allocator, ranks)
	for r := range as {
		a, err := devalloc.Open(devalloc.Options{Backend: backend, Config: &devalloc.Config{Policy: policy}, Warn: func(string) {}})
		require.NoError(t, err)
		as[r] = a
	}
	defer func() {
		for _, a := range as {
			require.NoError(t, a.Close())
		}
	}()
	bufs := make([][]*devalloc.Buffer, ranks)
	freeAll := func() {
		for r, a := range as {
			for _, b := range bufs[r] {
				require.NoError(t, b.Free())
			}
			bufs[r] = bufs[r][:0]
			require.NoError(t, a.EndPhase())
		}
	}
	for m := 64.0; ; m *= 1.12 {
		sizes := growingSizes(int(m))
		for range 2 {
			for _, size := range sizes {
				for r, a := range as {
					b, err := a.Alloc(size, a.DefaultStream())
					if err != nil {
						freeAll()
						return maxM, err
					}
					bufs[r] = append(bufs[r], b)
				}
			}
			freeAll()
		}
		maxM = int(m)
	}
}

// TestAutoReachesFree is the retention question on a device that two ranks
// share: retaining memory sized for the last step leaves the other rank too
// little for the next, so Retain stops earlier than AggressiveFree; Auto
// must stop no earlier than AggressiveFree.
func TestAutoReachesFree(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "512MiB")
	testAutoReachesFree(t, devalloc.BackendHost, true)
}

// testAutoReachesFree runs the sweep under each policy. retainCostsReach
// checks that Retain stops earlier, where the backend is deterministic
// enough for that to hold every time (the host pool frees in the caller's
// order; the fake driver's streams run theirs on threads of their own).
func testAutoReachesFree(t *testing.T, backend devalloc.Backend, retainCostsReach bool) {
	reach := map[devalloc.Policy]int{}
	for _, p := range []devalloc.Policy{devalloc.AggressiveFree, devalloc.Retain, devalloc.Auto} {
		m, err := growUntilFull(t, backend, p, 2)
		require.ErrorIs(t, err, distbuf.ErrOutOfMemory, "%v: the sweep ends when the memory is full", p)
		var oom *devalloc.OutOfMemoryError
		require.True(t, errors.As(err, &oom), "%v: %v", p, err)
		reach[p] = m
		t.Logf("%-6v largest m %d, stopped by: %v", p, m, err)
	}
	if retainCostsReach {
		require.Less(t, reach[devalloc.Retain], reach[devalloc.AggressiveFree], "the scenario is one where retaining costs reach")
	}
	require.GreaterOrEqual(t, reach[devalloc.Auto], reach[devalloc.AggressiveFree], "auto must reach the m of free")
}

// phaseSweep runs phases solves of the same working set on one allocator
// and returns the reservation after each phase and the trims made.
func phaseSweep(t *testing.T, cfg devalloc.Config, m, phases int, pause time.Duration) (reserved []int64, st devalloc.Stats) {
	t.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &cfg})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	for range phases {
		var bufs []*devalloc.Buffer
		for _, size := range growingSizes(m) {
			b, err := a.Alloc(size, a.DefaultStream())
			require.NoError(t, err)
			bufs = append(bufs, b)
		}
		for _, b := range bufs {
			require.NoError(t, b.Free())
		}
		time.Sleep(pause)
		require.NoError(t, a.EndPhase())
		reserved = append(reserved, a.Stats().ReservedCurrent)
	}
	return reserved, a.Stats()
}

// TestAutoKeepsWhatItReuses: at a fixed size Auto keeps its memory as Retain
// does, so a phase after the first reserves nothing new; where the working
// set is over half the device (its unused memory at a phase end is more than
// what stays free) it gives the memory of the first two phases back and
// keeps the third's, once the size has held; AggressiveFree gives
// everything back at every phase end.
func TestAutoKeepsWhatItReuses(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "1GiB")
	retain, rst := phaseSweep(t, devalloc.Config{Policy: devalloc.Retain}, 300, 6, 0)
	auto, ast := phaseSweep(t, devalloc.Config{Policy: devalloc.Auto}, 300, 6, 0)
	free, _ := phaseSweep(t, devalloc.Config{Policy: devalloc.AggressiveFree}, 300, 6, 0)
	require.Positive(t, retain[0])
	require.Equal(t, retain, auto, "a small working set: auto is retain")
	require.Equal(t, rst.ReservedTotal, ast.ReservedTotal, "and reserves as much, once")
	require.Zero(t, ast.Trims)
	require.Equal(t, make([]int64, 6), free)

	// About 60% of the device: m = 1900 is 40 * 1900^2 * 8 bytes = 1.08 GiB; at 4 GiB, 27%.
	t.Setenv("DISTBUF_HOST_MEMORY", "1800MiB")
	big, bst := phaseSweep(t, devalloc.Config{Policy: devalloc.Auto}, 1900, 6, 0)
	require.Equal(t, []int64{0, 0}, big[:2], "the first two phases on a tight device: given back")
	require.Positive(t, big[2], "the third needed no more than the second: kept")
	for _, r := range big[3:] {
		require.Equal(t, big[2], r, "and kept after")
	}
	require.EqualValues(t, 2, bst.Trims)
}

// TestAutoHeadroom: whatever the phases need, Auto gives unused memory back
// at a phase end when less than the headroom is free on the device; once
// the phases hold still it looks at most every 100 ms.
func TestAutoHeadroom(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "1GiB")
	kept, _ := phaseSweep(t, devalloc.Config{Policy: devalloc.Auto, Headroom: 256 << 20}, 1000, 3, 0)
	require.Positive(t, kept[2], "the working set (305 MiB) leaves more than 256 MiB free")
	given, st := phaseSweep(t, devalloc.Config{Policy: devalloc.Auto, Headroom: 800 << 20}, 1000, 4, 110*time.Millisecond)
	require.Equal(t, []int64{0, 0, 0, 0}, given, "less than 800 MiB free at each phase end")
	require.EqualValues(t, 4, st.Trims)
	soon, st := phaseSweep(t, devalloc.Config{Policy: devalloc.Auto, Headroom: 800 << 20}, 1000, 4, 0)
	require.Equal(t, []int64{0, 0}, soon[:2], "the first two phases are looked at")
	require.Positive(t, soon[3], "then not within 100 ms")
	require.EqualValues(t, 2, st.Trims)
}

// TestHostMemory: DISTBUF_HOST_MEMORY is the host backend's device: its
// size is the total the allocator reports and caps what the process's host
// pools reserve together; a bad value names the variable.
func TestHostMemory(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "64MiB")
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &devalloc.Config{}})
	require.NoError(t, err)
	require.EqualValues(t, 64<<20, a.Info().TotalMemory)
	b, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &devalloc.Config{}})
	require.NoError(t, err)
	x, err := a.Alloc(40<<20, a.DefaultStream())
	require.NoError(t, err)
	_, err = b.Alloc(40<<20, b.DefaultStream())
	require.ErrorIs(t, err, distbuf.ErrOutOfMemory, "the two pools share the 64 MiB")
	require.ErrorContains(t, err, "DISTBUF_HOST_MEMORY")
	require.NoError(t, x.Free())
	require.NoError(t, a.Close())
	y, err := b.Alloc(40<<20, b.DefaultStream())
	require.NoError(t, err, "a's memory went back with its Close")
	require.NoError(t, y.Free())
	require.NoError(t, b.Close())

	for _, v := range []string{"lots", "-1GiB", "0"} {
		t.Setenv("DISTBUF_HOST_MEMORY", v)
		_, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &devalloc.Config{}})
		require.ErrorIs(t, err, distbuf.ErrBadConfig, v)
		require.ErrorContains(t, err, "DISTBUF_HOST_MEMORY", v)
	}
}

// TestLargestAlloc: the probe finds what is left, within its resolution,
// under the device's memory and the budget, and leaves the reservation as
// it found it.
func TestLargestAlloc(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "1GiB")
	within := func(t *testing.T, got, want int64) {
		t.Helper()
		tol := max(int64(2<<20), want/64)
		require.InDelta(t, float64(want), float64(got), float64(tol+(2<<20)), "got %d, want %d", got, want)
		require.LessOrEqual(t, got, want)
	}
	for _, p := range []devalloc.Policy{devalloc.Auto, devalloc.Retain, devalloc.AggressiveFree} {
		t.Run(p.String(), func(t *testing.T) {
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &devalloc.Config{Policy: p}})
			require.NoError(t, err)
			defer func() { require.NoError(t, a.Close()) }()
			s := a.DefaultStream()
			n, err := a.LargestAlloc(s)
			require.NoError(t, err)
			within(t, n, 1<<30)
			x, err := a.Alloc(300<<20, s)
			require.NoError(t, err)
			before := a.Stats().ReservedCurrent
			n, err = a.LargestAlloc(s)
			require.NoError(t, err)
			within(t, n, 1<<30-before)
			if p != devalloc.AggressiveFree {
				require.Equal(t, before, a.Stats().ReservedCurrent, "the probe's reservation is given back")
			}
			require.NoError(t, x.Free())
		})
	}
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &devalloc.Config{Limit: 100 << 20}})
	require.NoError(t, err)
	x, err := a.Alloc(30<<20, a.DefaultStream())
	require.NoError(t, err)
	n, err := a.LargestAlloc(a.DefaultStream())
	require.NoError(t, err)
	within(t, n, 70<<20)
	require.NoError(t, x.Free())
	require.NoError(t, a.Close())
	_, err = a.LargestAlloc(a.DefaultStream())
	require.ErrorIs(t, err, distbuf.ErrClosed)
}
