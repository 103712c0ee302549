package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// bondSectors is the charge structure of one bond of the sectors workload:
// the U(1) charges (2 Sz, so of one parity) in increasing order, each with
// its sector dimension, summing to the bond dimension m.
type bondSectors struct {
	q   []int // charges, increasing in steps of 2
	dim []int // dim[i] >= 1 is the dimension of sector q[i]
}

// index returns the index of charge q, or -1 when the bond has no such
// sector.
func (b bondSectors) index(q int) int {
	if len(b.q) == 0 || (q-b.q[0])%2 != 0 {
		return -1
	}
	i := (q - b.q[0]) / 2
	if i < 0 || i >= len(b.q) {
		return -1
	}
	return i
}

func (b bondSectors) m() int {
	s := 0
	for _, d := range b.dim {
		s += d
	}
	return s
}

// sectorSigma is the width of the sector spread, in units of the charge
// (2 Sz), at bond dimension m. The kept states of a critical chain spread
// over more charges as m grows, slowly: the entanglement entropy, and with
// it the charge variance of the Schmidt spectrum, grows as log m. The
// constant puts m = 1000 at 21 sectors, inside the 15 to 25 a Heisenberg
// chain keeps there, with outer sectors of dimension 1 to 3.
func sectorSigma(m int) float64 { return max(0.87*math.Log(float64(m)), 0.5) }

// sectorJitter bounds the relative jitter of each sector's weight, so that
// the bonds of a sweep differ as real ones do, and a structure is not
// mirror-symmetric (a symmetric one would hide a sign error in a charge
// rule).
const sectorJitter = 0.15

// sectorsFor is the charge structure of one side (0: left, 1: right) of the
// two-site solve at a bond, for bond dimension m, the same on every rank:
// charges of the bond's parity (bond mod 2: the sites to the left of a
// bond alternate in number), weights exp(-q^2 / 2 sigma^2) each jittered
// by up to sectorJitter (a hash of seed, bond, side and q), and integer
// dimensions from them by largest remainders: every sector whose share
// m*p(q) is at least one half gets one (at least 1), and they sum to m
// exactly. The outer sectors are the tiny ones (1, 2, 3...).
func sectorsFor(seed uint64, bond, side, m int) (bondSectors, error) {
	if m < 1 {
		return bondSectors{}, fmt.Errorf("-m %d: the bond dimension must be at least 1", m)
	}
	if m > maxM {
		return bondSectors{}, fmt.Errorf("-m %d: at most %d", m, maxM)
	}
	parity := bond & 1
	sigma := sectorSigma(m)
	// Charges out to where even the jittered weight of the widest sector
	// could not reach half a state of m.
	reach := int(math.Ceil(sigma*math.Sqrt(2*math.Log(4*float64(m)+2)))) + 2
	type cand struct {
		q    int
		w    float64 // share of m
		dim  int
		frac float64
	}
	var cs []cand
	var total float64
	for q := -reach - parity; q <= reach+parity; q++ {
		if (q-parity)%2 != 0 {
			continue
		}
		u := unitHash(sectorHash(seed, bond, side, q))*2 - 1
		w := math.Exp(-float64(q*q)/(2*sigma*sigma)) * (1 + sectorJitter*u)
		cs = append(cs, cand{q: q, w: w})
		total += w
	}
	var kept []cand
	for i := range cs {
		cs[i].w *= float64(m) / total
		if cs[i].w >= 0.5 {
			kept = append(kept, cs[i])
		}
	}
	if len(kept) == 0 {
		// m = 1 and a jitter that splits it: the largest sector alone.
		best := slices.MaxFunc(cs, func(a, b cand) int { return cmp.Compare(a.w, b.w) })
		kept = append(kept, best)
	}
	// A run of charges in steps of 2: a sector the jitter dropped between
	// two kept ones stays, at dimension 1.
	lo, hi := kept[0].q, kept[len(kept)-1].q
	var run []cand
	for _, c := range cs {
		if c.q >= lo && c.q <= hi {
			run = append(run, c)
		}
	}
	sum := 0
	for i := range run {
		f := math.Floor(run[i].w)
		run[i].dim = max(1, int(f))
		run[i].frac = run[i].w - f
		sum += run[i].dim
	}
	// Largest remainders first; ties to the inner sector.
	order := make([]int, len(run))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(run[b].frac, run[a].frac), cmp.Compare(abs(run[a].q), abs(run[b].q)))
	})
	for k := 0; sum < m; k++ {
		run[order[k%len(order)]].dim++
		sum++
	}
	// Too many (the minimum of 1 raised some): take from the largest.
	for sum > m {
		i := 0
		for j := range run {
			if run[j].dim > run[i].dim {
				i = j
			}
		}
		if run[i].dim == 1 {
			// Every sector at 1 and still more than m: drop the outermost.
			if abs(run[0].q) >= abs(run[len(run)-1].q) {
				run = run[1:]
			} else {
				run = run[:len(run)-1]
			}
		} else {
			run[i].dim--
		}
		sum--
	}
	var b bondSectors
	for _, c := range run {
		b.q = append(b.q, c.q)
		b.dim = append(b.dim, c.dim)
	}
	return b, nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// sectorHash mixes the inputs of one sector's jitter.
func sectorHash(seed uint64, bond, side, q int) uint64 {
	h := bondSeed(seed, bond) ^ uint64(side+1)*0xd6e8feb86659fd93 ^ uint64(int64(q))*0xa0761d6478bd642f
	return mix64(h)
}

// mix64 is splitmix64's finaliser: every input bit reaches every output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// unitHash maps a hash to [0, 1).
func unitHash(h uint64) float64 { return float64(h>>11) / (1 << 53) }
