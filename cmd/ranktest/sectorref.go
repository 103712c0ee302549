package main

import (
	"fmt"
	"math"
	"slices"
)

// The check of the sectors workload is Freivalds': each H·psi block a rank
// owns is multiplied by a fixed vector v (probeValues, one per qb' sector)
// on the host, y = HPsi·v, and compared with the same product carried
// through the chain on the host with matrix-vector products only, right
// to left: z = Rslab^T·v, then Wc, then psi·, then L·. That costs the
// elements of the blocks on each path, where a dense reference would cost
// O(m^3); and each row of each block is checked, so a wrong element, a
// missing contribution or a block from the wrong place shows.
//
// The tolerance is the standard bound on rounding in sums of products,
// |fl(x) - x| <= n u sum|terms|, with u = 2^-53 and n the longest chain
// of additions an element sees (the inner dimensions of the three steps
// and of the check, plus their accumulations): the reference carries the
// same chain on absolute values (yAbs) for the sum of |terms|, and the
// bound is taken four times over for the device, the reference and the
// check, whatever order or fused multiply-adds each sums in. An element
// off by delta moves its row's y by at least delta/2 (v >= 1/2), which
// passes only when below that bound: a relative 1e-13 or so of the row's
// sum of |terms| at the default m.

// hpsiRef is the check of one H·psi block this rank owns.
type hpsiRef struct {
	psi     int       // the block, an index in sectorStructure.psi
	y, yAbs []float64 // H·psi·v without alpha, and the chain on |values|
}

// roundingDepth is n of the bound: the inner dimensions of steps 1 to 3
// and of the check (Da, Dw, Db, Db'), the terms a T2 block sums (at most
// the two-site MPO's blocks) and those an H·psi block sums (every slab of
// up to three T2 blocks from each of up to three sources), with margin.
func (s *sectorStructure) roundingDepth() int {
	return slices.Max(s.left.dim) + 2*slices.Max(s.right.dim) + 2*mpoDim + len(s.wc) + 64
}

