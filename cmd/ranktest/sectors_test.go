package main

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSectorsSumToMAndFollowTheChargeRules(t *testing.T) {
	ms := []int{1, 2, 3, 4, 5, 7, 10, 33, 64, 100, 256, 999, 1000, 4096, 10000, 40000, 123457}
	for m := 1; m <= 300; m++ {
		ms = append(ms, m)
	}
	for _, m := range ms {
		for bond := range 3 {
			for side := range 2 {
				b, err := sectorsFor(7, bond, side, m)
				require.NoError(t, err)
				require.Equal(t, m, b.m(), "m %d bond %d side %d: %v", m, bond, side, b)
				require.NotEmpty(t, b.q)
				require.LessOrEqual(t, len(b.q), m)
				for i, q := range b.q {
					require.Equal(t, bond&1, abs(q)%2, "m %d: charge %d of the wrong parity at bond %d", m, q, bond)
					require.GreaterOrEqual(t, b.dim[i], 1, "m %d: sector %d", m, q)
					if i > 0 {
						require.Equal(t, b.q[i-1]+2, q, "m %d: charges in steps of 2: %v", m, b.q)
					}
					require.Equal(t, i, b.index(q))
				}
				require.Equal(t, -1, b.index(b.q[0]-2))
				require.Equal(t, -1, b.index(b.q[len(b.q)-1]+2))
				require.Equal(t, -1, b.index(b.q[0]+1), "another parity")
			}
		}
	}
}

func TestSectorsAreGaussianLikeAndDeterministic(t *testing.T) {
	b, err := sectorsFor(1, 0, 0, 1000)
	require.NoError(t, err)
	again, err := sectorsFor(1, 0, 0, 1000)
	require.NoError(t, err)
	require.Equal(t, b, again, "the same seed, bond, side and m give the same sectors")
	other, err := sectorsFor(1, 2, 0, 1000)
	require.NoError(t, err)
	require.NotEqual(t, b.dim, other.dim, "another bond, another jitter")
	right, err := sectorsFor(1, 0, 1, 1000)
	require.NoError(t, err)
	require.NotEqual(t, b.dim, right.dim, "the two sides differ")

	// A Heisenberg chain at m ~ 1000 keeps 15 to 25 sectors; the outer
	// ones are tiny and the largest sits at the centre.
	require.GreaterOrEqual(t, len(b.q), 15, "%v", b)
	require.LessOrEqual(t, len(b.q), 25, "%v", b)
	require.LessOrEqual(t, b.dim[0], 3, "%v", b)
	require.LessOrEqual(t, b.dim[len(b.dim)-1], 3, "%v", b)
	centre := b.q[slices.Index(b.dim, slices.Max(b.dim))]
	require.LessOrEqual(t, abs(centre), 2, "the largest sector at %d: %v", centre, b)
	// Falling off like a Gaussian: each step out from the centre roughly
	// at most the ratio of exp(-q^2/2 sigma^2) with the jitter's room.
	sigma := sectorSigma(1000)
	for i := range b.q {
		want := 1000 * 2 / (sigma * math.Sqrt(2*math.Pi)) * math.Exp(-float64(b.q[i]*b.q[i])/(2*sigma*sigma))
		require.InDelta(t, want, float64(b.dim[i]), 0.2*want+2, "sector %d of %v", b.q[i], b)
	}

	// The number of sectors grows slowly with m, and the tail stays tiny.
	prev := 0
	for _, m := range []int{64, 256, 1000, 4096, 40000} {
		b, err := sectorsFor(3, 1, 0, m)
		require.NoError(t, err)
		require.Greater(t, len(b.q), prev, "m %d", m)
		prev = len(b.q)
		require.LessOrEqual(t, min(b.dim[0], b.dim[len(b.dim)-1]), 3, "m %d: %v", m, b)
	}
	require.Less(t, prev, 50, "40000 states in fewer than 50 sectors")
	_, err = sectorsFor(1, 0, 0, 0)
	require.ErrorContains(t, err, "-m 0")
	_, err = sectorsFor(1, 0, 0, maxM+1)
	require.ErrorContains(t, err, "at most")
}

