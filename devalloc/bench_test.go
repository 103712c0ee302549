package devalloc_test

import (
	"fmt"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
)

func openHostForBench(b *testing.B, cfg devalloc.Config) *devalloc.Allocator {
	b.Helper()
	return devalloc.OpenTB(b, devalloc.Options{Backend: devalloc.BackendHost, Config: &cfg})
}

// allocFree allocates size bytes on s and frees them: the pair the
// allocation benchmarks time. It leaves out b.Helper, which would add its
// own cost to every pair timed.
func allocFree(b *testing.B, a *devalloc.Allocator, size int64, s *devalloc.Stream) {
	buf, err := a.Alloc(size, s)
	if err != nil {
		b.Fatal(err)
	}
	if err := buf.Free(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAllocFree is the cost of one Alloc+Free pair on the host backend
// with the pool retained (the steady state of a converged solve).
func BenchmarkAllocFree(b *testing.B) {
	for _, size := range []int64{256, 16 << 10, 16 << 20} {
		b.Run(fmt.Sprintf("backend=host/size=%d", size), func(b *testing.B) {
			a := openHostForBench(b, devalloc.Config{})
			s := a.DefaultStream()
			for b.Loop() {
				allocFree(b, a, size, s)
			}
			b.StopTimer()
			if err := a.Sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkStats is the cost of reading the statistics every iteration.
func BenchmarkStats(b *testing.B) {
	a := openHostForBench(b, devalloc.Config{})
	var sink int64
	for b.Loop() {
		sink += a.Stats().ReservedCurrent
	}
	_ = sink
}
