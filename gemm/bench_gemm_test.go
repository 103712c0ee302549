package gemm_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/internal/benchtimer"
	"github.com/distbuf/distbuf/internal/cublas"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/distbuf/distbuf/packing"
)

// The GPU benchmarks of planned batched GEMM, each against its baselines
// measured in the same run: b.N is the number of timed runs of each plan,
// ns/op the median run of the plan the benchmark is named for, in device
// time between CUDA events. They skip without a GPU (DISTBUF_REQUIRE_GPU=1
// makes that a failure). The host backend's batch against the per-block
// loop is BenchmarkHostBatch. Run on the GPU machine as
//
//	gemm.test -test.run '^$' -test.bench 'Batched|Grouped|Spectrum|Crossover' -test.benchtime 20x

// gemmBench is a CUDA allocator, its default stream, an engine and a timer.
type gemmBench struct {
	a     *devalloc.Allocator
	s     *devalloc.Stream
	eng   *gemm.Engine
	timer *benchtimer.Timer
}

func newGemmBench(b *testing.B) *gemmBench {
	b.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Warn: func(string) {}})
	if err != nil {
		gputest.Unavailable(b, "the CUDA backend", err)
	}
	g := &gemmBench{a: a, s: a.DefaultStream()}
	b.Cleanup(func() {
		if g.eng != nil {
			if err := g.eng.Close(); err != nil {
				b.Error(err)
			}
		}
		if err := a.Close(); err != nil {
			b.Error(err)
		}
	})
	if g.eng, err = gemm.NewEngine(g.s, gemm.EngineOptions{}); err != nil {
		b.Fatal(err)
	}
	if g.timer, err = benchtimer.New(a, g.s); err != nil {
		b.Fatal(err)
	}
	return g
}

// operands are the A, B and C blocks of a list of (m, n, k) products,
// zero-filled, block i of C the product of blocks i of A and B.
type operands struct {
	A, B, C *packing.Coalesced
	triples []gemm.Triple
	flops   float64
}

func (g *gemmBench) operands(b *testing.B, shapes [][3]int) *operands {
	b.Helper()
	var aD, bD, cD []packing.Desc
	o := &operands{}
	for i, sh := range shapes {
		id := uint64(i)
		aD = append(aD, packing.Desc{ID: id, DType: packing.Float64, Rows: sh[0], Cols: sh[2]})
		bD = append(bD, packing.Desc{ID: id, DType: packing.Float64, Rows: sh[2], Cols: sh[1]})
		cD = append(cD, packing.Desc{ID: id, DType: packing.Float64, Rows: sh[0], Cols: sh[1]})
		o.triples = append(o.triples, gemm.Triple{A: i, B: i, C: i})
		o.flops += 2 * float64(sh[0]*sh[1]*sh[2])
	}
	var out []*packing.Coalesced
	for _, d := range [][]packing.Desc{aD, bD, cD} {
		p, err := packing.NewPlan(d, packing.Options{})
		if err != nil {
			b.Fatal(err)
		}
		co, err := packing.Alloc(g.a, p, g.s)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = co.Free() })
		if err := g.s.Memset(co.Buffer(), 0, co.Buffer().Size(), 0); err != nil {
			b.Fatal(err)
		}
		out = append(out, co)
	}
	o.A, o.B, o.C = out[0], out[1], out[2]
	return o
}

// timePlan is the median Run of the plan of o under st over iters runs,
// and the plan's launches.
func (g *gemmBench) timePlan(b *testing.B, o *operands, st gemm.Strategy, iters int) (us float64, launches int) {
	b.Helper()
	p, err := gemm.NewPlan(gemm.Problem{A: o.A, B: o.B, C: o.C, Alpha: 1, Beta: 1, Triples: o.triples}, gemm.Options{Strategy: st})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	if us, err = g.timer.MedianUS(iters, func() error { return g.eng.Run(p) }); err != nil {
		b.Fatalf("%v: %v", st, err)
	}
	return us, p.Launches()
}

// timeRuns times the benchmark's own plan, that of o under st, over b.N
// runs and reports their median as ns/op; b's timer runs only around them,
// so that setup and baselines stay out of b's own measure.
func (g *gemmBench) timeRuns(b *testing.B, o *operands, st gemm.Strategy) (us float64, launches int) {
	b.Helper()
	b.ResetTimer()
	us, launches = g.timePlan(b, o, st, b.N)
	b.StopTimer()
	b.ReportMetric(us*1e3, "ns/op")
	return us, launches
}