// TestHeisenbergMPO: every non-zero element of W conserves the charge, and
// the MPO of two and three sites is the Heisenberg Hamiltonian.
func TestHeisenbergMPO(t *testing.T) {
	w := heisenbergMPO()
	for l := range mpoDim {
		for r := range mpoDim {
			require.True(t, r <= l || w[l][r] == op2{}, "lower triangular: W[%d][%d]", l, r)
			for sp := range 2 {
				for s := range 2 {
					if w[l][r][sp][s] != 0 {
						require.Equal(t, mpoCharge[r], mpoCharge[l]+siteCharge(sp)-siteCharge(s), "W[%d][%d]<%d|.|%d>", l, r, sp, s)
					}
				}
			}
		}
	}
	// One bond: h = J/2 (S+ S- + S- S+) + Jz Sz Sz, in the basis |s1 s2>.
	bond := func(a, b, c, d int) float64 { // <a b| h |c d>
		var v float64
		v += heisenbergJ / 2 * (opSplus[a][c]*opSmin[b][d] + opSmin[a][c]*opSplus[b][d])
		v += heisenbergJz * opSz[a][c] * opSz[b][d]
		return v
	}
	for a := range 2 {
		for b := range 2 {
			for c := range 2 {
				for d := range 2 {
					var h float64
					for mid := range mpoDim {
						h += w[4][mid][a][c] * w[mid][0][b][d]
					}
					require.InDelta(t, bond(a, b, c, d), h, 1e-15, "<%d%d|H|%d%d>", a, b, c, d)
				}
			}
		}
	}
	// Three sites: h12 + h23, nothing else.
	for i := range 64 {
		a, b, c, d, e, f := i>>5&1, i>>4&1, i>>3&1, i>>2&1, i>>1&1, i&1 // <a b c| H |d e f>
		var h float64
		for m1 := range mpoDim {
			for m2 := range mpoDim {
				h += w[4][m1][a][d] * w[m1][m2][b][e] * w[m2][0][c][f]
			}
		}
		want := bond(a, b, d, e)*opI[c][f] + opI[a][d]*bond(b, c, e, f)
		require.InDelta(t, want, h, 1e-15, "<%d%d%d|H|%d%d%d>", a, b, c, d, e, f)
	}
	// The two-site blocks conserve the charge and are what W W gives.
	blocks := twoSiteBlocks()
	require.NotEmpty(t, blocks)
	for _, b := range blocks {
		dq := siteCharge(b.s1p) - siteCharge(b.s1) + siteCharge(b.s2p) - siteCharge(b.s2)
		require.Equal(t, mpoSectors[b.kw2].q, mpoSectors[b.kw].q+dq)
		for j, r := range mpoSectors[b.kw2].states {
			for i, l := range mpoSectors[b.kw].states {
				var v float64
				for mid := range mpoDim {
					v += w[l][mid][b.s1p][b.s1] * w[mid][r][b.s2p][b.s2]
				}
				require.Equal(t, v, b.vals[j*len(mpoSectors[b.kw].states)+i])
			}
		}
	}
}

