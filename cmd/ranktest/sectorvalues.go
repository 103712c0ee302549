package main

import (
	"runtime"
	"sync"
)

// The operands of the sectors workload are a cheap hash of the block's
// charges and the element's index, so any rank (and the tests' dense
// contraction) can regenerate any block, including blocks the structure
// does not hold.
const (
	kindL = iota + 1
	kindPsi
	kindR
	kindProbe // the Freivalds vectors of the check
)

// blockKey names one block's values: L (qa', kw, qa), psi (qa, s1, s2),
// R (qb', kw2, qb) by their charges, mixed with the seed, bond and m.
func (s *sectorStructure) blockKey(kind, a, b, c int) uint64 {
	h := bondSeed(s.seed, s.bond) ^ uint64(s.m)*0xe7037ed1a0b428db
	for _, v := range [...]int{kind, a, b, c} {
		h = mix64(h ^ uint64(int64(v))*0x8ebc6af09c88c6e3)
	}
	return h
}

func (s *sectorStructure) lKey(i int) uint64 {
	e := s.l[i]
	return s.blockKey(kindL, s.left.q[e.outer], e.kw, s.left.q[e.inner])
}

func (s *sectorStructure) psiKey(p int) uint64 {
	b := s.psi[p]
	return s.blockKey(kindPsi, s.left.q[b.ia], b.s1, b.s2)
}

func (s *sectorStructure) rKey(i int) uint64 {
	e := s.r[i]
	return s.blockKey(kindR, s.right.q[e.outer], e.kw, s.right.q[e.inner])
}

// fillValues writes elements first .. first+len(dst)-1 of the block with
// key into dst: values in [-1, 1] in steps of 1/1000.
func fillValues(dst []float64, key uint64, first int) {
	for i := range dst {
		x := mix64(key + uint64(first+i)*0x9e3779b97f4a7c15)
		dst[i] = float64(x%2001)/1000 - 1
	}
}

// probeValues fills the Freivalds vector of the H·psi blocks whose qb' is
// right sector ib: non-integer values in [0.5, 1.5), so that no element's
// error is multiplied by zero and errors in one row do not cancel by
// construction.
func (s *sectorStructure) probeValues(dst []float64, ib int) {
	key := s.blockKey(kindProbe, s.right.q[ib], 0, 0)
	for i := range dst {
		dst[i] = 0.5 + unitHash(mix64(key+uint64(i)*0x9e3779b97f4a7c15))
	}
}

// parallel runs f(0) ... f(n-1) on GOMAXPROCS goroutines, handing out
// indices in order (large items first when the caller sorts them so), and
// returns the first error.
func parallel(n int, f func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if i >= n || stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