// baseline times the plan of o under st over iters runs as the baseline
// name of a plan whose median is us, and reports its median (name-us) and
// how many times faster the plan is (vs-name).
func (g *gemmBench) baseline(b *testing.B, o *operands, st gemm.Strategy, iters int, name string, us float64) (baseUS float64, launches int) {
	b.Helper()
	baseUS, launches = g.timePlan(b, o, st, iters)
	b.ReportMetric(baseUS, name+"-us")
	b.ReportMetric(baseUS/us, "vs-"+name)
	return baseUS, launches
}

func goal(b *testing.B, what string, met bool) {
	b.Logf("goal %s: %s", what, map[bool]string{true: "met", false: "MISSED"}[met])
}

// BenchmarkBatchedVsLoop: 20000 products of 32^3 float64, the planned
// batch (one strided call) against one GEMM call per block (vs-loop, goal
// at least 1000) and against cublasDgemmStridedBatched called directly on
// the same buffers (vs-strided-direct, the planned time over the direct
// one, goal at most 1.1).
func BenchmarkBatchedVsLoop(b *testing.B) {
	g := newGemmBench(b)
	const n, dim = 20000, 32
	shapes := make([][3]int, n)
	for i := range shapes {
		shapes[i] = [3]int{dim, dim, dim}
	}
	o := g.operands(b, shapes)
	us, launches := g.timeRuns(b, o, gemm.Auto)
	// 20000 launches take about 0.2 s each time.
	loopUS, loopLaunches := g.baseline(b, o, gemm.Loop, min(b.N, 5), "loop", us)
	direct := g.directStrided(b, o, dim, n, b.N)
	b.ReportMetric(float64(launches), "launches")
	b.ReportMetric(o.flops/us/1e3, "GFLOP/s")
	b.ReportMetric(float64(loopLaunches), "loop-launches")
	b.ReportMetric(direct, "strided-direct-us")
	b.ReportMetric(us/direct, "vs-strided-direct")
	goal(b, "vs-loop >= 1000", loopUS/us >= 1000)
	goal(b, "vs-strided-direct <= 1.1", us/direct <= 1.1)
}

// directStrided times one cublasDgemmStridedBatched on the operands'
// buffers, without the planner, the engine or the ledger.
func (g *gemmBench) directStrided(b *testing.B, o *operands, dim, n, iters int) float64 {
	b.Helper()
	lib, err := cublas.Load()
	if err != nil {
		b.Fatal(err)
	}
	h, err := lib.NewHandle(g.a.Info().Device, g.s.Handle(), false)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = h.Destroy() }()
	var addr [3]uintptr
	for i, c := range []*packing.Coalesced{o.A, o.B, o.C} {
		if addr[i], _, _, err = c.Buffer().Region(); err != nil {
			b.Fatal(err)
		}
	}
	stride := int64(dim * dim)
	us, err := g.timer.MedianUS(iters, func() error {
		return h.GemmStrided(cublas.D, cublas.N, cublas.N, dim, dim, dim, 1, addr[1], dim, stride, addr[0], dim, stride, 1, addr[2], dim, stride, n)
	})
	if err != nil {
		b.Fatal(err)
	}
	return us
}

// BenchmarkGroupedVsPerShape: 216 mixed shapes, (m, n, k) over 8 to 64,
// 32 products each, in one grouped cuBLAS call against one batched call
// per shape (vs-pershape, goal at least 2).
func BenchmarkGroupedVsPerShape(b *testing.B) {
	g := newGemmBench(b)
	dims := []int{8, 16, 24, 32, 48, 64}
	var shapes [][3]int
	for _, m := range dims {
		for _, n := range dims {
			for _, k := range dims {
				for range 32 {
					shapes = append(shapes, [3]int{m, n, k})
				}
			}
		}
	}
	o := g.operands(b, shapes)
	us, launches := g.timeRuns(b, o, gemm.Grouped)
	perUS, perLaunches := g.baseline(b, o, gemm.PerShape, b.N, "pershape", us)
	b.ReportMetric(float64(launches), "launches")
	b.ReportMetric(float64(perLaunches), "pershape-launches")
	b.ReportMetric(float64(g.eng.Stats().GroupedFallbacks), "grouped-fallbacks")
	goal(b, "vs-pershape >= 2", perUS/us >= 2)
}