func TestSectorStructureObeysTheChargeRules(t *testing.T) {
	for _, tc := range []struct{ m, bond, ranks int }{{1, 0, 1}, {2, 1, 4}, {17, 1, 3}, {128, 0, 1}, {256, 3, 4}, {1000, 2, 8}} {
		t.Run(fmt.Sprintf("m=%d,bond=%d,ranks=%d", tc.m, tc.bond, tc.ranks), func(t *testing.T) {
			st, err := newSectorStructure(5, tc.bond, tc.m, tc.ranks, 1<<20)
			require.NoError(t, err)
			L, R := st.left, st.right
			// psi: exactly the (qa, s1, s2) whose qb is a right sector.
			n := 0
			for _, qa := range L.q {
				for s1 := range 2 {
					for s2 := range 2 {
						if R.index(qa+siteCharge(s1)+siteCharge(s2)) >= 0 {
							n++
						}
					}
				}
			}
			require.Len(t, st.psi, n)
			for _, p := range st.psi {
				require.Equal(t, R.q[p.ib], L.q[p.ia]+siteCharge(p.s1)+siteCharge(p.s2))
			}
			for _, e := range st.l {
				require.Equal(t, L.q[e.outer], L.q[e.inner]+mpoSectors[e.kw].q, "L (qa', qw, qa)")
			}
			for _, e := range st.r {
				require.Equal(t, R.q[e.outer], R.q[e.inner]+mpoSectors[e.kw].q, "R (qb', qw'', qb)")
			}
			used1, used2 := make([]int, len(st.t1)), make([]int, len(st.t2))
			pair := map[int][2]int{}
			for _, p := range st.step2 {
				t1, t2, wc := st.t1[p.t1], st.t2[p.t2], st.wc[p.wc]
				used1[p.t1]++
				used2[p.t2]++
				require.Equal(t, [3]int{wc.kw, wc.s1, wc.s2}, [3]int{t1.kw, t1.s1, t1.s2}, "Wc's ket side is T1's")
				require.Equal(t, [3]int{wc.kw2, wc.s1p, wc.s2p}, [3]int{t2.kw2, t2.s1p, t2.s2p}, "Wc's bra side is T2's")
				require.Equal(t, [2]int{t1.iap, t1.ib}, [2]int{t2.iap, t2.ib})
				if k, ok := pair[p.t2]; ok {
					require.Equal(t, k, [2]int{t1.iap, t1.ib}, "one T1 pair per T2 block")
				}
				pair[p.t2] = [2]int{t1.iap, t1.ib}
			}
			for i, t1 := range st.t1 {
				require.Positive(t, used1[i], "T1 block %d feeds nothing", i)
				psi, l := st.psi[t1.psi], st.l[t1.l]
				require.Equal(t, [3]int{t1.iap, t1.kw, psi.ia}, [3]int{l.outer, l.kw, l.inner}, "T1's L block")
				require.Equal(t, [3]int{psi.s1, psi.s2, psi.ib}, [3]int{t1.s1, t1.s2, t1.ib}, "T1's psi block")
			}
			for i, t2 := range st.t2 {
				require.Positive(t, used2[i], "T2 block %d has no product", i)
				r, h := st.r[t2.r], st.psi[t2.hpsi]
				require.Equal(t, [3]int{R.index(R.q[t2.ib] + mpoSectors[t2.kw2].q), t2.kw2, t2.ib}, [3]int{r.outer, r.kw, r.inner}, "T2's R block")
				require.Equal(t, [4]int{t2.iap, t2.s1p, t2.s2p, r.outer}, [4]int{h.ia, h.s1, h.s2, h.ib}, "T2's H·psi block")
			}
			// Ownership: contiguous ranges of right charges, in order.
			require.Len(t, st.owner, len(R.q))
			for i := 1; i < len(st.owner); i++ {
				require.GreaterOrEqual(t, st.owner[i], st.owner[i-1])
			}
			require.Less(t, st.owner[len(st.owner)-1], tc.ranks)
			require.Positive(t, st.flops)
		})
	}
}

// TestSectorWorkIsBalanced: at the default m over 4 ranks every rank has
// work, and none more than twice its share of steps 1 and 3's flops.
func TestSectorWorkIsBalanced(t *testing.T) {
	st, err := newSectorStructure(1, 0, defaultM, 4, 1<<20)
	require.NoError(t, err)
	var work [4]float64
	for _, t1 := range st.t1 {
		work[st.owner[t1.ib]] += 2 * float64(dw(t1.kw)*st.da(t1.iap)*st.da(st.psi[t1.psi].ia)*st.db(t1.ib))
	}
	for _, t2 := range st.t2 {
		work[st.owner[st.r[t2.r].outer]] += 2 * float64(dw(t2.kw2)*st.da(t2.iap)*st.db(t2.ib)*st.db(st.r[t2.r].outer))
	}
	var total float64
	for _, w := range work {
		total += w
	}
	for r, w := range work {
		require.Less(t, w, total/2, "rank %d has %.3g of %.3g flops", r, w, total)
		require.Positive(t, w, "rank %d has nothing", r)
	}
}

