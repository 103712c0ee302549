package allocbench

import (
	"encoding/json"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
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

func runAllocBench(t *testing.T, backend, mode string) []Result {
	t.Helper()
	s, err := Open(devalloc.Backend(backend), 7)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	lines, err := s.Run(mode, Measure{})
	require.NoError(t, err)
	// What a JSON reader gets: numbers as float64, maps as map[string]any.
	for i := range lines {
		b, err := json.Marshal(lines[i])
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &lines[i]), "line %s", b)
		require.Equal(t, "alloc", lines[i].Bench)
	}
	return lines
}

func find(lines []Result, mode, kase string, bytes int64) *Result {
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
		for _, r := range []*Result{pk, re} {
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

	s, err := Open(devalloc.BackendHost, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	_, err = s.Run("nope", Measure{})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "unknown mode")
}

// TestRunMeasure: a Measure narrows a mode to one size or touch and sets
// the count, and the medians of one Run are the baselines of the next.
func TestRunMeasure(t *testing.T) {
	smallAllocParams(t)
	s, err := Open(devalloc.BackendHost, 7)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	pairs, err := s.Run("retained", Measure{Pairs: true, Size: 4096, N: 5})
	require.NoError(t, err)
	require.Len(t, pairs, 1)
	require.Equal(t, "pair", pairs[0].Extra["case"])
	require.EqualValues(t, 4096, pairs[0].Bytes)
	require.Equal(t, 5, pairs[0].N)
	require.Equal(t, 20, allocParams.pairs, "the counts are back")
	cyc, err := s.Run("threshold0", Measure{Cycles: true, Touch: "cycle-touch", N: 4})
	require.NoError(t, err)
	require.Len(t, cyc, 1)
	require.Equal(t, 4, cyc[0].N)
	cyc, err = s.Run("retained", Measure{Cycles: true, Touch: "cycle-touch", N: 4})
	require.NoError(t, err)
	require.Len(t, cyc, 1)
	require.Equal(t, "cycle-touch", cyc[0].Extra["case"])
	require.Contains(t, cyc[0].Extra, "vs_threshold0", "threshold0's median of the Run before")
	packed, err := s.Run("retained-packed", Measure{Touch: "cycle", N: 3})
	require.NoError(t, err)
	require.Len(t, packed, 2, "the reused plan and the plan built every cycle")
	require.Equal(t, 3, packed[0].N)
}
