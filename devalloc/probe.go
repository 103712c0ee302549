package devalloc

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf"
)

// LargestAlloc reports the size of the largest buffer an Alloc on stream s
// could get now without the out-of-memory ladder, to within a 64th (and
// never finer than 2 MiB, the pools' granularity): the measure of how
// fragmented the pool's reservation and the device are, beside what is
// free. It searches with trial allocations, each freed at once in s's order,
// within the budget (Config.Limit) and the device's total memory. The pool
// is left holding no more than before: after each trial the call waits for
// the allocator's streams and trims the reservation back (Trim). It is
// a measurement, for the steps of a run that grows (cmd/ranktest), not for a
// hot path: each trial is a driver call, and a failing one on a retaining
// pool gives the blocks kept for reuse back to it.
func (a *Allocator) LargestAlloc(s *Stream) (int64, error) {
	if err := a.enter(); err != nil {
		return 0, err
	}
	defer a.exit()
	if err := a.checkStream(s); err != nil {
		return 0, err
	}
	hi := a.total
	if hi <= 0 {
		hi = maxAlloc
	}
	if a.limit > 0 {
		hi = min(hi, a.limit-a.budget.Load())
	}
	hi = min(alignUp(max(hi, 0), allocAlign), maxAlloc)
	before := a.be.reserved()
	fits := func(size int64) (bool, error) {
		addr, _, err := a.tryAlloc(size, s)
		if err != nil {
			if err == errBudget || errors.Is(err, distbuf.ErrOutOfMemory) {
				return false, nil
			}
			return false, err
		}
		a.c.backendCalls.Add(1)
		if a.limit > 0 {
			a.budget.Add(-size)
		}
		if err := a.be.freeAsync(addr, size, s.impl); err != nil {
			return true, err
		}
		// A retaining pool keeps the trial's memory, which the next, larger
		// trial could not use: give it back first.
		return true, a.trimNow(before)
	}
	var lo int64
	if hi > 0 {
		ok, err := fits(hi)
		if err != nil {
			return 0, fmt.Errorf("devalloc: largest allocation: %w", err)
		}
		if ok {
			lo = hi
		}
	}
	for lo < hi && hi-lo > max(largestStep, lo/64) {
		mid := alignUp(lo+(hi-lo)/2, allocAlign)
		ok, err := fits(mid)
		if err != nil {
			return 0, fmt.Errorf("devalloc: largest allocation: %w", err)
		}
		if ok {
			lo = mid
		} else {
			hi = mid - allocAlign
		}
	}
	return lo, nil
}

// largestStep is LargestAlloc's finest resolution.
const largestStep = 2 << 20
