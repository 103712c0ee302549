package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/internal/cublas"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/packing"
)

func init() { benches["gemm"] = benchGemm }

// benchGemm measures planned batched GEMM against its baselines, each ratio
// from the same run:
//
//	loop      one GEMM call per block (the baseline)
//	batched   the planned batch (one strided call) vs the loop and, on CUDA,
//	          vs cuBLAS strided-batched called directly (20000 x 32^3 float64
//	          on CUDA, 20000 x 8^3 on the host)
//	grouped   216 mixed shapes in one grouped call vs one batched call per shape
//	pershape  the same 216 shapes, one batched call per shape
//	spectrum  a DMRG solve's tiny blocks (2000 products, each dimension 1 to
//	          8): distbuf's small-block kernel (one launch) vs one grouped
//	          cuBLAS call vs one batched call per shape; then the whole solve
//	          spectrum (1% of the blocks 24 to 64) planned by Auto (kernel
//	          and cuBLAS) vs one grouped call
//	crossover the kernel vs one grouped call for products whose dimensions
//	          lie in (d/2, d], d = 4 to 256: where Auto's SmallMax belongs
//
// CUDA times come from events on the engine's stream; host times from the
// wall clock around Run and Synchronize. grouped, pershape, spectrum and
// crossover need cuBLAS: on the host backend they print a line saying so.
func benchGemm(c *benchContext) error {
	modes := []string{"loop", "batched", "grouped", "pershape", "spectrum", "crossover"}
	if c.cfg.mode != "" {
		if !contains(modes, c.cfg.mode) {
			return fmt.Errorf("-mode %q: gemm has modes %v", c.cfg.mode, modes)
		}
		modes = []string{c.cfg.mode}
	}
	g, err := newGemmBench(c)
	if err != nil {
		return err
	}
	defer g.close()
	for _, m := range modes {
		if err := g.run(m); err != nil {
			return fmt.Errorf("mode %s: %w", m, err)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type gemmBench struct {
	c      *benchContext
	a      *devalloc.Allocator
	s      *devalloc.Stream
	eng    *gemm.Engine
	device bool
	dev    *cudart.Device
	iters  int
}

func newGemmBench(c *benchContext) (*gemmBench, error) {
	g := &gemmBench{c: c, a: c.alloc, s: c.alloc.DefaultStream(), device: c.alloc.Kind().IsDevice(), iters: max(c.cfg.iters, 3)}
	var err error
	if g.eng, err = gemm.NewEngine(g.s, gemm.EngineOptions{}); err != nil {
		return nil, err
	}
	if g.device {
		rt, err := cudart.Load()
		if err != nil {
			return nil, err
		}
		g.dev = rt.Device(c.alloc.Device())
	}
	return g, nil
}

func (g *gemmBench) close() { _ = g.eng.Close() }

// timeUS is the median time of one call of f in microseconds over iters
// runs (after one warm-up): CUDA events around it on the device, the wall
// clock plus a stream synchronisation on the host.
func (g *gemmBench) timeUS(iters int, f func() error) (float64, error) {
	if err := f(); err != nil {
		return 0, err
	}
	if err := g.s.Synchronize(); err != nil {
		return 0, err
	}
	samples := make([]float64, 0, iters)
	for range iters {
		if !g.device {
			start := time.Now()
			if err := f(); err != nil {
				return 0, err
			}
			if err := g.s.Synchronize(); err != nil {
				return 0, err
			}
			samples = append(samples, float64(time.Since(start).Nanoseconds())/1e3)
			continue
		}
		ms, err := g.timeOnDevice(f)
		if err != nil {
			return 0, err
		}
		samples = append(samples, ms*1e3)
	}
	return median(samples), g.s.Synchronize()
}

// timeOnDevice is the device time of f's work on the bench's stream in
// milliseconds, between two timing events around it.
func (g *gemmBench) timeOnDevice(f func() error) (ms float64, err error) {
	var ev [2]cudart.Event
	defer func() {
		for _, e := range ev {
			if e != 0 {
				err = errors.Join(err, g.dev.EventDestroy(e))
			}
		}
	}()
	for i := range ev {
		if ev[i], err = g.dev.EventCreateTiming(); err != nil {
			return 0, err
		}
	}
	s := cudart.Stream(g.s.Handle())
	if err := g.dev.EventRecord(ev[0], s); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := g.dev.EventRecord(ev[1], s); err != nil {
		return 0, err
	}
	if err := g.dev.EventSynchronize(ev[1]); err != nil {
		return 0, err
	}
	return g.dev.EventElapsedTime(ev[0], ev[1])
}

// operands lays out the A, B and C blocks of the given (m, n, k) problems,
// zero-filled, with the triples in order.
type operands struct {
	A, B, C *packing.Coalesced
	triples []gemm.Triple
	flops   float64
}

func (g *gemmBench) operands(shapes [][3]int) (*operands, error) {
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
			return nil, err
		}
		co, err := packing.Alloc(g.a, p, g.s)
		if err != nil {
			return nil, err
		}
		if err := g.s.Memset(co.Buffer(), 0, co.Buffer().Size(), 0); err != nil {
			return nil, err
		}
		out = append(out, co)
	}
	o.A, o.B, o.C = out[0], out[1], out[2]
	return o, nil
}

func (o *operands) free() {
	for _, c := range []*packing.Coalesced{o.A, o.B, o.C} {
		_ = c.Free()
	}
}

func (g *gemmBench) plan(o *operands, st gemm.Strategy) (*gemm.Plan, error) {
	return gemm.NewPlan(gemm.Problem{A: o.A, B: o.B, C: o.C, Alpha: 1, Beta: 1, Triples: o.triples}, gemm.Options{Strategy: st})
}

// timePlan times one Run of the plan and reports its launches.
func (g *gemmBench) timePlan(o *operands, st gemm.Strategy, iters int) (us float64, launches int, err error) {
	p, err := g.plan(o, st)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = p.Close() }()
	us, err = g.timeUS(iters, func() error { return g.eng.Run(p) })
	return us, p.Launches(), err
}

