package devalloc

import "testing"

// Cycle is one cycle of the cycle benchmarks, for BenchmarkCUDACycle.
var Cycle = cycle

// OpenTB opens an allocator for tb and closes it when tb ends; either
// failing fails tb. It is exported for the external tests' benchmarks.
func OpenTB(tb testing.TB, opts Options) *Allocator {
	tb.Helper()
	a, err := Open(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Error(err)
		}
	})
	return a
}