// references computes the check of every H·psi block rank owns: the
// products of step 2 whose T2 block goes to rank, grouped by qa' (each
// group writes its own H·psi blocks), in parallel.
func (s *sectorStructure) references(rank int) ([]*hpsiRef, error) {
	probes := map[int][]float64{}
	var refs []*hpsiRef
	byPsi := map[int]*hpsiRef{}
	for p, b := range s.psi {
		if s.owner[b.ib] != rank {
			continue
		}
		if probes[b.ib] == nil {
			probes[b.ib] = make([]float64, s.db(b.ib))
			s.probeValues(probes[b.ib], b.ib)
		}
		r := &hpsiRef{psi: p, y: make([]float64, s.da(b.ia)), yAbs: make([]float64, s.da(b.ia))}
		refs = append(refs, r)
		byPsi[p] = r
	}
	// z = Rslab^T v for every slab of every R block this rank holds.
	type zvec struct{ z, zAbs []float64 } // [w''][b]
	zs := make([]zvec, len(s.r))
	var held []int
	for i, e := range s.r {
		if s.owner[e.outer] == rank {
			held = append(held, i)
		}
	}
	err := parallel(len(held), func(k int) error {
		i := held[k]
		e := s.r[i]
		nw, dbp, db := dw(e.kw), s.db(e.outer), s.db(e.inner)
		vals := make([]float64, nw*dbp*db)
		fillValues(vals, s.rKey(i), 0)
		v := probes[e.outer]
		z, zAbs := make([]float64, nw*db), make([]float64, nw*db)
		for w := range nw {
			for bp := range dbp {
				row := vals[(w*dbp+bp)*db : (w*dbp+bp+1)*db]
				for b, x := range row {
					z[w*db+b] += x * v[bp]
					zAbs[w*db+b] += math.Abs(x) * v[bp]
				}
			}
		}
		zs[i] = zvec{z, zAbs}
		return nil
	})
	if err != nil {
		return nil, err
	}
	groups := map[int][]product2{}
	var order []int
	for _, p := range s.step2 {
		if s.ownerOfT2(p.t2) != rank {
			continue
		}
		iap := s.t2[p.t2].iap
		if groups[iap] == nil {
			order = append(order, iap)
		}
		groups[iap] = append(groups[iap], p)
	}
	err = parallel(len(order), func(k int) error {
		lvals, pvals := map[int][]float64{}, map[int][]float64{}
		get := func(cache map[int][]float64, i, n int, key uint64) []float64 {
			if v, ok := cache[i]; ok {
				return v
			}
			v := make([]float64, n)
			fillValues(v, key, 0)
			cache[i] = v
			return v
		}
		var t, tAbs, u, uAbs []float64
		for _, p := range groups[order[k]] {
			t1, t2, wc := s.t1[p.t1], s.t2[p.t2], s.wc[p.wc]
			ref := byPsi[t2.hpsi]
			if ref == nil {
				return fmt.Errorf("sectors: T2 block %d comes to rank %d, which does not own its H·psi block", p.t2, rank)
			}
			da, dap, db := s.da(s.psi[t1.psi].ia), s.da(t1.iap), s.db(t1.ib)
			nw, nw2 := dw(t1.kw), dw(t2.kw2)
			psi := get(pvals, t1.psi, da*db, s.psiKey(t1.psi))
			l := get(lvals, t1.l, nw*dap*da, s.lKey(t1.l))
			z := zs[t2.r]
			t, tAbs = resize(t, db), resize(tAbs, db)
			u, uAbs = resize(u, da), resize(uAbs, da)
			for w := range nw {
				// t = sum over w'' of Wc[w''][w] z[w'']: what T1's slab w
				// meets on its way to H·psi·v.
				clear(t)
				clear(tAbs)
				for w2 := range nw2 {
					c := wc.vals[w2*nw+w]
					if c == 0 {
						continue
					}
					for b := range db {
						t[b] += c * z.z[w2*db+b]
						tAbs[b] += math.Abs(c) * z.zAbs[w2*db+b]
					}
				}
				// u = psi t, then y += L[w] u.
				for a := range da {
					row := psi[a*db : (a+1)*db]
					var sum, sumAbs float64
					for b, x := range row {
						sum += x * t[b]
						sumAbs += math.Abs(x) * tAbs[b]
					}
					u[a], uAbs[a] = sum, sumAbs
				}
				for ap := range dap {
					row := l[(w*dap+ap)*da : (w*dap+ap+1)*da]
					var sum, sumAbs float64
					for a, x := range row {
						sum += x * u[a]
						sumAbs += math.Abs(x) * uAbs[a]
					}
					ref.y[ap] += sum
					ref.yAbs[ap] += sumAbs
				}
			}
		}
		return nil
	})
	return refs, err
}

func resize(v []float64, n int) []float64 {
	if cap(v) < n {
		return make([]float64, n)
	}
	return v[:n]
}

// checkBlock compares got, the H·psi block of ref as the solve left it
// (Da' x Db', row-major), with alpha times the reference through the
// probe v; it returns nil or what is wrong.
func (s *sectorStructure) checkBlock(ref *hpsiRef, got, v []float64, alpha float64) error {
	b := s.psi[ref.psi]
	rows, cols := s.da(b.ia), s.db(b.ib)
	if len(got) != rows*cols {
		return fmt.Errorf("has %d elements, want %dx%d", len(got), rows, cols)
	}
	n := float64(s.roundingDepth())
	const u = 0x1p-53
	for i := range rows {
		var y float64
		for j, x := range got[i*cols : (i+1)*cols] {
			y += x * v[j]
		}
		want := alpha * ref.y[i]
		tol := 4 * n * u * math.Abs(alpha) * ref.yAbs[i]
		// NaN fails too: the comparison is false.
		if !(math.Abs(y-want) <= tol) {
			return fmt.Errorf("row %d: H·psi·v is %.17g, want %.17g (tolerance %.3g)", i, y, want, tol)
		}
	}
	return nil
}

// describePsi names an H·psi block by its charges.
func (s *sectorStructure) describePsi(p int) string {
	b := s.psi[p]
	return fmt.Sprintf("(qa' %d, s1' %+d, s2' %+d, qb' %d) (%dx%d)", s.left.q[b.ia], siteCharge(b.s1), siteCharge(b.s2), s.right.q[b.ib], s.da(b.ia), s.db(b.ib))
}