// randomShapes is n products whose dimensions are uniform in [lo, hi], and
// with probability largeFrac in [largeLo, largeHi].
func randomShapes(n, lo, hi int, largeFrac float64, largeLo, largeHi int, seed uint64) [][3]int {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([][3]int, n)
	for i := range out {
		a, b := lo, hi
		if rng.Float64() < largeFrac {
			a, b = largeLo, largeHi
		}
		for j := range 3 {
			out[i][j] = a + rng.IntN(b-a+1)
		}
	}
	return out
}

// BenchmarkSpectrum is a DMRG solve's spectrum of 2000 products:
//
//	case=tiny   every dimension 1 to 8: the small-block kernel (one launch)
//	            against one grouped cuBLAS call (vs-grouped, goal at least 3)
//	            and one batched call per shape (vs-pershape)
//	case=solve  1% of the blocks 24 to 64: the plan of Auto (kernel and
//	            cuBLAS) against one grouped call (vs-grouped)
func BenchmarkSpectrum(b *testing.B) {
	b.Run("case=tiny", func(b *testing.B) {
		g := newGemmBench(b)
		o := g.operands(b, randomShapes(2000, 1, 8, 0, 0, 0, 1))
		us, launches := g.timeRuns(b, o, gemm.Kernel)
		grouped, groupedLaunches := g.baseline(b, o, gemm.Grouped, b.N, "grouped", us)
		_, perLaunches := g.baseline(b, o, gemm.PerShape, b.N, "pershape", us)
		if err := g.eng.KernelStatus(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(launches), "launches")
		b.ReportMetric(float64(groupedLaunches), "grouped-launches")
		b.ReportMetric(float64(perLaunches), "pershape-launches")
		goal(b, "vs-grouped >= 3", grouped/us >= 3)
	})
	b.Run("case=solve", func(b *testing.B) {
		g := newGemmBench(b)
		o := g.operands(b, randomShapes(2000, 1, 8, 0.01, 24, 64, 2))
		us, launches := g.timeRuns(b, o, gemm.Auto)
		_, groupedLaunches := g.baseline(b, o, gemm.Grouped, b.N, "grouped", us)
		b.ReportMetric(float64(launches), "launches")
		b.ReportMetric(float64(groupedLaunches), "grouped-launches")
	})
}

// BenchmarkKernelCrossover: the small-block kernel against one grouped
// cuBLAS call for products whose dimensions lie in (d/2, d], d = 4 to 256:
// where vs-grouped crosses 1 is where gemm.DefaultSmallMax belongs
// (in-small-max: 1 where d is at most DefaultSmallMax, where Auto runs the
// kernel).
func BenchmarkKernelCrossover(b *testing.B) {
	for _, d := range []int{4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256} {
		b.Run(fmt.Sprintf("dim=%d", d), func(b *testing.B) {
			g := newGemmBench(b)
			// 512 products, fewer of the largest: about 2^24 multiply-adds a band at most.
			o := g.operands(b, randomShapes(min(512, max(32, (1<<24)/(d*d*d))), d/2+1, d, 0, 0, 0, uint64(d)))
			us, _ := g.timeRuns(b, o, gemm.Kernel)
			grouped, _ := g.baseline(b, o, gemm.Grouped, b.N, "grouped", us)
			b.ReportMetric(o.flops/us/1e3, "kernel-GFLOP/s")
			b.ReportMetric(o.flops/grouped/1e3, "grouped-GFLOP/s")
			inSmallMax := 0.0
			if d <= gemm.DefaultSmallMax {
				inSmallMax = 1
			}
			b.ReportMetric(inSmallMax, "in-small-max")
		})
	}
}

// BenchmarkUniformCrossover: n products of one shape d^3, the small-block
// kernel (ns/op) against one strided cuBLAS call (PerShape): where
// vs-strided crosses 1, for each d, is the run length from which Auto
// gives a uniform run to cuBLAS rather than the kernel.
func BenchmarkUniformCrossover(b *testing.B) {
	dims, counts := []int{9, 12, 16, 24, 32, 48, 64}, []int{16, 64, 256, 1024, 4096, 20000}
	if testing.Short() { // both sides of the rule, at its edges
		dims, counts = []int{16, 32}, []int{1023, 1024}
	}
	for _, d := range dims {
		for _, n := range counts {
			b.Run(fmt.Sprintf("dim=%d/n=%d", d, n), func(b *testing.B) {
				g := newGemmBench(b)
				shapes := make([][3]int, n)
				for i := range shapes {
					shapes[i] = [3]int{d, d, d}
				}
				o := g.operands(b, shapes)
				us, _ := g.timeRuns(b, o, gemm.Kernel)
				g.baseline(b, o, gemm.PerShape, b.N, "strided", us)
			})
		}
	}
}
