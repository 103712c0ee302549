//go:build cgo

package devalloc_test

import (
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// The tests below run the CUDA backend against the fake libcudart of
// internal/cudart/testdata: host memory, asynchronous streams. They need a
// C compiler, not a GPU, and prove the backend's logic (ledger on events,
// host waits, pool and fallback bookkeeping, error mapping); the GPU tests
// prove it against the real driver.

func useFakeCUDA(t *testing.T, defines ...string) {
	t.Helper()
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t, defines...))
}

func TestCUDAFakeConformance(t *testing.T) {
	useFakeCUDA(t)
	cudaConformance(t, true)
}

func TestCUDAFakeConformanceFallback(t *testing.T) {
	useFakeCUDA(t)
	cudaConformance(t, false)
}

// TestCUDAFakeAutoReachesFree is TestAutoReachesFree on the fake driver's
// pools, which share one device of FAKE_MEMORY bytes.
func TestCUDAFakeAutoReachesFree(t *testing.T) {
	useFakeCUDA(t, "FAKE_MEMORY=536870912")
	testAutoReachesFree(t, devalloc.BackendCUDA, false)
}

func TestCUDAFakeDetails(t *testing.T) {
	useFakeCUDA(t)
	testCUDABackendDetails(t, true)
}

func TestCUDAFakeHostWaits(t *testing.T) {
	t.Run("memop", func(t *testing.T) {
		useFakeCUDA(t)
		testCUDAHostWaits(t, true)
	})
	t.Run("callback", func(t *testing.T) {
		useFakeCUDA(t)
		t.Setenv("DISTBUF_CUDA_HOSTWAIT", "callback")
		testCUDAHostWaits(t, true)
	})
	t.Run("no-wait-value", func(t *testing.T) {
		useFakeCUDA(t, "FAKE_NO_WAIT_VALUE")
		a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}})
		require.NoError(t, err)
		require.Contains(t, a.Info().Description, "blocking host callbacks", "falls back when cuStreamWaitValue32 is missing")
		require.NoError(t, a.Close())
		t.Setenv("DISTBUF_CUDA_HOSTWAIT", "memop")
		_, err = devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}})
		require.ErrorIs(t, err, distbuf.ErrBadConfig)
		require.ErrorContains(t, err, "cuStreamWaitValue32")
	})
}

func TestCUDAFakeNoPoolSupport(t *testing.T) {
	for _, tc := range []struct{ define, reason string }{
		{"FAKE_POOLS_SUPPORTED=0", "the device does not support memory pools"},
		{"FAKE_NO_POOLS", "the runtime lacks the stream-ordered pool functions"},
	} {
		t.Run(tc.define, func(t *testing.T) {
			useFakeCUDA(t, tc.define)
			var warned []string
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{},
				Warn: func(m string) { warned = append(warned, m) }})
			require.NoError(t, err)
			require.False(t, a.Info().Pool, "the cudaMalloc fallback")
			require.Contains(t, a.Info().Description, tc.reason)
			require.NotEmpty(t, a.Info().FallbackReason)
			require.Len(t, warned, 1, "the fallback is reported")
			require.EqualValues(t, 1, a.Stats().Fallbacks)
			require.NoError(t, a.Close())
		})
	}
}

func TestCUDAFakeUnavailable(t *testing.T) {
	for _, tc := range []struct{ define, name string }{
		{"FAKE_DEVICE_COUNT_ERROR=100", "cudaErrorNoDevice"},
		{"FAKE_DEVICE_COUNT_ERROR=35", "cudaErrorInsufficientDriver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			useFakeCUDA(t, tc.define)
			_, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}})
			require.ErrorIs(t, err, distbuf.ErrUnavailable)
			require.ErrorContains(t, err, tc.name)
			n, err := devalloc.DeviceCount()
			require.Zero(t, n)
			require.ErrorIs(t, err, distbuf.ErrUnavailable)

			var warned string
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendAuto, Config: &devalloc.Config{},
				Warn: func(m string) { warned = m }})
			require.NoError(t, err)
			require.Equal(t, devalloc.BackendHost, a.Info().Backend, "auto falls back to the host backend")
			require.Contains(t, a.Info().FallbackReason, tc.name)
			require.Contains(t, warned, tc.name)
			require.NoError(t, a.Close())
		})
	}
	t.Run("missing-library", func(t *testing.T) {
		t.Setenv(cudart.EnvCUDART, "/nonexistent/libcudart.so.13")
		_, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}})
		require.ErrorIs(t, err, distbuf.ErrUnavailable)
		require.ErrorContains(t, err, "/nonexistent/libcudart.so.13")
	})
	t.Run("missing-symbol", func(t *testing.T) {
		useFakeCUDA(t, "FAKE_OMIT_cudaMemcpyAsync")
		_, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}})
		require.ErrorIs(t, err, distbuf.ErrUnavailable)
		require.ErrorContains(t, err, "cudaMemcpyAsync")
	})
}

// TestCUDAFakeDefaultPrime: a retaining pool reserves a sixteenth of the
// device at Open and keeps it; AggressiveFree and prime:none reserve
// nothing.
func TestCUDAFakeDefaultPrime(t *testing.T) {
	useFakeCUDA(t, "FAKE_MEMORY=1073741824")
	open := func(cfg devalloc.Config) *devalloc.Allocator {
		a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &cfg, Warn: func(string) {}})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, a.Close()) })
		return a
	}
	a := open(devalloc.Config{})
	require.EqualValues(t, 64<<20, a.Stats().ReservedCurrent, "a sixteenth of 1 GiB")
	b, err := a.Alloc(8<<20, a.DefaultStream())
	require.NoError(t, err)
	st := a.Stats()
	require.GreaterOrEqual(t, st.ReservedCurrent, int64(64<<20), "the prime is kept")
	require.Zero(t, st.Trims)
	require.NoError(t, b.Free())
	require.Zero(t, open(devalloc.Config{Policy: devalloc.AggressiveFree}).Stats().ReservedCurrent)
	require.Zero(t, open(devalloc.Config{Prime: -1}).Stats().ReservedCurrent)
}
