package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/stretchr/testify/require"
)

// growRun runs a growing run of the maxm workload in this process and
// returns its -json summary.
func growRun(t *testing.T, cfg config) (growSummary, string) {
	t.Helper()
	if cfg.backend == "" {
		cfg.backend = "host"
	}
	cfg.json, cfg.workload = true, "maxm"
	if cfg.stepSolves == 0 {
		cfg.stepSolves = 2
	}
	if cfg.iters == 0 {
		cfg.iters = 20
	}
	world, err := cluster.World()
	require.NoError(t, err)
	var buf, errOut bytes.Buffer
	require.NoError(t, run(cfg, world, &buf, &errOut), errOut.String())
	out := buf.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum growSummary
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), out)
	return sum, out
}

// TestGrowingRunEndsAtTheDevicesLimit: on a host backend of 1 GiB the run
// grows m by 1.12 a step until an allocation fails, which is its normal end:
// no error, every completed step recorded, the out-of-memory report kept.
func TestGrowingRunEndsAtTheDevicesLimit(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "1GiB")
	sum, out := growRun(t, config{m: 512, growConfig: growConfig{grow: 1.12, probe: true}})
	require.True(t, sum.OK)
	require.Equal(t, "out of memory", sum.EndedBy)
	require.Contains(t, sum.EndedDetail, "rank 0: ")
	require.Contains(t, sum.EndedDetail, "devalloc: out of memory")
	require.Contains(t, sum.EndedDetail, "DISTBUF_HOST_MEMORY")
	require.EqualValues(t, 1<<30, sum.DeviceTotalBytes)
	require.Greater(t, len(sum.Steps), 5, out)
	mf := 512.0
	for i, s := range sum.Steps {
		require.Equal(t, int(mf), s.M, "m grows as maxm.cu's: a real number times 1.12, truncated")
		mf *= 1.12
		require.Len(t, s.SolveUS, 2, "two solves a step")
		require.LessOrEqual(t, s.WorkingSetBytes, int64(1<<30))
		require.GreaterOrEqual(t, s.ReservedPeakBytes, s.LivePeakBytes, "step %d", i)
		require.GreaterOrEqual(t, s.LivePeakBytes, s.WorkingSetBytes, "step %d: the tail's rounding and alignment only add", i)
		require.Positive(t, s.LargestAllocBytes)
	}
	last := sum.Steps[len(sum.Steps)-1]
	require.Equal(t, sum.MaxM, last.M)
	next, _ := anchorSizes(int(mf))
	var need int64
	for _, b := range next {
		need += b
	}
	require.Greater(t, need, int64(1<<30)-last.WorkingSetBytes/4, "the run stopped near the limit, not early")
	require.Contains(t, out, "largest m ")
}

// TestGrowingRunPolicies: Auto reaches the m of AggressiveFree. Retain
// reaches no further, and on the host pool less: the next step's smaller
// buffers are carved out of the segments it kept, which the out-of-memory
// ladder's trim then cannot release. AggressiveFree keeps nothing between
// steps, Retain keeps what it reserved, and Auto keeps it while the device
// has room.
func TestGrowingRunPolicies(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "1GiB")
	reach := map[string]int{}
	ends := map[string][]int64{}
	for _, p := range []string{"free", "retain", "auto"} {
		sum, _ := growRun(t, config{policy: p, m: 512, growConfig: growConfig{grow: 1.12}})
		require.Equal(t, p, sum.Policy)
		reach[p] = sum.MaxM
		for _, s := range sum.Steps {
			ends[p] = append(ends[p], s.ReservedEndBytes)
			require.EqualValues(t, -1, s.LargestAllocBytes, "not probed")
		}
	}
	t.Logf("largest m: %v", reach)
	require.GreaterOrEqual(t, reach["auto"], reach["free"], "auto must reach the m of free")
	require.Less(t, reach["retain"], reach["free"], "retained segments, carved into by the next step's buffers, cannot be trimmed")
	for _, r := range ends["free"] {
		require.Zero(t, r)
	}
	require.Positive(t, ends["retain"][len(ends["retain"])-1])
	require.Positive(t, ends["auto"][0], "auto keeps its memory while the device has room")
}

// TestTimeline: -timeline writes a header and memory samples of the run;
// benchplot -timeline draws them.
func TestTimeline(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "512MiB")
	path := filepath.Join(t.TempDir(), "run.timeline")
	sum, _ := growRun(t, config{m: 512, growConfig: growConfig{grow: 1.25, timeline: path}})
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var header timelineHeader
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &header))
	require.Equal(t, timelineHeader{Policy: "auto", Workload: "maxm", Device: "host memory (mmap pool, goroutine streams)", Ranks: 1}, header)
	require.Greater(t, len(lines), 3)
	var peak int64
	seen := map[int64]bool{}
	for _, l := range lines[1:] {
		var s timelineSample
		require.NoError(t, json.Unmarshal([]byte(l), &s), l)
		require.NotNil(t, s.PoolReserved, l)
		require.NotNil(t, s.DeviceTotal, l)
		require.EqualValues(t, 512<<20, *s.DeviceTotal)
		peak = max(peak, *s.PoolReserved)
		seen[s.M] = true
	}
	require.Positive(t, peak)
	require.LessOrEqual(t, peak, int64(512<<20))
	require.True(t, seen[int64(sum.Steps[0].M)], "samples name the step's m")
}

