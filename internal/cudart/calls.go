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
