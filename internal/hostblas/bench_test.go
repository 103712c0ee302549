package hostblas

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
)

// BenchmarkGemm is one square product, untransposed, with beta = 1, at the
// sizes of a solve's blocks, in each dtype.
func BenchmarkGemm(b *testing.B) {
	for _, d := range []int{4, 8, 16, 32, 64} {
		b.Run(fmt.Sprintf("float64/dim=%d", d), func(b *testing.B) { benchGemm[float64](b, d) })
		b.Run(fmt.Sprintf("complex128/dim=%d", d), func(b *testing.B) { benchGemm[complex128](b, d) })
	}
}

func benchGemm[T Elem](b *testing.B, d int) {
	v := make([]complex128, d*d)
	for i := range v {
		v[i] = complex(float64(i%7)-3, float64(i%5)-2)
	}
	x := convert[T](v)
	y, c := append([]T(nil), x...), make([]T, d*d)
	var w Workspace
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU(b)
	for b.Loop() {
		Gemm(false, false, d, d, d, 1, x, d, y, d, 1, c, d, &w)
	}
	flops := 2 * d * d * d
	if isComplex[T]() {
		flops *= 4
	}
	b.ReportMetric(float64(flops)*float64(b.N)/float64(threadCPU(b)-cpu0), "cpu-GFLOP/s")
}

// threadCPU is the CPU time the calling thread has used, in nanoseconds:
// a busy machine disturbs it less than the wall clock.
func threadCPU(b *testing.B) int64 {
	const rusageThread = 1 // RUSAGE_THREAD (Linux)
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		b.Skipf("no per-thread CPU time: %v", err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
