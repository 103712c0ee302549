//go:build cgo

package main

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// TestBenchAllocFakeCUDA runs every mode, cudaMalloc included, on the CUDA
// backend over the fake runtime: the figures mean nothing, the plumbing does.
func TestBenchAllocFakeCUDA(t *testing.T) {
	smallAllocParams(t)
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t))
	lines := runAllocBench(t, "cuda", "")
	for _, r := range lines {
		require.NotContains(t, r.Extra, "skipped", "%s", r.Mode)
	}
	require.Equal(t, "cuda-raw", find(lines, "cudamalloc", "cycle", 0).Extra["kind"])
	require.Equal(t, "cuda-pool", find(lines, "retained", "cycle", 0).Extra["kind"])
	ret := find(lines, "retained", "cycle", 0)
	for _, k := range []string{"vs_threshold0", "vs_cudamalloc", "meets_goal_vs_threshold0", "meets_goal_vs_cudamalloc"} {
		require.Contains(t, ret.Extra, k)
	}
	require.NotContains(t, ret.Extra, "ratios_missing")
	thr, cm := find(lines, "threshold0", "cycle", 0), find(lines, "cudamalloc", "cycle", 0)
	require.InDelta(t, thr.MedianUS/ret.MedianUS, ret.Extra["vs_threshold0"], 0.001)
	require.InDelta(t, cm.MedianUS/ret.MedianUS, ret.Extra["vs_cudamalloc"], 0.001)
	require.Contains(t, find(lines, "retained", "pair", 256).Extra, "vs_cudamalloc")
	var large []benchResult
	for _, r := range lines {
		if r.Mode == "large-only" {
			large = append(large, r)
		}
	}
	require.Len(t, large, 3)
	require.EqualValues(t, 2, large[2].Extra["allocs_per_cycle"])
	require.Contains(t, large[2].Extra, "vs_cudamalloc")
}