func (g *gemmBench) uniformShapes() ([][3]int, int) {
	n, dim := 20000, 32
	if !g.device {
		// On the host a 32^3 product costs microseconds and the loop's
		// per-call cost disappears in it; 8^3 blocks show what batching
		// removes, as launches do on the GPU.
		dim = 8
	}
	shapes := make([][3]int, n)
	for i := range shapes {
		shapes[i] = [3]int{dim, dim, dim}
	}
	return shapes, dim
}

// mixedShapes is 216 shapes, (m, n, k) over six sizes each, 32 products per shape.
func mixedShapes() [][3]int {
	dims := []int{8, 16, 24, 32, 48, 64}
	var out [][3]int
	for _, m := range dims {
		for _, n := range dims {
			for _, k := range dims {
				for range 32 {
					out = append(out, [3]int{m, n, k})
				}
			}
		}
	}
	return out
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

// compare times the same operands under several strategies, in turns, and
// returns the medians in the order given.
func (g *gemmBench) compare(o *operands, sts ...gemm.Strategy) ([]float64, []int, error) {
	us := make([]float64, len(sts))
	launches := make([]int, len(sts))
	for i, st := range sts {
		var err error
		if us[i], launches[i], err = g.timePlan(o, st, g.iters); err != nil {
			return nil, nil, fmt.Errorf("%v: %w", st, err)
		}
	}
	return us, launches, nil
}

func (g *gemmBench) run(mode string) error {
	if !g.device && mode != "loop" && mode != "batched" {
		return g.c.emit(benchResult{Bench: "gemm", Mode: mode, Extra: map[string]any{
			"skipped": "needs CUDA: grouped and per-shape batched calls are cuBLAS launches, and the small-block kernel runs on the GPU; the host backend runs every plan as parallel host GEMM calls",
		}})
	}
	switch mode {
	case "spectrum":
		tiny := randomShapes(2000, 1, 8, 0, 0, 0, 1)
		o, err := g.operands(tiny)
		if err != nil {
			return err
		}
		us, launches, err := g.compare(o, gemm.Kernel, gemm.Grouped, gemm.PerShape)
		o.free()
		if err != nil {
			return err
		}
		if err := g.eng.KernelStatus(); err != nil {
			return err
		}
		if err := g.c.emit(benchResult{Bench: "gemm", Mode: mode, N: len(tiny), MedianUS: us[0], Extra: map[string]any{
			"case": "tiny", "dims": "1-8", "dtype": "float64", "timer": g.timer(), "launches": launches[0],
			"grouped_us": us[1], "grouped_launches": launches[1], "pershape_us": us[2], "pershape_launches": launches[2],
			"ratio_grouped_vs_kernel": us[1] / us[0], "ratio_pershape_vs_kernel": us[2] / us[0], "goal_ratio_grouped_vs_kernel": 3,
		}}); err != nil {
			return err
		}
		solve := randomShapes(2000, 1, 8, 0.01, 24, 64, 2)
		if o, err = g.operands(solve); err != nil {
			return err
		}
		defer o.free()
		if us, launches, err = g.compare(o, gemm.Auto, gemm.Grouped); err != nil {
			return err
		}
		return g.c.emit(benchResult{Bench: "gemm", Mode: mode, N: len(solve), MedianUS: us[0], Extra: map[string]any{
			"case": "solve", "dims": "1-8, 1% 24-64", "dtype": "float64", "timer": g.timer(), "strategy": "auto", "small_max": gemm.DefaultSmallMax,
			"launches": launches[0], "grouped_us": us[1], "grouped_launches": launches[1], "ratio_grouped_vs_auto": us[1] / us[0],
		}})
	case "crossover":
		for _, d := range []int{4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256} {
			// 512 products, fewer of the largest: about 2^24 multiply-adds a band at most.
			shapes := randomShapes(min(512, max(32, (1<<24)/(d*d*d))), d/2+1, d, 0, 0, 0, uint64(d))
			o, err := g.operands(shapes)
			if err != nil {
				return err
			}
			us, _, err := g.compare(o, gemm.Kernel, gemm.Grouped)
			o.free()
			if err != nil {
				return err
			}
			if err := g.c.emit(benchResult{Bench: "gemm", Mode: mode, N: len(shapes), MedianUS: us[0], Extra: map[string]any{
				"dims": fmt.Sprintf("%d-%d", d/2+1, d), "max_dim": d, "dtype": "float64", "timer": g.timer(),
				"kernel_us": us[0], "grouped_us": us[1], "ratio_grouped_vs_kernel": us[1] / us[0], "kernel_gflops": o.flops / us[0] / 1e3,
				"grouped_gflops": o.flops / us[1] / 1e3, "in_small_max": d <= gemm.DefaultSmallMax,
			}}); err != nil {
				return err
			}
		}
		return nil
	case "loop", "batched":
		shapes, dim := g.uniformShapes()
		o, err := g.operands(shapes)
		if err != nil {
			return err
		}
		defer o.free()
		loopIters := g.iters
		if g.device {
			loopIters = min(g.iters, 5) // 20000 launches take about 0.2 s each time
		}
		loopUS, loopLaunches, err := g.timePlan(o, gemm.Loop, loopIters)
		if err != nil {
			return err
		}
		extra := map[string]any{"m": dim, "n": dim, "k": dim, "dtype": "float64", "timer": g.timer()}
		if mode == "loop" {
			extra["launches"] = loopLaunches
			extra["gflops"] = o.flops / loopUS / 1e3
			return g.c.emit(benchResult{Bench: "gemm", Mode: mode, N: len(shapes), MedianUS: loopUS, Extra: extra})
		}
		us, launches, err := g.timePlan(o, gemm.Auto, g.iters)
		if err != nil {
			return err
		}
		extra["launches"] = launches
		extra["gemm_launches"] = launches
		extra["loop_us"] = loopUS
		extra["loop_launches"] = loopLaunches
		extra["ratio_vs_loop"] = loopUS / us
		extra["gflops"] = o.flops / us / 1e3
		if g.device {
			extra["goal_ratio_vs_loop"] = 1000
			direct, err := g.directStrided(o, dim, len(shapes))
			if err != nil {
				return err
			}
			extra["strided_direct_us"] = direct
			extra["ratio_vs_strided_direct"] = us / direct
			extra["goal_ratio_vs_strided_direct_max"] = 1.1
		}
		return g.c.emit(benchResult{Bench: "gemm", Mode: mode, N: len(shapes), MedianUS: us, Extra: extra})
	case "grouped", "pershape":
		shapes := mixedShapes()
		o, err := g.operands(shapes)
		if err != nil {
			return err
		}
		defer o.free()
		perUS, perLaunches, err := g.timePlan(o, gemm.PerShape, g.iters)
		if err != nil {
			return err
		}
		extra := map[string]any{"shapes": 216, "dtype": "float64", "timer": g.timer()}
		if mode == "pershape" {
			extra["launches"] = perLaunches
			extra["gemm_launches"] = perLaunches
			return g.c.emit(benchResult{Bench: "gemm", Mode: mode, N: len(shapes), MedianUS: perUS, Extra: extra})
		}
		us, launches, err := g.timePlan(o, gemm.Grouped, g.iters)
		if err != nil {
			return err
		}
		st := g.eng.Stats()
		extra["launches"] = launches
		extra["gemm_launches"] = launches
		extra["pershape_us"] = perUS
		extra["pershape_launches"] = perLaunches
		extra["ratio_vs_pershape"] = perUS / us
		extra["goal_ratio_vs_pershape"] = 2
		extra["grouped_fallbacks"] = st.GroupedFallbacks
		return g.c.emit(benchResult{Bench: "gemm", Mode: mode, N: len(shapes), MedianUS: us, Extra: extra})
	}
	return fmt.Errorf("unknown mode %q", mode)
}

func (g *gemmBench) timer() string {
	if g.device {
		return "cuda-events"
	}
	return "wall-clock"
}

// directStrided times one cublasDgemmStridedBatched on the same buffers,
// without the planner, the engine or the ledger: the ceiling the planned
// batch is held to.
func (g *gemmBench) directStrided(o *operands, dim, n int) (float64, error) {
	lib, err := cublas.Load()
	if err != nil {
		return 0, err
	}
	h, err := lib.NewHandle(g.a.Device(), g.s.Handle(), false)
	if err != nil {
		return 0, err
	}
	defer func() { _ = h.Destroy() }()
	var addr [3]uintptr
	for i, c := range []*packing.Coalesced{o.A, o.B, o.C} {
		if addr[i], err = c.Buffer().Addr(); err != nil {
			return 0, err
		}
	}
	stride := int64(dim * dim)
	return g.timeUS(g.iters, func() error {
		return h.GemmStrided(cublas.D, cublas.N, cublas.N, dim, dim, dim, 1, addr[1], dim, stride, addr[0], dim, stride, 1, addr[2], dim, stride, n)
	})
}
