package main

import (
	"errors"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

func sectorsConfig(m, iters, bonds int) config {
	return config{backend: "host", policy: "retain", workload: "sectors", m: m, iters: iters, seed: 5, bonds: bonds, bigBlock: 1 << 20, json: true}
}

// TestSectorsSolve: the sectors workload on one rank, two bonds: every
// H·psi block right, each structure planned at its first solve only, and
// the summary says which workload at which m.
func TestSectorsSolve(t *testing.T) {
	sum, raw := rawSummary(t, sectorsConfig(64, 8, 2))
	require.True(t, sum.OK)
	require.Zero(t, sum.VerifyFailures)
	require.Equal(t, "sectors", sum.Workload)
	require.Equal(t, 64, sum.M)
	require.Zero(t, sum.Blocks)
	require.EqualValues(t, 2, sum.FreshSolves.Solves)
	require.EqualValues(t, 6, sum.Repeated.Solves)
	require.Positive(t, sum.WorkingSetBytes)
	require.NotNil(t, sum.Structure)
	require.Equal(t, 64, sumInts(sum.Structure.LeftSectors))
	require.Equal(t, 64, sumInts(sum.Structure.RightSectors))
	require.Positive(t, sum.Structure.PsiBlocks)
	require.Contains(t, raw, "structure")
	require.Equal(t, sum.PoolReservedAfterWarmupBytes, sum.PoolReservedFinalBytes, "the pool grew after the first sweep")

	// The GEMM plans are made at each structure's first solve.
	short, _ := rawSummary(t, sectorsConfig(64, 2, 2))
	require.Zero(t, short.VerifyFailures)
	require.Equal(t, short.GemmPlansBuilt, sum.GemmPlansBuilt, "solves on a known structure plan nothing")
	require.Positive(t, sum.GemmPlansBuilt)

	// -fresh plans every solve.
	cfg := sectorsConfig(64, 4, 2)
	cfg.fresh = true
	fresh, raw := rawSummary(t, cfg)
	require.Zero(t, fresh.VerifyFailures)
	require.EqualValues(t, 2*short.GemmPlansBuilt, fresh.GemmPlansBuilt)
	require.Nil(t, raw["repeated"])

	// The synthetic workload says so, without m.
	_, raw = rawSummary(t, config{backend: "host", policy: "retain", mode: "packed", iters: 2, seed: 3, blocks: 50, bonds: 1, json: true})
	require.Equal(t, "synthetic", raw["workload"])
	require.NotContains(t, raw, "m")
	require.NotContains(t, raw, "structure")
	require.Positive(t, raw["working_set_bytes"])
}

func sumInts(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

// TestSectorsBigBlocks: with a threshold that makes the central sectors
// big, their blocks are allocations of their own (more allocator calls
// and GEMM launches a solve), and the results are still right.
func TestSectorsBigBlocks(t *testing.T) {
	st, err := newSectorStructure(5, 0, 96, 1, 2<<10)
	require.NoError(t, err)
	l, err := newSectorLayout(st, 0)
	require.NoError(t, err)
	require.Greater(t, l.bigs, 4, "big sectors at D >= %d: %v", st.bigDim, st.left.dim)
	require.Less(t, len(l.inputs), len(st.l)+len(st.psi)+len(st.r), "the small blocks stay in the tails")

	cfg := sectorsConfig(96, 4, 1)
	tail, _ := rawSummary(t, cfg)
	cfg.bigBlock = 2 << 10
	big, _ := rawSummary(t, cfg)
	require.Zero(t, big.VerifyFailures)
	require.Greater(t, big.AllocCalls, tail.AllocCalls+4*4, "one allocation per big block or T1 pair, every solve")
	require.Greater(t, big.GemmLaunches, tail.GemmLaunches)
	require.Equal(t, tail.Structure.Products, big.Structure.Products, "the same products")
}

// TestSectorsReportsWrongBlocks: one element of one H·psi block damaged
// before the check makes the run fail, naming the block.
func TestSectorsReportsWrongBlocks(t *testing.T) {
	corruptHook = func(src int, id uint64, vals []float64) {
		if id == 5 {
			vals[len(vals)/2] += 1e-7
		}
	}
	t.Cleanup(func() { corruptHook = nil })
	_, errOut, err := runSolve(t, sectorsConfig(48, 2, 1))
	require.ErrorContains(t, err, "verification failed: 2 block(s) wrong")
	require.Contains(t, errOut, "rank 0: H·psi block 5 (qa'")
}

func newSectorsSolver(t *testing.T, cfg config) (*solver, *devalloc.Allocator) {
	t.Helper()
	world, err := cluster.World()
	require.NoError(t, err)
	a, err := openAllocator(cfg)
	require.NoError(t, err)
	sv, err := newSolver(cfg, world, a)
	require.NoError(t, err)
	return sv, a
}

// TestSectorsSolveInterface: solveSectors plans a structure the first time
// it meets (m, bond), reuses it after, and plans again once dropped.
func TestSectorsSolveInterface(t *testing.T) {
	sv, a := newSectorsSolver(t, sectorsConfig(32, 1, 1))
	for i, step := range []struct {
		m, bond int
		drop    bool
		fresh   bool
	}{{32, 0, false, true}, {32, 0, false, false}, {40, 0, false, true}, {32, 0, true, false}, {32, 0, false, true}, {40, 1, false, true}} {
		st, err := sv.solveSectors(i, step.m, step.bond)
		require.NoError(t, err, "step %d", i)
		require.Equal(t, step.fresh, st.fresh, "step %d", i)
		require.Zero(t, st.verifyFailures, st.firstFailure)
		require.Positive(t, st.workingSet)
		require.Positive(t, st.solveUS)
		if step.drop {
			require.NoError(t, sv.dropSectors(step.m, step.bond))
			require.NoError(t, sv.dropSectors(step.m, step.bond), "dropping twice is no error")
		}
	}
	require.NoError(t, sv.close())
	require.NoError(t, a.Close())
}

// TestSectorsOutOfMemory: under a budget the solve at a large m cannot fit
// returns an error matching distbuf.ErrOutOfMemory with everything it
// allocated freed; a smaller m then runs, and nothing leaks.
func TestSectorsOutOfMemory(t *testing.T) {
	t.Setenv("DISTBUF_ALLOC_CONF", "limit:256KiB")
	cfg := sectorsConfig(64, 1, 1)
	cfg.policy = ""
	sv, a := newSectorsSolver(t, cfg)
	require.EqualValues(t, 256<<10, a.Info().Limit)
	for _, m := range []int{512, 160} {
		st, err := sv.solveSectors(0, m, 0)
		require.ErrorIs(t, err, distbuf.ErrOutOfMemory, "m %d", m)
		var oom *devalloc.OutOfMemoryError
		require.True(t, errors.As(err, &oom), "the allocator's report: %v", err)
		require.Zero(t, a.Stats().LiveBuffers, "m %d: the solve freed what it allocated, and its layout", m)
		require.Empty(t, sv.sectorLayouts)
		require.Positive(t, st.allocCalls+1)
	}
	st, err := sv.solveSectors(1, 24, 0)
	require.NoError(t, err, "a small m fits")
	require.Zero(t, st.verifyFailures)
	require.Less(t, st.workingSet, int64(256<<10))
	require.NoError(t, sv.close())
	require.NoError(t, a.Close(), "no leak")
}

func TestSectorsBadFlags(t *testing.T) {
	cfg := sectorsConfig(64, 1, 1)
	cfg.mode = "perblock"
	_, _, err := runSolve(t, cfg)
	require.ErrorContains(t, err, "the sectors workload runs packed only")
	cfg = sectorsConfig(0, 1, 1)
	_, _, err = runSolve(t, cfg)
	require.ErrorContains(t, err, "-m must be in [1, 1048576], got 0")
	cfg = sectorsConfig(64, 1, 1)
	cfg.workload = "random"
	_, _, err = runSolve(t, cfg)
	require.ErrorContains(t, err, `-workload "random"`)
}

// TestSectorsWorkingSet: T1 goes once step 2 has read it and the sent T2
// once the exchange is over, H·psi comes after it, so the solve never
// holds all its buffers at once: its peak is the inputs, T2 and the
// largest of T1, the received T2 and H·psi, not their sum.
func TestSectorsWorkingSet(t *testing.T) {
	sv, a := newSectorsSolver(t, sectorsConfig(64, 1, 1))
	st, err := sv.solveSectors(0, 64, 0)
	require.NoError(t, err)
	l := sv.sectorLayouts[sectorKey{64, 0}]
	require.NotNil(t, l)
	bytesOf := func(specs []allocSpec) int64 {
		var n int64
		for _, s := range specs {
			n += s.plan.Groups()[0].Bytes
		}
		return n
	}
	in := l.inTail.Groups()[0].Bytes + bytesOf(l.inputs)
	t1, h, t2 := bytesOf(l.t1), bytesOf(l.hpsi), l.t2Joined.Groups()[0].Bytes
	require.Positive(t, t1)
	require.Positive(t, h)
	require.GreaterOrEqual(t, st.workingSet, in+t1+t2, "inputs, T1 and T2 are live together before the exchange")
	require.LessOrEqual(t, st.workingSet, in+t2+max(t1, t2, h), "T1 freed before the exchange, H·psi allocated after it (received T2: at most the sent one, on one rank)")
	require.NoError(t, sv.close())
	require.NoError(t, a.Close())
}
