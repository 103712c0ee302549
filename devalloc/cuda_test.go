package devalloc_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/alloctest"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/stretchr/testify/require"
)

// requireCUDA skips the test, saying why, when no CUDA device is usable,
// and fails it instead when DISTBUF_REQUIRE_GPU=1.
func requireCUDA(t *testing.T) {
	t.Helper()
	n, err := devalloc.DeviceCount()
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: the runtime reports no device", gputest.ErrAbsent)
	}
	if err != nil {
		gputest.Unavailable(t, "CUDA", err)
	}
}

// cudaConformance runs the conformance suite on the CUDA backend: on its
// pool, or with pool false on the cudaMalloc fallback.
func cudaConformance(t *testing.T, pool bool) {
	t.Helper()
	if !pool {
		defer devalloc.ForceCUDAPoolOff()()
	}
	alloctest.Run(t, alloctest.Harness{Backend: devalloc.BackendCUDA, Pool: pool})
}

func TestCUDAConformance(t *testing.T) {
	requireCUDA(t)
	cudaConformance(t, true)
}

func TestCUDAConformanceFallback(t *testing.T) {
	requireCUDA(t)
	cudaConformance(t, false)
}

func TestCUDAHostWaitCallback(t *testing.T) {
	requireCUDA(t)
	t.Setenv("DISTBUF_CUDA_HOSTWAIT", "callback")
	testCUDAHostWaits(t, true)
}

func TestCUDABackendDetails(t *testing.T) {
	requireCUDA(t)
	testCUDABackendDetails(t, true)
}

// testCUDAHostWaits checks host work on a stream in whatever host-wait mode is
// in effect, without functions that block on one another across streams
// (which the callback mode cannot promise).
func testCUDAHostWaits(t *testing.T, pool bool) {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}, Warn: func(string) {}})
	require.NoError(t, err)
	require.Equal(t, pool, a.Info().Pool)
	t.Log(a.Info().Description)
	s := a.DefaultStream()
	boom := errors.New("boom")
	order := make(chan int, 3)
	require.NoError(t, s.Enqueue(func() error { order <- 1; return nil }))
	require.NoError(t, s.Enqueue(func() error { order <- 2; return boom }))
	require.NoError(t, s.Enqueue(func() error { order <- 3; panic("kaboom") }))
	err = s.Synchronize()
	require.ErrorIs(t, err, boom)
	require.Equal(t, []int{1, 2, 3}, []int{<-order, <-order, <-order})
	require.NoError(t, s.Synchronize(), "errors are reported once")

	// A stream reader waits for an outside writer's release.
	const n = 4096
	p, err := a.AllocPinned(n, s)
	require.NoError(t, err)
	out, err := a.AllocPinned(n, s)
	require.NoError(t, err)
	require.NoError(t, s.Memset(p, 0, n, 1))
	hw, err := p.Hold(devalloc.Write)
	require.NoError(t, err)
	require.NoError(t, hw.Wait())
	s2, err := a.NewStream()
	require.NoError(t, err)
	require.NoError(t, s2.Copy(out, 0, p, 0, n))
	ev, err := s2.Record()
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	done, err := ev.Done()
	require.NoError(t, err)
	require.False(t, done, "a reader ran while an outside writer held the buffer")
	view, err := p.Bytes()
	require.NoError(t, err)
	for i := range view {
		view[i] = 0x3c
	}
	require.NoError(t, hw.Release())
	require.NoError(t, ev.Wait())
	got, err := out.Bytes()
	require.NoError(t, err)
	for i := range got {
		if got[i] != 0x3c {
			t.Fatalf("byte %d is %#x after the outside write was released", i, got[i])
		}
	}
	require.NoError(t, ev.Release())
	require.NoError(t, p.Free())
	require.NoError(t, out.Free())

	// A hold never released does not keep Close from finishing.
	q, err := a.AllocPinned(n, s2)
	require.NoError(t, err)
	_, err = q.Hold(devalloc.Read)
	require.NoError(t, err)
	require.NoError(t, s2.Memset(q, 0, n, 0)) // a write: waits for the reading hold
	require.ErrorIs(t, a.Close(), distbuf.ErrLeak)
}

// testCUDABackendDetails checks what the conformance suite leaves to the backend.
func testCUDABackendDetails(t *testing.T, pool bool) {
	n, err := devalloc.DeviceCount()
	require.NoError(t, err)
	require.Positive(t, n)

	_, err = devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Device: n, Config: &devalloc.Config{}})
	require.ErrorIs(t, err, distbuf.ErrUnavailable)
	require.ErrorContains(t, err, "not present")

	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}})
	require.NoError(t, err)
	require.Equal(t, pool, a.Info().Pool)
	require.Contains(t, a.Info().Description, "CUDA device 0")
	require.NotZero(t, a.DefaultStream().Handle(), "the default stream is a real cudaStream_t")
	s := a.DefaultStream()
	b, err := a.Alloc(8<<20, s)
	require.NoError(t, err)
	addr, _, device, err := b.Region()
	require.NoError(t, err)
	require.True(t, device)
	require.NotZero(t, addr)
	require.NoError(t, s.Memset(b, 0, b.Size(), 0))
	require.NoError(t, b.Free())
	require.NoError(t, a.Sync())
	before := a.Stats()
	require.GreaterOrEqual(t, before.ReservedTotal, int64(8<<20))
	require.NoError(t, a.Close())
	after := a.Stats()
	require.Equal(t, before.ReservedCurrent, after.ReservedCurrent, "Stats after Close report the final pool usage")
	require.Equal(t, before.ReservedPeak, after.ReservedPeak)
	require.Equal(t, before.AllocCalls, after.AllocCalls)

	t.Setenv("DISTBUF_CUDA_HOSTWAIT", "sometimes")
	_, err = devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "DISTBUF_CUDA_HOSTWAIT")
}
