//go:build cgo

package main

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// fakeCUDA is the fake CUDA libraries of this test binary, built once: the
// cuBLAS and NVRTC loaders load once per process, and the fake cuBLAS works
// on the streams of the fake libcudart loaded with it, so every test must
// use that one (a libcudart of another path would be another library,
// whose streams the fake cuBLAS cannot queue work on).
var fakeCUDA struct {
	once                  sync.Once
	cudart, nvrtc, cublas string
	failed                bool
}

func useFakeCUDA(t *testing.T) {
	t.Helper()
	fakeCUDA.once.Do(func() {
		dir, err := os.MkdirTemp("", "ranktest-fakecuda")
		if err != nil {
			fakeCUDA.failed = true
			t.Fatal(err)
		}
		testCleanups = append(testCleanups, func() { _ = os.RemoveAll(dir) })
		// Built in a test's temporary directory, then moved to one that
		// lasts as long as the test binary.
		for _, lib := range []struct {
			path  *string
			build func(testing.TB) string
		}{{&fakeCUDA.cudart, func(tb testing.TB) string { return cudarttest.Build(tb) }}, {&fakeCUDA.nvrtc, cudarttest.BuildNVRTC}, {&fakeCUDA.cublas, cudarttest.BuildCUBLAS}} {
			built := lib.build(t)
			*lib.path = filepath.Join(dir, filepath.Base(built))
			if err := os.Rename(built, *lib.path); err != nil {
				fakeCUDA.failed = true
				t.Fatal(err)
			}
		}
	})
	if fakeCUDA.failed {
		t.Fatal("the fake CUDA libraries could not be built (see the first test that tried)")
	}
	t.Setenv(cudart.EnvCUDART, fakeCUDA.cudart)
	t.Setenv(cudarttest.EnvNVRTC, fakeCUDA.nvrtc)
	t.Setenv(cudarttest.EnvCUBLAS, fakeCUDA.cublas)
}

// TestSolveRuntimeCallsFakeCUDA: on the CUDA backend (the fake runtime) the
// summary counts the solves' runtime calls; each solve makes at least its
// allocations, copies and GEMM launch.
func TestSolveRuntimeCallsFakeCUDA(t *testing.T) {
	useFakeCUDA(t)
	sum, raw := rawSummary(t, config{backend: "cuda", policy: "retain", mode: "packed", iters: 4, seed: 3, blocks: 100, bonds: 1, json: true})
	require.Zero(t, sum.VerifyFailures)
	require.Contains(t, raw, "runtime_calls")
	require.NotNil(t, sum.RuntimeCalls)
	require.GreaterOrEqual(t, *sum.RuntimeCalls, sum.AllocCalls+sum.GemmLaunches, "at least the allocations and the launches")
}

// TestSolveCallTimesFakeCUDA: with -calls the summary splits the same calls
// as runtime_calls by entry point, each with the time spent in it, and the
// table lists them.
func TestSolveCallTimesFakeCUDA(t *testing.T) {
	useFakeCUDA(t)
	const iters = 4
	sum, raw := rawSummary(t, config{backend: "cuda", policy: "retain", mode: "packed", iters: iters, seed: 3, blocks: 100, bonds: 1, json: true, calls: true})
	require.Zero(t, sum.VerifyFailures)
	require.Contains(t, raw, "runtime_calls_by_entry")
	var calls, us float64
	for name, e := range sum.RuntimeCallsByEntry {
		require.Positive(t, e.Calls, name)
		require.GreaterOrEqual(t, e.US, 0.0, name)
		calls += e.Calls
		us += e.US
	}
	require.InDelta(t, float64(*sum.RuntimeCalls)/iters, calls, 0.01, "the entry points share exactly the solves' calls")
	require.Positive(t, us)
	// One bond: the first solve's allocations are the pool's, and their
	// frees are kept for the next solve's allocations of the same sizes
	// on the stream (devalloc's same-stream reuse), so none goes back.
	for _, name := range []string{"cudaMallocFromPoolAsync", "cudaMemcpyAsync"} {
		require.Contains(t, sum.RuntimeCallsByEntry, name)
	}
	require.NotContains(t, sum.RuntimeCallsByEntry, "cudaFreeAsync")

	_, raw = rawSummary(t, config{backend: "cuda", policy: "retain", mode: "packed", iters: 2, seed: 3, blocks: 100, bonds: 1, json: true})
	require.NotContains(t, raw, "runtime_calls_by_entry", "only with -calls")

	// A fresh layout's operands are staged by the harness (filled on the
	// stream, then synchronised, and freed after the solve): neither count
	// nor time goes to the solve.
	sum, _ = rawSummary(t, config{backend: "cuda", policy: "retain", mode: "packed", iters: iters, seed: 3, blocks: 100, bonds: 1, fresh: true, json: true, calls: true})
	require.Zero(t, sum.VerifyFailures)
	require.NotContains(t, sum.RuntimeCallsByEntry, "cudaStreamSynchronize", "%v", sum.RuntimeCallsByEntry)
	require.NotContains(t, sum.RuntimeCallsByEntry, "cudaLaunchHostFunc", "%v", sum.RuntimeCallsByEntry)
	calls = 0
	for _, e := range sum.RuntimeCallsByEntry {
		calls += e.Calls
	}
	require.InDelta(t, float64(*sum.RuntimeCalls)/iters, calls, 0.01)
}

// TestSectorsFakeCUDA: the sectors workload on the CUDA backend (the fake
// runtime: device memory, copies, memsets, the small-block kernel and
// cuBLAS calls done on the host), with big blocks, through the device
// paths: every H·psi block right, device times reported.
func TestSectorsFakeCUDA(t *testing.T) {
	useFakeCUDA(t)
	cfg := sectorsConfig(96, 4, 2)
	cfg.backend = "cuda"
	cfg.bigBlock = 2 << 10
	sum, raw := rawSummary(t, cfg)
	require.Zero(t, sum.VerifyFailures)
	require.Equal(t, "cuda-pool", sum.Backend)
	require.Contains(t, raw, "device_us")
	require.NotNil(t, sum.RuntimeCalls)
	require.GreaterOrEqual(t, *sum.RuntimeCalls, sum.AllocCalls+sum.GemmLaunches)
}