// TestPartitionIsOptimal: against every contiguous cut of small lists,
// partition's largest range is the least possible, and no rank is left
// empty while there are as many items as ranks.
func TestPartitionIsOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		n, ranks := 1+rng.IntN(9), 1+rng.IntN(5)
		work := make([]float64, n)
		for i := range work {
			work[i] = math.Exp(4 * rng.Float64()) // a few orders of magnitude, as sectors are
			if trial%2 == 1 {
				work[i] = float64(1 + rng.IntN(4)) // ties
			}
		}
		owner := partition(work, ranks)
		loads := make([]float64, ranks)
		for i, r := range owner {
			require.True(t, r >= 0 && r < ranks)
			if i > 0 {
				require.GreaterOrEqual(t, r, owner[i-1], "contiguous, in order")
			}
			loads[r] += work[i]
		}
		best := math.Inf(1)
		// Every cut: a bitmask of the n-1 places between items.
		for mask := 0; mask < 1<<(n-1); mask++ {
			if bits.OnesCount(uint(mask)) > ranks-1 {
				continue
			}
			var worst, sum float64
			for i, w := range work {
				sum += w
				if i == n-1 || mask>>i&1 == 1 {
					worst = max(worst, sum)
					sum = 0
				}
			}
			best = min(best, worst)
		}
		require.InEpsilon(t, best, slices.Max(loads), 1e-9, "trial %d: %v over %d ranks: %v", trial, work, ranks, owner)
		if n >= ranks {
			require.NotContains(t, loads, 0.0, "trial %d: %v over %d ranks: %v", trial, work, ranks, owner)
		}
	}
}

// denseHPsi contracts H·psi on the host from dense tensors built out of the
// structure's value function for every block the charge rules allow, and
// the site MPO itself (not the two-site blocks): L[w][a'][a],
// psi[a][s1][s2][b], R[w”][b'][b], HPsi[a'][s1'][s2'][b'].
func denseHPsi(st *sectorStructure) (hpsi []float64, offL, offR []int) {
	offsets := func(b bondSectors) []int {
		o := make([]int, len(b.q)+1)
		for i, d := range b.dim {
			o[i+1] = o[i] + d
		}
		return o
	}
	offL, offR = offsets(st.left), offsets(st.right)
	mL, mR := offL[len(offL)-1], offR[len(offR)-1]
	slot := func(w int) (kw, i int) {
		kw = mpoSectorOf(mpoCharge[w])
		return kw, slices.Index(mpoSectors[kw].states, w)
	}
	env := func(b bondSectors, off []int, kind int) []float64 {
		m := off[len(off)-1]
		d := make([]float64, mpoDim*m*m)
		for w := range mpoDim {
			kw, wi := slot(w)
			for io, qo := range b.q {
				for ii, qi := range b.q {
					if qo != qi+mpoCharge[w] {
						continue
					}
					vals := make([]float64, dw(kw)*b.dim[io]*b.dim[ii])
					fillValues(vals, st.blockKey(kind, qo, kw, qi), 0)
					for x := range b.dim[io] {
						for y := range b.dim[ii] {
							d[(w*m+off[io]+x)*m+off[ii]+y] = vals[(wi*b.dim[io]+x)*b.dim[ii]+y]
						}
					}
				}
			}
		}
		return d
	}
	L, R := env(st.left, offL, kindL), env(st.right, offR, kindR)
	psi := make([]float64, mL*4*mR)
	for ia, qa := range st.left.q {
		for s1 := range 2 {
			for s2 := range 2 {
				ib := st.right.index(qa + siteCharge(s1) + siteCharge(s2))
				if ib < 0 {
					continue
				}
				vals := make([]float64, st.left.dim[ia]*st.right.dim[ib])
				fillValues(vals, st.blockKey(kindPsi, qa, s1, s2), 0)
				for a := range st.left.dim[ia] {
					for b := range st.right.dim[ib] {
						psi[((offL[ia]+a)*4+s1*2+s2)*mR+offR[ib]+b] = vals[a*st.right.dim[ib]+b]
					}
				}
			}
		}
	}
	W := heisenbergMPO()
	// X[w][a'][s1][s2][b] = sum_a L[w][a'][a] psi[a][s1][s2][b]
	X := make([]float64, mpoDim*mL*4*mR)
	for w := range mpoDim {
		for ap := range mL {
			for a := range mL {
				l := L[(w*mL+ap)*mL+a]
				if l == 0 {
					continue
				}
				for k := range 4 * mR {
					X[(w*mL+ap)*4*mR+k] += l * psi[a*4*mR+k]
				}
			}
		}
	}
	// Y[w''][a'][s1'][s2'][b] = sum W[w][w1](s1',s1) W[w1][w''](s2',s2) X[w][a'][s1][s2][b]
	Y := make([]float64, mpoDim*mL*4*mR)
	for w := range mpoDim {
		for w1 := range mpoDim {
			for w2 := range mpoDim {
				for s1p := range 2 {
					for s2p := range 2 {
						for s1 := range 2 {
							for s2 := range 2 {
								c := W[w][w1][s1p][s1] * W[w1][w2][s2p][s2]
								if c == 0 {
									continue
								}
								for ap := range mL {
									for b := range mR {
										Y[((w2*mL+ap)*4+s1p*2+s2p)*mR+b] += c * X[((w*mL+ap)*4+s1*2+s2)*mR+b]
									}
								}
							}
						}
					}
				}
			}
		}
	}
	// HPsi[a'][s'][b'] = sum_{w'', b} Y[w''][a'][s'][b] R[w''][b'][b]
	hpsi = make([]float64, mL*4*mR)
	for w2 := range mpoDim {
		for k := range mL * 4 {
			for bp := range mR {
				var sum float64
				for b := range mR {
					sum += Y[(w2*mL*4+k)*mR+b] * R[(w2*mR+bp)*mR+b]
				}
				hpsi[k*mR+bp] += sum
			}
		}
	}
	return hpsi, offL, offR
}

