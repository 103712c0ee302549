package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// smallAllocParams keeps the benchmark's structure at a size CI runs in seconds.
func smallAllocParams(t *testing.T) {
	old := allocParams
	t.Cleanup(func() { allocParams = old })
	allocParams.pairs, allocParams.pairWarmup, allocParams.nosyncBatch = 20, 2, 10
	allocParams.pairSizes = []int64{256, 4096}
	allocParams.minCycles, allocParams.warmup, allocParams.phaseCycles, allocParams.pairedCycles, allocParams.deviceCycles = 3, 1, 2, 3, 3
	allocParams.bonds = 2
	allocParams.large, allocParams.tiny = 2, 20
	allocParams.largeMin, allocParams.largeMax = 1<<20, 2<<20
}

func runAllocBench(t *testing.T, backend, mode string) []benchResult {
	t.Helper()
	var out bytes.Buffer
	cfg := config{backend: backend, policy: "retain", iters: 3, seed: 7, bench: "alloc", mode: mode}
	require.NoError(t, runBench(cfg, nil, &out))
	var lines []benchResult
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r benchResult
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "line %q", sc.Text())
		require.Equal(t, "alloc", r.Bench)
		lines = append(lines, r)
	}
	return lines
}

func find(lines []benchResult, mode, kase string, bytes int64) *benchResult {
	for i, r := range lines {
		if r.Mode == mode && (kase == "" || r.Extra["case"] == kase) && (bytes == 0 || r.Bytes == bytes) {
			return &lines[i]
		}
	}
	return nil
}

func TestBenchAllocHost(t *testing.T) {
	smallAllocParams(t)
	lines := runAllocBench(t, "host", "")
	const noC = "needs the CUDA backend (the C baseline calls the pool through libcudart)"
	require.Equal(t, "c-pool", lines[0].Mode)
	require.Equal(t, noC, lines[0].Extra["skipped"], "the C baseline's line says why it is skipped")
	require.Equal(t, "needs the CUDA backend (raw cudaMalloc/cudaFree)", lines[1].Extra["skipped"])
	require.Equal(t, "cudamalloc", lines[1].Mode)
	fb := find(lines, "fallback", "", 0)
	require.NotNil(t, fb)
	require.Equal(t, "needs the CUDA backend (the cudaMalloc fallback)", fb.Extra["skipped"])
	// Every devalloc line says why it has no vs_c.
	devallocLines := 0
	for _, r := range lines {
		if r.Mode == "c-pool" || r.Extra["skipped"] != nil {
			continue
		}
		devallocLines++
		require.Equal(t, noC, r.Extra["vs_c_skipped"], "%s %v", r.Mode, r.Extra["case"])
		require.NotContains(t, r.Extra, "vs_c", "%s %v", r.Mode, r.Extra["case"])
		require.NotContains(t, r.Extra, "driver_calls_per_cycle", "no driver on the host")
	}
	require.Equal(t, 3*(2+2)+2*2+2*2, devallocLines, "pairs and cycles of three modes, large-only of two, two packed")
	for _, mode := range []string{"threshold0", "trim-phase", "retained"} {
		for _, size := range []int64{256, 4096} {
			p := find(lines, mode, "pair", size)
			require.NotNil(t, p, "%s pair %d", mode, size)
			require.Positive(t, p.MedianUS)
			require.Equal(t, 20, p.N)
		}
		for _, kase := range []string{"cycle", "cycle-touch"} {
			cyc := find(lines, mode, kase, 0)
			require.NotNil(t, cyc, "%s %s", mode, kase)
			require.Equal(t, 3, cyc.N)
			require.EqualValues(t, 22, cyc.Extra["allocs_per_cycle"])
			require.Positive(t, cyc.MedianUS)
		}
	}
	require.EqualValues(t, 0, find(lines, "retained", "cycle", 0).Extra["touch_bytes"])
	require.EqualValues(t, 4096, find(lines, "retained", "cycle-touch", 0).Extra["touch_bytes"])
	require.Equal(t, "needs the CUDA backend (a cudaMemPool called directly)", lines[len(lines)-1].Extra["skipped"])
	ret := find(lines, "retained", "cycle", 0)
	require.Contains(t, ret.Extra, "vs_threshold0")
	require.Contains(t, ret.Extra["ratios_missing"], "cudamalloc")
	require.Zero(t, find(lines, "trim-phase", "cycle", 0).Extra["reserved_after_phase_bytes"], "trimmed at the phase boundary")
	require.Positive(t, ret.Extra["reserved_after_phase_bytes"], "retained keeps its memory")
	for _, kase := range []string{"cycle", "cycle-touch"} {
		pk := find(lines, "retained-packed", kase, 0)
		re := find(lines, "retained-packed-replan", kase, 0)
		require.NotNil(t, pk, kase)
		require.NotNil(t, re, kase)
		// On the host, four sweeps of allocParams.bonds solves, plus warm-up.
		require.Equal(t, 8, pk.N)
		require.Equal(t, 8, re.N)
		require.EqualValues(t, 2, pk.Extra["plans_built"], "a plan per bond, reused by later sweeps")
		require.EqualValues(t, 9, re.Extra["plans_built"], "a plan every cycle")
		require.Equal(t, pk.Extra["large_only_in_turns_us"], re.Extra["large_only_in_turns_us"], "one baseline in turns with both")
		require.Positive(t, pk.Extra["large_only_in_turns_us"])
		require.Contains(t, pk.Extra, "meets_goal_vs_large_only")
		require.NotContains(t, re.Extra, "meets_goal_vs_large_only", "the goal is the reused plan's")
		require.Positive(t, pk.Extra["twin_vs_large_only"], "the method's error, from a second baseline in turns")
		require.Equal(t, pk.Extra["twin_vs_large_only"], re.Extra["twin_vs_large_only"])
		require.Positive(t, pk.Extra["large_only_alloc_median_us"])
		for _, r := range []*benchResult{pk, re} {
			require.Contains(t, r.Extra, "vs_large_only")
			require.Contains(t, r.Extra, "vs_large_only_separate")
			require.Positive(t, r.Extra["plan_median_us"])
			require.Positive(t, r.Extra["coalesced_alloc_median_us"])
			require.EqualValues(t, allocParams.large+1, r.Extra["backend_calls_per_cycle"], "the large buffers and one coalesced buffer")
		}
	}

	only := runAllocBench(t, "host", "retained")
	require.Len(t, only, 4, "two pairs, two cycles")
	cOnly := runAllocBench(t, "host", "c-pool")
	require.Len(t, cOnly, 1)
	require.Equal(t, noC, cOnly[0].Extra["skipped"])
	require.NotContains(t, only[2].Extra, "vs_threshold0", "no baseline in a run of one mode")
	require.NotContains(t, only[3].Extra, "vs_threshold0", "no baseline in a run of one mode")

	var out bytes.Buffer
	err := runBench(config{backend: "host", policy: "retain", iters: 3, seed: 1, bench: "alloc", mode: "nope"}, nil, &out)
	require.ErrorContains(t, err, "unknown mode")
}
