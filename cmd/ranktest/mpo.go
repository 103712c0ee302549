package main

import "sync"

// The Heisenberg chain's MPO, H = sum_i J/2 (S+_i S-_i+1 + S-_i S+_i+1) +
// Jz Sz_i Sz_i+1, in the lower-triangular form of bond dimension 5: W[l][r]
// is the operator a site carries from MPO state l on its left bond to r on
// its right one, and H is the sum over the paths from state 4 (nothing
// placed yet) at the left end to state 0 (the term complete) at the right:
//
//	W = | I            0       0      0     0 |
//	    | S+           0       0      0     0 |
//	    | S-           0       0      0     0 |
//	    | Sz           0       0      0     0 |
//	    | 0      J/2 S-  J/2 S+  Jz Sz     I |
//
// Site states: 0 is spin up (charge +1), 1 spin down (charge -1); an
// operator's element <s'|O|s> adds s' - s to the charge. The charge of an
// MPO state is what the operators placed to its left added: 0 for states
// 0, 3 and 4, -2 for 1 (an S- placed, its S+ pending), +2 for 2.
const (
	heisenbergJ  = 1.0
	heisenbergJz = 1.0
	mpoDim       = 5
)

// siteCharge is the charge of site state s.
func siteCharge(s int) int { return 1 - 2*s }

// mpoCharge is the charge of each MPO state.
var mpoCharge = [mpoDim]int{0, -2, 2, 0, 0}

// mpoSectors lists the MPO bond's charge sectors and their states in
// order: a state's index in its sector is its row or column in the blocks.
var mpoSectors = []struct {
	q      int
	states []int
}{{0, []int{0, 3, 4}}, {2, []int{2}}, {-2, []int{1}}}

// mpoSectorOf returns the index in mpoSectors of charge q, or -1.
func mpoSectorOf(q int) int {
	for i, s := range mpoSectors {
		if s.q == q {
			return i
		}
	}
	return -1
}

type op2 [2][2]float64 // <s'|O|s> at [s'][s]

var (
	opI     = op2{{1, 0}, {0, 1}}
	opSplus = op2{{0, 1}, {0, 0}}
	opSmin  = op2{{0, 0}, {1, 0}}
	opSz    = op2{{0.5, 0}, {0, -0.5}}
)

// heisenbergMPO is W[l][r][s'][s].
func heisenbergMPO() [mpoDim][mpoDim]op2 {
	var w [mpoDim][mpoDim]op2
	scale := func(o op2, c float64) op2 {
		for i := range o {
			for j := range o[i] {
				o[i][j] *= c
			}
		}
		return o
	}
	w[0][0] = opI
	w[1][0] = opSplus
	w[2][0] = opSmin
	w[3][0] = opSz
	w[4][1] = scale(opSmin, heisenbergJ/2)
	w[4][2] = scale(opSplus, heisenbergJ/2)
	w[4][3] = scale(opSz, heisenbergJz)
	w[4][4] = opI
	return w
}

// wcBlock is one block of the two-site MPO W1 W2, contracted over the
// bond between the sites: from MPO sector kw (an index in mpoSectors) and
// site states s1, s2 on the ket side to sector kw2 and s1p, s2p on the bra
// side. vals is Dw(kw2) x Dw(kw), row-major: the A operand of step 2.
type wcBlock struct {
	kw, s1, s2    int
	kw2, s1p, s2p int
	vals          []float64
}

// twoSiteBlocks is the two-site MPO's non-zero blocks, each obeying
// qw2 = qw + (s1p - s1) + (s2p - s2): the same for every structure, made
// once, shared read-only.
var twoSiteBlocks = sync.OnceValue(contractTwoSites)

// contractTwoSites contracts the MPO of two sites over the bond between
// them.
func contractTwoSites() []wcBlock {
	w := heisenbergMPO()
	var out []wcBlock
	for kw, sw := range mpoSectors {
		for s1 := range 2 {
			for s2 := range 2 {
				for kw2, sw2 := range mpoSectors {
					for s1p := range 2 {
						for s2p := range 2 {
							dq := siteCharge(s1p) - siteCharge(s1) + siteCharge(s2p) - siteCharge(s2)
							if sw2.q != sw.q+dq {
								continue
							}
							vals := make([]float64, len(sw2.states)*len(sw.states))
							nonzero := false
							for j, r := range sw2.states {
								for i, l := range sw.states {
									var v float64
									for mid := range mpoDim {
										v += w[l][mid][s1p][s1] * w[mid][r][s2p][s2]
									}
									vals[j*len(sw.states)+i] = v
									nonzero = nonzero || v != 0
								}
							}
							if nonzero {
								out = append(out, wcBlock{kw, s1, s2, kw2, s1p, s2p, vals})
							}
						}
					}
				}
			}
		}
	}
	return out
}
