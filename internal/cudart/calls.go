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
// and leaves the region as it would run uncounted. It also holds the time
// spent in each entry point, which grows only while SetTiming is on. The
// zero Tally is empty.
type Tally struct{ n, ns []uint64 }

// Read replaces t's counters with the loader's current ones (as Calls).
func (t *Tally) Read() { t.n, t.ns = readCalls(t.n, t.ns) }

// AddSince adds to t the calls counted between the readings earlier and now.
func (t *Tally) AddSince(now, earlier *Tally) {
	t.n = addSince(t.n, now.n, earlier.n)
	t.ns = addSince(t.ns, now.ns, earlier.ns)
}

func addSince(acc, now, earlier []uint64) []uint64 {
	if len(acc) < len(now) {
		acc = append(acc, make([]uint64, len(now)-len(acc))...)
	}
	for i, k := range now {
		if i < len(earlier) {
			k -= earlier[i]
		}
		acc[i] += k
	}
	return acc
}

// Durations names t's non-zero times by entry point, in nanoseconds: the
// time spent inside the runtime's entry points while SetTiming was on.
func (t *Tally) Durations() Counts { return byEntryPoint(t.ns) }

// Counts names t's non-zero counters by entry point.
func (t *Tally) Counts() Counts { return byEntryPoint(t.n) }

// byEntryPoint names the non-zero values of a per-entry-point array.
func byEntryPoint(vals []uint64) Counts {
	out := Counts{}
	names := symbolNamesFor(len(vals))
	for i, k := range vals {
		if k != 0 {
			out[names[i]] = k
		}
	}
	return out
}
