package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/distbuf/distbuf/cluster"
	"github.com/stretchr/testify/require"
)

// testCleanups run after every test of the binary.
var testCleanups []func()

func TestMain(m *testing.M) {
	if err := cluster.Init(); err != nil {
		panic(err)
	}
	code := m.Run()
	for _, f := range testCleanups {
		f()
	}
	if err := cluster.Finalize(); err != nil && code == 0 {
		code = 1
	}
	os.Exit(code)
}

func runSolve(t *testing.T, cfg config) (summary, string, error) {
	t.Helper()
	world, err := cluster.World()
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	err = run(cfg, world, &out, &errOut)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var sum summary
	if cfg.json && err == nil {
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), out.String())
	}
	return sum, errOut.String(), err
}

func TestSolveModes(t *testing.T) {
	for _, mode := range []string{"packed", "perblock"} {
		t.Run(mode, func(t *testing.T) {
			sum, _, err := runSolve(t, config{backend: "host", policy: "retain", mode: mode, iters: 3, seed: 5, blocks: 300, json: true})
			require.NoError(t, err)
			require.True(t, sum.OK)
			require.Equal(t, 1, sum.Ranks)
			require.Equal(t, 300, sum.Blocks)
			require.Zero(t, sum.VerifyFailures)
			require.Positive(t, sum.MedianSolveUS)
			if mode == "perblock" {
				require.EqualValues(t, 3*3*300, sum.AllocCalls, "one allocation per operand and block")
				require.EqualValues(t, 3*300, sum.GemmLaunches)
				require.EqualValues(t, 3*300, sum.Messages)
			} else {
				require.Less(t, sum.AllocCalls, int64(3*20), "a handful of allocations per solve")
				require.Less(t, sum.GemmLaunches, int64(3*10))
				require.LessOrEqual(t, sum.Messages, int64(3))
			}
			require.Equal(t, sum.PoolReservedAfterWarmupBytes, sum.PoolReservedFinalBytes, "the pool grew after warm-up")
		})
	}
}

func TestSolveReportsWrongBlocks(t *testing.T) {
	corruptHook = func(src int, id uint64, vals []float64) {
		if id == 17 {
			vals[len(vals)-1] += 1e-6
		}
	}
	t.Cleanup(func() { corruptHook = nil })
	for _, mode := range []string{"packed", "perblock"} {
		_, errOut, err := runSolve(t, config{backend: "host", policy: "retain", mode: mode, iters: 2, seed: 5, blocks: 40, json: true})
		require.ErrorContains(t, err, "verification failed: 2 block(s) wrong", mode)
		require.Contains(t, errOut, "rank 0: block 17 from rank 0", mode)
	}
}

func TestSolveBadFlags(t *testing.T) {
	_, _, err := runSolve(t, config{backend: "host", policy: "retain", mode: "sideways", iters: 1})
	require.ErrorContains(t, err, `-mode "sideways"`)
	_, _, err = runSolve(t, config{backend: "host", policy: "retain", iters: 0})
	require.ErrorContains(t, err, "-iters must be in [1, 10000000], got 0")
	_, _, err = runSolve(t, config{backend: "host", policy: "retain", iters: 1 << 62})
	require.ErrorContains(t, err, "-iters must be in [1, 10000000]")
	_, _, err = runSolve(t, config{backend: "host", policy: "retain", iters: 1, bonds: -1})
	require.ErrorContains(t, err, "-bonds must be in [1, 4096], got -1")
}

// rawSummary runs a solve and returns its -json line as parsed and as a map,
// to check the keys other programs read.
func rawSummary(t *testing.T, cfg config) (summary, map[string]any) {
	t.Helper()
	world, err := cluster.World()
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	require.NoError(t, run(cfg, world, &out, &errOut), errOut.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := []byte(lines[len(lines)-1])
	var sum summary
	var raw map[string]any
	require.NoError(t, json.Unmarshal(last, &sum))
	require.NoError(t, json.Unmarshal(last, &raw))
	require.Contains(t, out.String(), "solve phases (median, slowest rank)")
	return sum, raw
}

// TestSolvePlansOncePerLayout: a sweep over 4 bonds plans each bond's GEMMs
// at its first solve only; -fresh plans every solve; a sweep over more
// bonds than the solver keeps plans every solve too. The summary splits the
// solve into the six phases, by layout.
func TestSolvePlansOncePerLayout(t *testing.T) {
	sum, raw := rawSummary(t, config{backend: "host", policy: "retain", mode: "packed", iters: 20, seed: 3, blocks: 200, bonds: 4, json: true})
	require.Zero(t, sum.VerifyFailures)
	require.EqualValues(t, 4, sum.GemmPlansBuilt, "one rank, one destination group: one plan per bond")
	require.NotNil(t, sum.Repeated)
	require.NotNil(t, sum.FreshSolves)
	require.EqualValues(t, 16, sum.Repeated.Solves)
	require.EqualValues(t, 4, sum.FreshSolves.Solves)
	phases, ok := raw["phase_us"].(map[string]any)
	require.True(t, ok, "phase_us is an object: %v", raw["phase_us"])
	require.Len(t, phases, 6)
	for _, k := range []string{"alloc", "upload", "gemm_plan", "gemm", "exchange", "free"} {
		require.Contains(t, phases, k)
	}
	require.NotContains(t, raw, "device_us", "no device time on the host backend")
	require.NotContains(t, raw, "runtime_calls", "no runtime on the host backend")
	require.NotContains(t, raw, "runtime_calls_by_entry", "no runtime on the host backend")
	require.Equal(t, sum.PoolReservedAfterWarmupBytes, sum.PoolReservedFinalBytes, "the pool grew after the first sweep")
	require.GreaterOrEqual(t, sum.PoolReservedPeakBytes, sum.PoolReservedFinalBytes)

	sum, raw = rawSummary(t, config{backend: "host", policy: "retain", mode: "packed", iters: 6, seed: 3, blocks: 200, bonds: 2, fresh: true, json: true})
	require.Zero(t, sum.VerifyFailures)
	require.EqualValues(t, 6, sum.GemmPlansBuilt)
	require.Nil(t, raw["repeated"], "no repeated layout with -fresh")
	require.EqualValues(t, 6, sum.FreshSolves.Solves)
	// Each fresh layout's staged operands are freed after its solve, in
	// either mode (the allocator's close reports a leak).
	sum, _ = rawSummary(t, config{backend: "host", policy: "retain", mode: "perblock", iters: 3, seed: 3, blocks: 20, bonds: 2, fresh: true, json: true})
	require.Zero(t, sum.VerifyFailures)
	require.EqualValues(t, 3, sum.FreshSolves.Solves)

	sum, _ = rawSummary(t, config{backend: "host", policy: "retain", mode: "packed", iters: 2 * (maxCachedLayouts + 1), seed: 3, blocks: 20, bonds: maxCachedLayouts + 1, json: true})
	require.Zero(t, sum.VerifyFailures)
	require.EqualValues(t, 2*(maxCachedLayouts+1), sum.GemmPlansBuilt, "a sweep longer than the cache plans every solve")
}

func TestHistogramMedian(t *testing.T) {
	var h histogram
	require.True(t, math.IsNaN(h.quantile(0.5)))
	for _, v := range []float64{5, 1, 1000, 3, 4} {
		h.add(v)
	}
	require.InEpsilon(t, 4, h.quantile(0.5), 0.006)
	require.InEpsilon(t, 1, h.quantile(0), 0.006)
	require.InEpsilon(t, 1000, h.quantile(1), 0.006)
	h.add(-1) // ignored: no time
	require.EqualValues(t, 5, h.n)
}
