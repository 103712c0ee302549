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

// references computes the check of every H·psi block rank owns, in
// parallel over qa' (each qa' writes its own H·psi blocks). The operands
// are regenerated row by row as the products need them, each element once
// per T1 block, so the memory stays a few rows per worker at any m.
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
		v := probes[e.outer]
		z, zAbs, row := make([]float64, nw*db), make([]float64, nw*db), make([]float64, db)
		key := s.rKey(i)
		for w := range nw {
			for bp := range dbp {
				fillValues(row, key, (w*dbp+bp)*db)
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
	// The products of step 2 whose T2 block comes to this rank, by qa',
	// each qa's in T1 order (the products of one T1 block together).
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
	for _, g := range groups {
		slices.SortStableFunc(g, func(a, b product2) int { return a.t1 - b.t1 })
	}
	err = parallel(len(order), func(k int) error {
		var t, tAbs, u, uAbs, row, rowAbs []float64
		prods := groups[order[k]]
		for i := 0; i < len(prods); {
			j := i
			for j < len(prods) && prods[j].t1 == prods[i].t1 {
				j++
			}
			run := prods[i:j]
			i = j
			t1 := s.t1[run[0].t1]
			da, dap, db, nw := s.da(s.psi[t1.psi].ia), s.da(t1.iap), s.db(t1.ib), dw(t1.kw)
			n := len(run) * nw // one vector per product and slab w of T1
			t, tAbs = resize(t, n*db), resize(tAbs, n*db)
			u, uAbs = resize(u, n*da), resize(uAbs, n*da)
			clear(t)
			clear(tAbs)
			// t[p][w] = sum over w'' of Wc_p[w''][w] z_p[w'']: what T1's
			// slab w meets on its way to H·psi·v through product p.
			for p, pr := range run {
				t2, wc, z := s.t2[pr.t2], s.wc[pr.wc], zs[s.t2[pr.t2].r]
				if byPsi[t2.hpsi] == nil {
					return fmt.Errorf("sectors: T2 block %d comes to rank %d, which does not own its H·psi block", pr.t2, rank)
				}
				for w := range nw {
					tv, ta := t[(p*nw+w)*db:][:db], tAbs[(p*nw+w)*db:][:db]
					for w2 := range dw(t2.kw2) {
						c := wc.vals[w2*nw+w]
						if c == 0 {
							continue
						}
						for b := range db {
							tv[b] += c * z.z[w2*db+b]
							ta[b] += math.Abs(c) * z.zAbs[w2*db+b]
						}
					}
				}
			}
			// u = psi t, one row of psi at a time.
			row, rowAbs = resize(row, max(da, db)), resize(rowAbs, max(da, db))
			key := s.psiKey(t1.psi)
			for a := range da {
				r, ra := row[:db], rowAbs[:db]
				fillValues(r, key, a*db)
				for b, x := range r {
					ra[b] = math.Abs(x)
				}
				for q := range n {
					u[q*da+a] = dot(r, t[q*db:][:db])
					uAbs[q*da+a] = dot(ra, tAbs[q*db:][:db])
				}
			}
			// y_p += L[w] u[p][w], one row of L at a time.
			key = s.lKey(t1.l)
			for w := range nw {
				for ap := range dap {
					r, ra := row[:da], rowAbs[:da]
					fillValues(r, key, (w*dap+ap)*da)
					for a, x := range r {
						ra[a] = math.Abs(x)
					}
					for p, pr := range run {
						ref := byPsi[s.t2[pr.t2].hpsi]
						q := p*nw + w
						ref.y[ap] += dot(r, u[q*da:][:da])
						ref.yAbs[ap] += dot(ra, uAbs[q*da:][:da])
					}
				}
			}
		}
		return nil
	})
	return refs, err
}

func dot(a, b []float64) float64 {
	var s float64
	for i, x := range a {
		s += x * b[i]
	}
	return s
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
