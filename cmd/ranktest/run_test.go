package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/distbuf/distbuf/cluster"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if err := cluster.Init(); err != nil {
		panic(err)
	}
	code := m.Run()
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
	require.ErrorContains(t, err, "-iters must be positive")
}
