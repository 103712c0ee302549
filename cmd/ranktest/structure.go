package main

import (
	"fmt"
	"math"
)

// The block structure of the sectors workload: a two-site H·psi of a U(1)
// spin-1/2 chain, block-sparse over the charge-conserving combinations.
// Left bond sectors are indexed ia, right ones ib, MPO sectors kw (an index
// in mpoSectors). The three steps (see sectorStructure) run through gemm
// on pooled operands; every rank derives the same structure from (seed,
// bond, m, ranks), so a receiver knows what each sender sends.

// psiBlock is a block (qa, s1, s2, qb) of the two-site wavefunction, Da x Db,
// with qb = qa + s1 + s2. H·psi has the same blocks.
type psiBlock struct{ ia, s1, s2, ib int }

// envBlock is a block of an environment: L (qa', qw, qa) with qa' = qa + qw,
// stored [w][a'][a] and multiplied as (Dw·Da') x Da; or R (qb', qw”, qb)
// with qb' = qb + qw”, stored [w”][b'][b], used as its Dw” slabs of
// Db' x Db.
type envBlock struct{ outer, kw, inner int }

// t1Block is L·psi for one L block and one psi block: (qw, qa', s1, s2, qb),
// stored [w][a'][b]: (Dw·Da') x Db in step 1, (Dw) x (Da'·Db) in step 2.
type t1Block struct {
	kw, iap, s1, s2, ib int
	l, psi              int // the product's L and psi blocks
}

// t2Block is the two-site MPO applied to T1: (qw”, qa', s1', s2', qb), stored
// [w”][a'][b]: (Dw”) x (Da'·Db) in step 2, Dw” slabs of Da' x Db in step 3.
// It goes to the owner of qb' = qb + qw”.
type t2Block struct {
	kw2, iap, s1p, s2p, ib int
	r, hpsi                int // the R block (qb', qw'', qb) and H·psi block its slabs meet
}

// product2 is one step-2 product: T2[t2] += Wc[wc] · T1[t1].
type product2 struct{ wc, t1, t2 int }

// sectorStructure is every block of one two-site solve and its products:
//
//  1. T1 = L·psi: one product per T1 block, (Dw·Da') x Da times Da x Db.
//  2. T2 = Wc·T1: product2, Dw” x Dw times Dw x (Da'·Db), several summed
//     into one T2 block.
//  3. HPsi += T2slab · Rslab^T for every slab w” of every T2 block: Da' x Db
//     times (Db' x Db)^T, several T2 blocks summed into one HPsi block.
//
// No data is permuted between the steps: a reshape or a slab is another
// layout over the same bytes.
type sectorStructure struct {
	seed        uint64
	m, bond     int
	ranks       int
	left, right bondSectors
	wc          []wcBlock
	psi         []psiBlock // the blocks of psi, and of H·psi
	l, r        []envBlock
	t1          []t1Block
	t2          []t2Block
	step2       []product2
	owner       []int // rank owning each right sector
	flops       float64
	// bigDim is the smallest sector dimension that counts as big: a block
	// between two big sectors is its own allocation.
	bigDim int
}

type psiKey struct{ ia, s1, s2 int }

