//go:build cgo

package main

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// TestSolveRuntimeCallsFakeCUDA: on the CUDA backend (the fake runtime) the
// summary counts the solves' runtime calls; each solve makes at least its
// allocations, copies and GEMM launch.
func TestSolveRuntimeCallsFakeCUDA(t *testing.T) {
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t))
	t.Setenv(cudarttest.EnvNVRTC, cudarttest.BuildNVRTC(t))
	t.Setenv(cudarttest.EnvCUBLAS, cudarttest.BuildCUBLAS(t))
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
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t))
	t.Setenv(cudarttest.EnvNVRTC, cudarttest.BuildNVRTC(t))
	t.Setenv(cudarttest.EnvCUBLAS, cudarttest.BuildCUBLAS(t))
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
