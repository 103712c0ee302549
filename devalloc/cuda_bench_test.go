package devalloc_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
)

// The CUDA benchmarks skip without a GPU. Run them on the GPU machine with
//
//	devalloc.test -test.run '^$' -test.bench 'CUDA' -test.benchtime 2000x
//
// us/pair is the wall time of one Alloc+Free (and the synchronisation when
// sync=each), the figure to compare across pool settings.

func cudaBenchAllocator(b *testing.B, cfg devalloc.Config) *devalloc.Allocator {
	b.Helper()
	if n, err := devalloc.DeviceCount(); err != nil || n == 0 {
		b.Skipf("CUDA unavailable: %v", err)
	}
	return devalloc.OpenTB(b, devalloc.Options{Backend: devalloc.BackendCUDA, Config: &cfg, Warn: func(string) {}})
}

func BenchmarkCUDAAllocFree(b *testing.B) {
	configs := []struct {
		name   string
		cfg    devalloc.Config
		nosync bool // also measure without a synchronisation per pair
	}{
		{"retained", devalloc.Config{}, true},
		{"threshold0", devalloc.Config{Policy: devalloc.AggressiveFree}, true},
		{"fallback-cached", devalloc.Config{NoPool: true}, false},
		{"cudamalloc", devalloc.Config{NoPool: true, Cache: -1}, false},
	}
	for _, c := range configs {
		for _, size := range []int64{256, 64 << 10, 16 << 20} {
			syncs := []bool{true}
			if c.nosync {
				syncs = append(syncs, false)
			}
			for _, sync := range syncs {
				mode := "each"
				if !sync {
					mode = "none"
				}
				name := fmt.Sprintf("backend=cuda/pool=%s/sync=%s/size=%s", c.name, mode, cudaSizeName(size))
				b.Run(name, func(b *testing.B) {
					a := cudaBenchAllocator(b, c.cfg)
					s := a.DefaultStream()
					for b.Loop() {
						allocFree(b, a, size, s)
						if sync {
							if err := s.Synchronize(); err != nil {
								b.Fatal(err)
							}
						}
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/pair")
					if err := a.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}

func BenchmarkCUDAStats(b *testing.B) {
	b.Run("backend=cuda/pool=retained", func(b *testing.B) {
		a := cudaBenchAllocator(b, devalloc.Config{})
		buf, err := a.Alloc(1<<20, a.DefaultStream())
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			_ = a.Stats()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/op")
		if err := buf.Free(); err != nil {
			b.Fatal(err)
		}
	})
}

func cudaSizeName(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkCUDACycle is the alloc benchmark's large-only cycle-touch on the
// retained pool: 20 buffers of 16 to 64 MiB allocated, the first 4 KiB of
// each set, each freed, one synchronisation. Run it with -test.cpuprofile
// to see where the host's time goes between the runtime's calls.
func BenchmarkCUDACycle(b *testing.B) {
	a := cudaBenchAllocator(b, devalloc.Config{})
	s := a.DefaultStream()
	sizes := make([]int64, 20)
	for i := range sizes {
		// 16 MiB to 64 MiB, spread evenly in the logarithm, 256-byte granular.
		sizes[i] = int64(16<<20*math.Pow(4, float64(i)/float64(len(sizes)-1))) &^ 255
	}
	bufs := make([]*devalloc.Buffer, len(sizes))
	for b.Loop() {
		devalloc.Cycle(b, a, s, sizes, 4096, bufs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/cycle")
}
