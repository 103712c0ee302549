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
	require.Len(t, large, 6, "three allocators, two touches each")
	for _, r := range large[4:] {
		require.Equal(t, "retained", r.Extra["allocator"])
		require.EqualValues(t, 2, r.Extra["allocs_per_cycle"])
		require.Contains(t, r.Extra, "vs_cudamalloc")
	}
	require.Equal(t, "cycle", large[4].Extra["case"])
	require.Equal(t, "cycle-touch", large[5].Extra["case"])

	// The raw pool: both thresholds, both touches; the retained lines carry
	// the platform's ratios and how far the allocator is from it.
	for _, kase := range []string{"cycle", "cycle-touch"} {
		var raw []benchResult
		for _, r := range lines {
			if r.Mode == "raw-pool" && r.Extra["case"] == kase {
				raw = append(raw, r)
			}
		}
		require.Len(t, raw, 2, kase)
		require.Equal(t, "threshold0", raw[0].Extra["allocator"])
		require.Equal(t, "retained", raw[1].Extra["allocator"])
		require.Equal(t, "cuda-pool-raw", raw[1].Extra["kind"])
		for _, k := range []string{"vs_threshold0", "vs_cudamalloc", "allocator_retained_over_raw"} {
			require.Contains(t, raw[1].Extra, k, kase)
		}
		require.InDelta(t, raw[0].MedianUS/raw[1].MedianUS, raw[1].Extra["vs_threshold0"], 0.001)
	}
	touch := find(lines, "retained-packed", "cycle-touch", 0)
	require.NotNil(t, touch)
	require.Contains(t, touch.Extra, "vs_large_only")
	require.EqualValues(t, allocParams.touchBytes, touch.Extra["touch_bytes"])
}
