//go:build cgo

package allocbench

import (
	"runtime"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// TestBenchAllocFakeCUDA runs every mode, cudaMalloc included, on the CUDA
// backend over the fake runtime: the figures mean nothing, the plumbing does.
func TestBenchAllocFakeCUDA(t *testing.T) {
	// One thread: a goroutine that moves makes a cudaSetDevice more, which
	// would blur the counts checked below.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
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
	var large []Result
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
		var raw []Result
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

	// The C baseline: its own lines, and vs_c on every devalloc line.
	var cLines []Result
	for _, r := range lines {
		if r.Mode == "c-pool" {
			cLines = append(cLines, r)
		}
	}
	require.Len(t, cLines, 2+3*2, "two pairs, three shapes of two touches")
	for _, r := range cLines[2:] {
		require.Contains(t, []any{"per-buffer", "large-only", "packed"}, r.Extra["shape"])
		require.Positive(t, r.MedianUS)
		calls := r.Extra["driver_calls_by_entry"].(map[string]any)
		n := r.Extra["allocs_per_cycle"].(float64)
		if r.Extra["shape"] == "packed" {
			n = float64(allocParams.large + 1)
		}
		require.EqualValues(t, n, calls["cudaMallocFromPoolAsync"], "%v", r.Extra)
		require.EqualValues(t, n, calls["cudaFreeAsync"], "%v", r.Extra)
		require.EqualValues(t, 1, calls["cudaStreamSynchronize"], "%v", r.Extra)
	}
	require.EqualValues(t, 2, cLines[0].Extra["driver_calls_per_pair"], "C: one allocation and one free")
	for _, r := range lines {
		if r.Mode == "c-pool" || r.Backend == "cuda-raw" || r.Mode == "raw-pool" {
			continue
		}
		require.Contains(t, r.Extra, "vs_c", "%s %v", r.Mode, r.Extra["case"])
		require.Positive(t, r.Extra["c_in_turns_us"], "%s %v", r.Mode, r.Extra["case"])
		require.NotContains(t, r.Extra, "vs_c_skipped")
		if r.Extra["case"] == "pair" {
			require.Contains(t, r.Extra, "nosync_vs_c")
			continue
		}
		require.Positive(t, r.Extra["driver_calls_per_cycle"], "%s %v", r.Mode, r.Extra["case"])
		require.Positive(t, r.Extra["c_driver_calls_per_cycle"], "%s %v", r.Mode, r.Extra["case"])
		// C's phases beside devalloc's.
		for _, k := range []string{"c_alloc_median_us", "c_touch_median_us", "c_sync_median_us"} {
			require.Positive(t, r.Extra[k], "%s %v %s", r.Mode, r.Extra["case"], k)
		}
	}
	for _, mode := range []string{"retained", "retained-packed"} {
		r := find(lines, mode, "cycle-touch", 0)
		require.EqualValues(t, allocParams.goalVsC, r.Extra["goal_vs_c_at_most"], mode)
		require.Contains(t, r.Extra, "meets_goal_vs_c", mode)
	}
	require.NotContains(t, find(lines, "threshold0", "cycle", 0).Extra, "goal_vs_c_at_most", "the goals are retained's")
	require.Contains(t, large[5].Extra, "meets_goal_vs_c", "large-only, retained")

	// The pair's driver calls once warm: none on the retained pool, whose
	// Free keeps the block for the next Alloc of its size on the stream,
	// nor on the fallback; with that reuse off, one each for an Alloc and a
	// Free, beside the thread's context check.
	pair := find(lines, "retained", "pair", 256)
	require.EqualValues(t, 0, pair.Extra["driver_calls_per_alloc"], "%v", pair.Extra)
	require.EqualValues(t, 0, pair.Extra["driver_calls_per_free"], "%v", pair.Extra)
	require.Contains(t, pair.Extra, "goal_nosync_vs_c_at_most")
	noReuse := find(lines, "retained-noreuse", "pair", 256)
	require.NotNil(t, noReuse)
	require.EqualValues(t, map[string]any{"cudaMallocFromPoolAsync": 1.0, "cuCtxGetCurrent": 1.0}, noReuse.Extra["driver_calls_by_entry_alloc"])
	require.EqualValues(t, map[string]any{"cudaFreeAsync": 1.0, "cuCtxGetCurrent": 1.0}, noReuse.Extra["driver_calls_by_entry_free"])
	fb := find(lines, "fallback", "pair", 256)
	require.NotNil(t, fb)
	require.EqualValues(t, 0, fb.Extra["driver_calls_per_alloc"], "%v", fb.Extra)
	require.EqualValues(t, 0, fb.Extra["driver_calls_per_free"], "%v", fb.Extra)
	require.Equal(t, "cuda-malloc", fb.Extra["kind"])
}