// newSectorStructure builds the block structure at a bond for bond
// dimension m, distributed over ranks. bigBytes sets which blocks are
// allocated one by one (see bigDimFor).
func newSectorStructure(seed uint64, bond, m, ranks int, bigBytes int64) (*sectorStructure, error) {
	if ranks < 1 {
		return nil, fmt.Errorf("sectors: %d ranks", ranks)
	}
	left, err := sectorsFor(seed, bond, 0, m)
	if err != nil {
		return nil, err
	}
	right, err := sectorsFor(seed, bond, 1, m)
	if err != nil {
		return nil, err
	}
	s := &sectorStructure{seed: seed, m: m, bond: bond, ranks: ranks, left: left, right: right, wc: twoSiteBlocks(), bigDim: bigDimFor(bigBytes)}

	// psi: every (qa, s1, s2) whose qb = qa + s1 + s2 is a right sector.
	psiAt := map[psiKey]int{}
	for ia, qa := range left.q {
		for s1 := range 2 {
			for s2 := range 2 {
				ib := right.index(qa + siteCharge(s1) + siteCharge(s2))
				if ib < 0 {
					continue
				}
				psiAt[psiKey{ia, s1, s2}] = len(s.psi)
				s.psi = append(s.psi, psiBlock{ia, s1, s2, ib})
			}
		}
	}

	// T1 candidates: each psi block with each MPO sector whose qa' = qa + qw
	// is a left sector; kept when some product of step 2 uses it.
	type t2Key struct{ kw2, iap, s1p, s2p, ib int }
	t2At := map[t2Key]int{}
	lAt := map[envBlock]int{}
	rAt := map[envBlock]int{}
	for p, pb := range s.psi {
		for kw, sw := range mpoSectors {
			iap := left.index(left.q[pb.ia] + sw.q)
			if iap < 0 {
				continue
			}
			t1 := -1
			for w, wb := range s.wc {
				if wb.kw != kw || wb.s1 != pb.s1 || wb.s2 != pb.s2 {
					continue
				}
				qw2 := mpoSectors[wb.kw2].q
				ibp := right.index(right.q[pb.ib] + qw2)
				if ibp < 0 {
					continue
				}
				if t1 < 0 {
					le := envBlock{iap, kw, pb.ia}
					li, ok := lAt[le]
					if !ok {
						li = len(s.l)
						lAt[le] = li
						s.l = append(s.l, le)
					}
					t1 = len(s.t1)
					s.t1 = append(s.t1, t1Block{kw: kw, iap: iap, s1: pb.s1, s2: pb.s2, ib: pb.ib, l: li, psi: p})
				}
				k := t2Key{wb.kw2, iap, wb.s1p, wb.s2p, pb.ib}
				t2, ok := t2At[k]
				if !ok {
					re := envBlock{ibp, wb.kw2, pb.ib}
					ri, ok := rAt[re]
					if !ok {
						ri = len(s.r)
						rAt[re] = ri
						s.r = append(s.r, re)
					}
					h, ok := psiAt[psiKey{iap, wb.s1p, wb.s2p}]
					if !ok || s.psi[h].ib != ibp {
						return nil, fmt.Errorf("sectors: T2 block (%d, %d, %d, %d, %d) reaches no H·psi block: a charge rule is broken", k.kw2, k.iap, k.s1p, k.s2p, k.ib)
					}
					t2 = len(s.t2)
					t2At[k] = t2
					s.t2 = append(s.t2, t2Block{kw2: wb.kw2, iap: iap, s1p: wb.s1p, s2p: wb.s2p, ib: pb.ib, r: ri, hpsi: h})
				}
				s.step2 = append(s.step2, product2{wc: w, t1: t1, t2: t2})
			}
		}
	}
	s.owner = s.balance()
	return s, nil
}

// bigDimFor is the smallest sector dimension D with D*D float64s at least
// bigBytes: a block between two such sectors (a psi block, or Dw of them
// for an environment block) is at least bigBytes, and is allocated on its
// own from the pool; the others share their operand's tail buffer.
// bigBytes <= 0 makes every block part of the tail.
func bigDimFor(bigBytes int64) int {
	if bigBytes <= 0 {
		return math.MaxInt
	}
	return max(1, int(math.Ceil(math.Sqrt(float64(bigBytes)/8))))
}

// Dims of the blocks.
func (s *sectorStructure) da(ia int) int    { return s.left.dim[ia] }
func (s *sectorStructure) db(ib int) int    { return s.right.dim[ib] }
func dw(kw int) int                         { return len(mpoSectors[kw].states) }
func (s *sectorStructure) bigL(ia int) bool { return s.left.dim[ia] >= s.bigDim }
func (s *sectorStructure) bigR(ib int) bool { return s.right.dim[ib] >= s.bigDim }

// Big blocks: between two big sectors.
func (s *sectorStructure) psiBig(p int) bool { b := s.psi[p]; return s.bigL(b.ia) && s.bigR(b.ib) }
func (s *sectorStructure) lBig(i int) bool   { b := s.l[i]; return s.bigL(b.outer) && s.bigL(b.inner) }
func (s *sectorStructure) rBig(i int) bool   { b := s.r[i]; return s.bigR(b.outer) && s.bigR(b.inner) }

