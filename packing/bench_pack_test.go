package packing

import (
	"math/rand/v2"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/benchtimer"
	"github.com/distbuf/distbuf/internal/gputest"
)

// BenchmarkGather packs 20000 scattered blocks of 4 KiB into one coalesced
// buffer with a Mover (the automatic method: the gather kernel on CUDA, parallel
// goroutines on the host) against one copy per block measured in the same
// run (vs-per-block), and on CUDA against cudaMemcpyBatchAsync
// (vs-memcpy-batch). ns/op is the median pack (device time between CUDA
// events on the GPU, wall clock and a synchronisation on the host); GB/s
// its bandwidth, and on CUDA TB/s with the goal of at least 1.5 TB/s.
// Run on the GPU machine as
//
//	test -test.run '^$' -test.bench 'Gather/backend=cuda' -test.benchtime 20x
func BenchmarkGather(b *testing.B) {
	for _, backend := range []devalloc.Backend{devalloc.BackendHost, devalloc.BackendCUDA} {
		b.Run("backend="+string(backend), func(b *testing.B) {
			a, err := devalloc.Open(devalloc.Options{Backend: backend, Warn: func(string) {}})
			if err != nil {
				if backend == devalloc.BackendHost {
					b.Fatal(err)
				}
				gputest.Unavailable(b, "the CUDA backend", err)
			}
			defer func() {
				if err := a.Close(); err != nil {
					b.Error(err)
				}
			}()
			if err := benchGather(b, a); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func benchGather(b *testing.B, a *devalloc.Allocator) error {
	const n, size = 20000, 4096
	s := a.DefaultStream()
	timer, err := benchtimer.New(a, s)
	if err != nil {
		return err
	}
	descs := make([]Desc, n)
	for i := range descs {
		descs[i] = Desc{ID: uint64(i), DType: Float64, Rows: 16, Cols: size / 8 / 16}
	}
	p, err := NewPlan(descs, Options{})
	if err != nil {
		return err
	}
	dst, err := Alloc(a, p, s)
	if err != nil {
		return err
	}
	defer func() { _ = dst.Free() }()
	// The blocks sit in every other 4 KiB slot of one source buffer, shuffled.
	src, err := a.Alloc(2*n*size, s)
	if err != nil {
		return err
	}
	defer func() { _ = src.Free() }()
	if err := s.Memset(src, 0, src.Size(), 1); err != nil {
		return err
	}
	refs := make([]Ref, n)
	for i, j := range rand.New(rand.NewPCG(1, 2)).Perm(n) {
		refs[i] = Ref{Buf: src, Off: int64(2*j) * size}
	}
	timeMover := func(method copyMethod, iters int) (float64, string, error) {
		m, err := newMover(s, dst, refs, method)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = m.Close() }()
		us, err := timer.MedianUS(iters, func() error { return m.Pack(s) })
		return us, m.Method(), err
	}
	b.ResetTimer()
	us, method, err := timeMover(copyAuto, b.N)
	if err != nil {
		return err
	}
	b.StopTimer()
	b.Logf("method %s, timer %s", method, timer.Name())
	bytes := float64(n * size)
	b.ReportMetric(us*1e3, "ns/op")
	b.ReportMetric(bytes/us/1e3, "GB/s")
	var perUS float64
	if a.Info().Backend == devalloc.BackendCUDA {
		tbps := bytes / us / 1e6
		b.ReportMetric(tbps, "TB/s")
		b.ReportMetric(2*tbps, "TB/s-read+write")
		b.Logf("goal TB/s >= 1.5: %s", map[bool]string{true: "met", false: "MISSED"}[tbps >= 1.5])
		if perUS, _, err = timeMover(copyPerBlock, min(b.N, 5)); err != nil {
			return err
		}
		if batchUS, _, err := timeMover(copyBatch, b.N); err == nil {
			b.ReportMetric(batchUS, "memcpy-batch-us")
			b.ReportMetric(batchUS/us, "vs-memcpy-batch")
		} else {
			b.Logf("cudaMemcpyBatchAsync: %v", err)
		}
	} else {
		// Host: one devalloc Copy per block on the stream.
		perUS, err = timer.MedianUS(min(b.N, 5), func() error {
			for k, r := range refs {
				v, err := dst.View(k)
				if err != nil {
					return err
				}
				if err := s.Copy(dst.Buffer(), v.Offset(), r.Buf, r.Off, size); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	b.ReportMetric(perUS, "per-block-us")
	b.ReportMetric(perUS/us, "vs-per-block")
	return nil
}