// TestReferenceAgainstDenseContraction: the check's reference agrees with
// H·psi contracted densely from the site MPO, block by block, at a few
// tiny m of both parities; H·psi has nothing outside psi's blocks; and a
// reference with an element changed fails the comparison.
func TestReferenceAgainstDenseContraction(t *testing.T) {
	for _, tc := range []struct{ m, bond int }{{6, 0}, {9, 1}, {14, 2}, {20, 3}} {
		t.Run(fmt.Sprintf("m=%d,bond=%d", tc.m, tc.bond), func(t *testing.T) {
			st, err := newSectorStructure(11, tc.bond, tc.m, 1, 0)
			require.NoError(t, err)
			refs, err := st.references(0)
			require.NoError(t, err)
			require.Len(t, refs, len(st.psi))
			hpsi, offL, offR := denseHPsi(st)
			mR := offR[len(offR)-1]
			covered := make([]bool, len(hpsi))
			var norm float64
			for _, ref := range refs {
				b := st.psi[ref.psi]
				rows, cols := st.da(b.ia), st.db(b.ib)
				block := make([]float64, rows*cols)
				for a := range rows {
					for c := range cols {
						k := ((offL[b.ia]+a)*4+b.s1*2+b.s2)*mR + offR[b.ib] + c
						block[a*cols+c] = hpsi[k]
						covered[k] = true
						norm += hpsi[k] * hpsi[k]
					}
				}
				v := make([]float64, cols)
				st.probeValues(v, b.ib)
				require.NoError(t, st.checkBlock(ref, block, v, 1), "block %s", st.describePsi(ref.psi))
				require.NoError(t, st.checkBlock(ref, scaled(block, 3), v, 3), "alpha 3")
				require.Error(t, st.checkBlock(ref, block, v, 2), "the wrong alpha")
				// One element off by a relative 1e-9 of the row's scale fails.
				bad := slices.Clone(block)
				bad[len(bad)-1] += 1e-9 * (1 + slices.Max(ref.yAbs))
				require.Error(t, st.checkBlock(ref, bad, v, 1))
			}
			require.Positive(t, norm)
			for k, v := range hpsi {
				if !covered[k] {
					require.Zero(t, v, "H·psi element %d outside psi's blocks", k)
				}
			}
		})
	}
}

func scaled(v []float64, c float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = c * x
	}
	return out
}

// BenchmarkSectorPlan is what a solve on a fresh structure pays before
// its buffers: the structure and one rank's layouts (of four), the alloc
// phase's planning part.
func BenchmarkSectorPlan(b *testing.B) {
	for _, m := range []int{defaultM, 1024, 8192} {
		b.Run(fmt.Sprintf("m=%d", m), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				st, err := newSectorStructure(1, i, m, 4, 1<<20)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := newSectorLayout(st, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