// t1Big: the T1 blocks of one big (qa', qb) pair share one allocation, so
// that every step-2 product into a T2 block reads one T1 buffer and one
// GEMM plan writes each T2 block whole.
func (s *sectorStructure) t1Big(t int) bool { b := s.t1[t]; return s.bigL(b.iap) && s.bigR(b.ib) }

// ownerOfT2 is the rank a T2 block goes to: the owner of its qb'.
func (s *sectorStructure) ownerOfT2(t int) int { return s.owner[s.r[s.t2[t].r].outer] }

// balance splits the right bond's sectors into one contiguous range of
// charges per rank, balanced by flops: the owner of qb computes steps 1
// and 2 for the psi blocks with that qb, the owner of qb' step 3 for the
// H·psi blocks with that qb'. A rank may own none (more ranks than
// sectors): it still takes part in every exchange.
func (s *sectorStructure) balance() []int {
	work := make([]float64, len(s.right.q))
	for _, t := range s.t1 {
		f := 2 * float64(dw(t.kw)*s.da(t.iap)) * float64(s.da(s.psi[t.psi].ia)) * float64(s.db(t.ib))
		work[t.ib] += f
		s.flops += f
	}
	for _, p := range s.step2 {
		t2 := s.t2[p.t2]
		f := 2 * float64(dw(t2.kw2)*dw(s.t1[p.t1].kw)) * float64(s.da(t2.iap)*s.db(t2.ib))
		work[t2.ib] += f
		s.flops += f
	}
	for _, t := range s.t2 {
		ibp := s.r[t.r].outer
		f := 2 * float64(dw(t.kw2)*s.da(t.iap)) * float64(s.db(t.ib)) * float64(s.db(ibp))
		work[ibp] += f
		s.flops += f
	}
	return partition(work, s.ranks)
}

// partition cuts work into ranks contiguous ranges (some may be empty)
// with the smallest possible largest sum, since the slowest rank sets the
// solve's pace, and among those the most even (least sum of squares), so
// that no rank idles while it could take a sector, and its memory, off
// another. It returns each item's range. The bound is found by bisection,
// each candidate checked by filling ranges greedily up to it; the even
// cut under it by dynamic programming over (ranges, items): the items are
// a bond's sectors, a few dozen.
func partition(work []float64, ranks int) []int {
	n := len(work)
	prefix := make([]float64, n+1)
	for i, w := range work {
		prefix[i+1] = prefix[i] + w
	}
	// A range's load is a difference of prefix sums, in the greedy fill as
	// in the cut below, so that a bound the fill meets the cut can meet.
	feasible := func(bound float64) bool {
		needed, start := 1, 0
		for i := range work {
			if i > start && prefix[i+1]-prefix[start] > bound {
				needed++
				start = i
			}
		}
		return needed <= ranks
	}
	lo, hi := 0.0, prefix[n]
	for _, w := range work {
		lo = max(lo, w)
	}
	lo = max(lo, prefix[n]/float64(ranks))
	for range 64 {
		if mid := (lo + hi) / 2; feasible(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	// cost[k][i]: the least sum of squares of k ranges holding items
	// 0..i-1, none above hi; from[k][i] where the k-th range starts. The
	// greedy fill under hi is one such cut, so cost[ranks][n] is finite.
	inf := math.Inf(1)
	cost := make([][]float64, ranks+1)
	from := make([][]int, ranks+1)
	for k := range cost {
		cost[k] = make([]float64, n+1)
		from[k] = make([]int, n+1)
		for i := range cost[k] {
			cost[k][i] = inf
		}
	}
	cost[0][0] = 0
	for k := 1; k <= ranks; k++ {
		for i := 0; i <= n; i++ {
			for j := i; j >= 0; j-- {
				load := prefix[i] - prefix[j]
				if load > hi && j < i-1 {
					break // a lone item is a range whatever its rounding, as in the fill
				}
				if c := cost[k-1][j] + load*load; c < cost[k][i] {
					cost[k][i], from[k][i] = c, j
				}
			}
		}
	}
	owner := make([]int, n)
	for k, i := ranks, n; k > 0; k-- {
		j := from[k][i]
		for x := j; x < i; x++ {
			owner[x] = k - 1
		}
		i = j
	}
	return owner
}
