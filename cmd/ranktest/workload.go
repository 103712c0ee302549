package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/distbuf/distbuf/packing"
)

// blockSpec is one contraction of a rank's synthetic solve: C (m x n) =
// alpha * A (m x k) * B (k x n), after which C goes to rank dest.
type blockSpec struct {
	m, k, n int
	dest    int
}

// workloadShape sets the synthetic sector spectrum: a DMRG two-site solve
// at moderate bond dimension has a few large symmetry blocks and thousands
// of tiny ones.
type workloadShape struct {
	blocks    int     // blocks per rank
	largeFrac float64 // fraction of large blocks
	largeMin  int     // large block dimensions, uniform in [largeMin, largeMax]
	largeMax  int
	tinyMax   int // tiny block dimensions, uniform in [1, tinyMax]
}

var defaultShape = workloadShape{blocks: 2000, largeFrac: 0.01, largeMin: 24, largeMax: 64, tinyMax: 8}

// defaultM is the sectors workload's bond dimension unless -m says
// otherwise: a solve of a few milliseconds for four ranks on two cores.
const defaultM = 256

// The sweep: defaultBonds bonds unless -bonds says otherwise, at most
// maxBonds (each keeps its block lists and references for the run).
const (
	defaultBonds = 4
	maxBonds     = 4096
)

// bondSeed mixes the bond into the seed: each bond of the sweep has its own
// block structure, and bond 0 the structure a one-bond run always had.
func bondSeed(seed uint64, bond int) uint64 { return seed + uint64(bond)*0x9e3779b97f4a7c15 }

// specsFor is the block list of rank src at one bond, the same on every
// rank: a receiver regenerates the sender's operands from it to check the
// results.
func specsFor(seed uint64, bond, src, size int, sh workloadShape) []blockSpec {
	rng := rand.New(rand.NewPCG(bondSeed(seed, bond), uint64(src)+1))
	out := make([]blockSpec, sh.blocks)
	for i := range out {
		dim := func() int { return 1 + rng.IntN(sh.tinyMax) }
		if rng.Float64() < sh.largeFrac {
			dim = func() int { return sh.largeMin + rng.IntN(sh.largeMax-sh.largeMin+1) }
		}
		out[i] = blockSpec{m: dim(), k: dim(), n: dim(), dest: rng.IntN(size)}
	}
	return out
}

// operand fills dst with the values of operand which (0: A, 1: B) of block
// id of rank src at a bond: a cheap hash, so any rank can regenerate any
// block.
func operand(dst []float64, seed uint64, bond, src int, id uint64, which int) {
	h := bondSeed(seed, bond)*0x9e3779b97f4a7c15 ^ uint64(src)<<48 ^ id<<8 ^ uint64(which)
	for i := range dst {
		x := h + uint64(i)*0xbf58476d1ce4e5b9
		x ^= x >> 31
		x *= 0x94d049bb133111eb
		x ^= x >> 29
		dst[i] = float64(x%2001)/1000 - 1 // in [-1, 1], exact in binary to 1e-3 steps
	}
}

// reference computes A*B for block id of rank src at a bond by the
// textbook triple loop.
func reference(seed uint64, bond, src int, id uint64, sp blockSpec) []float64 {
	a := make([]float64, sp.m*sp.k)
	b := make([]float64, sp.k*sp.n)
	operand(a, seed, bond, src, id, 0)
	operand(b, seed, bond, src, id, 1)
	c := make([]float64, sp.m*sp.n)
	for i := range sp.m {
		for j := range sp.n {
			var sum float64
			for l := range sp.k {
				sum += a[i*sp.k+l] * b[l*sp.n+j]
			}
			c[i*sp.n+j] = sum
		}
	}
	return c
}

// alphaFor varies the scale from solve to solve, so a stale result from an
// earlier iteration cannot pass verification.
func alphaFor(iter int) float64 { return float64(1 + iter%7) }

// operandDescs are the descriptors of a rank's blocks at one bond: A
// (m x k) and B (k x n) as the two groups of one list (A's blocks bound for
// group 0, B's for group 1, their ids counting on from A's), C (m x n)
// bound for its destination. They are the block structure a solver holds;
// laying them out is what a solve on a fresh layout pays for.
type operandDescs struct{ ab, c []packing.Desc }

func descsOf(specs []blockSpec) operandDescs {
	n := len(specs)
	d := operandDescs{make([]packing.Desc, 2*n), make([]packing.Desc, n)}
	for i, sp := range specs {
		id := uint64(i)
		d.ab[i] = packing.Desc{ID: id, DType: packing.Float64, Rows: sp.m, Cols: sp.k, Dest: 0}
		d.ab[n+i] = packing.Desc{ID: uint64(n) + id, DType: packing.Float64, Rows: sp.k, Cols: sp.n, Dest: 1}
		d.c[i] = packing.Desc{ID: id, DType: packing.Float64, Rows: sp.m, Cols: sp.n, Dest: sp.dest}
	}
	return d
}

// plans lays out A and B in one buffer (the parts of a joined plan, so
// that a solve moves both to the device with one allocation and one copy)
// and C (one buffer per destination).
func (d operandDescs) plans() (ab, c *packing.Plan, err error) {
	two, err := packing.NewPlan(d.ab, packing.Options{})
	if err != nil {
		return nil, nil, err
	}
	if ab, err = two.Joined(nil); err != nil {
		return nil, nil, err
	}
	c, err = packing.NewPlan(d.c, packing.Options{})
	return ab, c, err
}

// verifyBlock compares a received block with alpha times the reference.
func verifyBlock(got []float64, want []float64, alpha float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("has %d elements, want %d", len(got), len(want))
	}
	for i := range got {
		w := alpha * want[i]
		if d := math.Abs(got[i] - w); d > 1e-12*math.Max(1, math.Abs(w))*8 {
			return fmt.Errorf("element %d is %v, want %v", i, got[i], w)
		}
	}
	return nil
}
