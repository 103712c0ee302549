package cudart

import (
	"maps"
	"slices"
)

// Counts is a number of calls per entry point, by the entry point's name
// (cudaMallocFromPoolAsync, cudaSetDevice, cuCtxGetCurrent...). Entry
// points never called are absent.
type Counts map[string]uint64

// Sub returns the calls made since earlier, a snapshot taken before c.
func (c Counts) Sub(earlier Counts) Counts {
	out := Counts{}
	for name, n := range c {
		if d := n - earlier[name]; d > 0 {
			out[name] = d
		}
	}
	return out
}

// Total is the number of calls over every entry point.
func (c Counts) Total() uint64 {
	var t uint64
	for _, n := range c {
		t += n
	}
	return t
}

// Names lists the entry points called, in alphabetical order.
func (c Counts) Names() []string { return slices.Sorted(maps.Keys(c)) }

// Tally holds the loader's counters by entry point in memory its owner
// keeps, so that reading them around a measured region allocates nothing
// and leaves the region as it would run uncounted. The zero Tally is empty.
type Tally struct{ n []uint64 }

// Read replaces t's counters with the loader's current ones (as Calls).
func (t *Tally) Read() { t.n = readCalls(t.n) }

// AddSince adds to t the calls counted between the readings earlier and now.
func (t *Tally) AddSince(now, earlier *Tally) {
	if len(t.n) < len(now.n) {
		t.n = append(t.n, make([]uint64, len(now.n)-len(t.n))...)
	}
	for i, k := range now.n {
		if i < len(earlier.n) {
			k -= earlier.n[i]
		}
		t.n[i] += k
	}
}

// Counts names t's non-zero counters by entry point.
func (t *Tally) Counts() Counts {
	out := Counts{}
	names := symbolNamesFor(len(t.n))
	for i, k := range t.n {
		if k != 0 {
			out[names[i]] = k
		}
	}
	return out
}
