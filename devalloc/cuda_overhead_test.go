//go:build cgo

package devalloc_test

import (
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
)

// BenchmarkCUDAOverhead times the CUDA backend's host path per operation
// against the fake libcudart built with FAKE_NO_WORK, whose entry points
// return at once: devalloc's code, the backend's, the trampolines and the
// cgo calls, which is what a pair from Go pays on top of the same pair
// made from C (ranktest -bench alloc, nosync_vs_c). BenchmarkOverhead is
// devalloc's part alone.
func BenchmarkCUDAOverhead(b *testing.B) {
	b.Setenv(cudart.EnvCUDART, cudarttest.Build(b, "FAKE_NO_WORK"))
	for _, memset := range []bool{false, true} {
		name := "op=alloc-free"
		if memset {
			name = "op=alloc-memset-free"
		}
		b.Run(name, func(b *testing.B) {
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Warn: func(string) {}})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := a.Close(); err != nil {
					b.Error(err)
				}
			}()
			s := a.DefaultStream()
			for b.Loop() {
				buf, err := a.Alloc(4096, s)
				if err != nil {
					b.Fatal(err)
				}
				if memset {
					if err := s.Memset(buf, 0, 4096, 1); err != nil {
						b.Fatal(err)
					}
				}
				if err := buf.Free(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
