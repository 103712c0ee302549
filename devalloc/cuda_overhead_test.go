//go:build cgo

package devalloc

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
)

// BenchmarkCUDAOverhead times the CUDA backend's host path per operation
// against the fake libcudart built with FAKE_NO_WORK, whose entry points
// return at once: devalloc's code, the backend's, the trampolines and the
// cgo calls, which is what a pair from Go pays on top of the same pair
// made from C (BenchmarkAlloc's pair/mode=M/size=S, nosync-vs-c). BenchmarkOverhead is
// devalloc's part alone.
func BenchmarkCUDAOverhead(b *testing.B) {
	b.Setenv(cudart.EnvCUDART, cudarttest.Build(b, "FAKE_NO_WORK"))
	benchOverhead(b, func(tb testing.TB) *Allocator {
		tb.Helper()
		return OpenTB(tb, Options{Backend: BackendCUDA, Warn: func(string) {}})
	})
}