// TestFixedSteps: without -grow, -iters solves at -m, one step.
func TestFixedSteps(t *testing.T) {
	sum, _ := growRun(t, config{iters: 5, m: 300})
	require.Equal(t, "-iters", sum.EndedBy)
	require.Equal(t, 300, sum.MaxM)
	require.Len(t, sum.Steps, 1)
	require.Len(t, sum.Steps[0].SolveUS, 5)
	require.EqualValues(t, 1, sum.Grow)
}

func TestGrowFlags(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"-grow 1", "-grow 1: want a factor in (1, 16]"},
		{"-grow NaN", "-grow NaN"},
		{"-grow 1.1", "-grow needs a workload with a bond dimension: -workload sectors or maxm"},
		{"-workload maxm -m 0", "-m 0: want 1 to"},
		{"-workload dense", `-workload "dense": want synthetic, sectors or maxm`},
		{"-workload maxm -step-solves 0", "-step-solves 0"},
		{"-ballast-free 0", "want a positive size"},
		{"-ballast-free lots", "ballast-free"},
	} {
		_, err := parseFlags(strings.Fields(tc.args), &strings.Builder{})
		require.ErrorContains(t, err, tc.want, tc.args)
	}
	cfg, err := parseFlags(strings.Fields("-workload maxm -m 2048 -grow 1.12 -ballast-free 24GiB"), &strings.Builder{})
	require.NoError(t, err)
	require.Equal(t, 2048, cfg.m)
	require.EqualValues(t, 24<<30, cfg.ballastFree)

	_, _, err = runSolve(t, config{backend: "host", iters: 1, workload: "maxm", m: 64, growConfig: growConfig{ballastFree: 1 << 30, stepSolves: 2}})
	require.ErrorContains(t, err, "-ballast-free: the host backend has no device to fill")
}

// TestJobGrowingRunEndsTogether: two ranks grow m together; rank 1's device
// is smaller and fills first; both ranks stop after the same step and the
// job ends with status 0, naming rank 1's out-of-memory.
func TestJobGrowingRunEndsTogether(t *testing.T) {
	bin, flags := buildMPIRanktest(t)
	run := []string{bin, "-backend", "host", "-workload", "maxm", "-m", "512", "-grow", "1.12", "-json"}
	args := append(append([]string(nil), flags...), "-n", "1", "-x", "DISTBUF_HOST_MEMORY=2GiB")
	args = append(append(args, run...), ":", "-n", "1", "-x", "DISTBUF_HOST_MEMORY=400MiB")
	args = append(args, run...)
	out, code, _ := runJob(t, 120*time.Second, args...)
	require.Zero(t, code, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum growSummary
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), out)
	require.Equal(t, 2, sum.Ranks)
	require.Equal(t, "out of memory", sum.EndedBy)
	require.Contains(t, sum.EndedDetail, "rank 1: ", out)
	require.Contains(t, sum.EndedDetail, "devalloc: out of memory", out)
	require.Less(t, sum.Steps[len(sum.Steps)-1].WorkingSetBytes/2, int64(400<<20), "the smaller device set the end")
}

// TestGrowingSectorsRun: the sectors solve grows until a 96 MiB host
// device is full, every H·psi block right at every step; auto reaches the
// m of free.
func TestGrowingSectorsRun(t *testing.T) {
	t.Setenv("DISTBUF_HOST_MEMORY", "96MiB")
	reach := map[string]int{}
	for _, p := range []string{"free", "auto"} {
		cfg := config{backend: "host", policy: p, json: true, iters: 1, workload: "sectors", m: 64, bigBlock: 64 << 10, growConfig: growConfig{grow: 1.25, stepSolves: 2}}
		world, err := cluster.World()
		require.NoError(t, err)
		var buf, errOut bytes.Buffer
		require.NoError(t, run(cfg, world, &buf, &errOut), errOut.String())
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		var sum growSummary
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), buf.String())
		require.True(t, sum.OK, buf.String())
		require.Zero(t, sum.VerifyFailures)
		require.Equal(t, "sectors", sum.Workload)
		require.Equal(t, "out of memory", sum.EndedBy, buf.String())
		require.Greater(t, len(sum.Steps), 3, buf.String())
		for _, s := range sum.Steps {
			require.Positive(t, s.WorkingSetBytes)
			require.LessOrEqual(t, s.WorkingSetBytes, int64(96<<20))
		}
		reach[p] = sum.MaxM
	}
	t.Logf("largest m: %v", reach)
	require.GreaterOrEqual(t, reach["auto"], reach["free"])
}
