package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/benchtimer"
	"github.com/distbuf/distbuf/packing"
)

// BenchmarkHostBatch compares, in one run, the planned batch (one stream
// function per wave, products in parallel) with the per-block loop (one
// stream function per product) on the host backend, for n products of
// m = n = k = dim in float64.
func BenchmarkHostBatch(b *testing.B) {
	for _, c := range []struct{ n, dim int }{{20000, 8}, {2000, 32}} {
		b.Run(fmt.Sprintf("blocks=%d/dim=%d", c.n, c.dim), func(b *testing.B) {
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			s := a.DefaultStream()
			mk := func() *packing.Coalesced {
				p, err := packing.NewPlan(uniform(c.n, packing.Float64, c.dim, c.dim), packing.Options{})
				if err != nil {
					b.Fatal(err)
				}
				co, err := packing.Alloc(a, p, s)
				if err != nil {
					b.Fatal(err)
				}
				return co
			}
			A, B, C := mk(), mk(), mk()
			for _, co := range []*packing.Coalesced{A, B, C} {
				if err := s.Memset(co.Buffer(), 0, co.Buffer().Size(), 0); err != nil {
					b.Fatal(err)
				}
			}
			tr := diagonal(c.n)
			eng, err := NewEngine(s, EngineOptions{})
			if err != nil {
				b.Fatal(err)
			}
			var loopNS float64
			for _, st := range []Strategy{Loop, Auto} {
				p, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Beta: 1, Triples: tr}, Options{Strategy: st})
				if err != nil {
					b.Fatal(err)
				}
				if err := eng.Run(p); err != nil { // warm up: touch every page
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
				b.Run("strategy="+st.String(), func(b *testing.B) {
					for range b.N {
						if err := eng.Run(p); err != nil {
							b.Fatal(err)
						}
						if err := s.Synchronize(); err != nil {
							b.Fatal(err)
						}
					}
					ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
					b.ReportMetric(float64(p.Launches()), "launches")
					b.ReportMetric(float64(2*c.n*c.dim*c.dim*c.dim)/ns, "GFLOP/s")
					if st == Loop {
						loopNS = ns
					} else if loopNS > 0 {
						b.ReportMetric(loopNS/ns, "x-vs-loop")
					}
				})
				_ = p.Close()
			}
			_ = eng.Close()
			for _, co := range []*packing.Coalesced{A, B, C} {
				_ = co.Free()
			}
		})
	}
}

// solveSpectrum is the block list of a DMRG-like solve: dimensions 1 to 8,
// and one block in a hundred of 24 to 64 (cmd/ranktest's default workload).
func solveSpectrum(n int, seed uint64) (a, b, c []packing.Desc) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range n {
		dim := func() int { return 1 + rng.IntN(8) }
		if rng.Float64() < 0.01 {
			dim = func() int { return 24 + rng.IntN(41) }
		}
		m, k, nn := dim(), dim(), dim()
		id := uint64(i)
		a = append(a, packing.Desc{ID: id, DType: packing.Float64, Rows: m, Cols: k})
		b = append(b, packing.Desc{ID: id, DType: packing.Float64, Rows: k, Cols: nn})
		c = append(c, packing.Desc{ID: id, DType: packing.Float64, Rows: m, Cols: nn})
	}
	return a, b, c
}

// spectrumProblem is the solve's spectrum of n blocks allocated on a's
// default stream, block i of C the product of blocks i of A and B, and
// the function that frees its buffers (before a is closed).
func spectrumProblem(b *testing.B, a *devalloc.Allocator, n int) (Problem, func()) {
	da, db, dc := solveSpectrum(n, 1)
	var ops [3]*packing.Coalesced
	free := func() {
		for _, c := range ops {
			if c != nil {
				_ = c.Free()
			}
		}
	}
	for i, d := range [][]packing.Desc{da, db, dc} {
		p, err := packing.NewPlan(d, packing.Options{})
		if err == nil {
			ops[i], err = packing.Alloc(a, p, a.DefaultStream())
		}
		if err != nil {
			free()
			b.Fatal(err)
		}
	}
	tr := diagonal(n)
	return Problem{A: ops[0], B: ops[1], C: ops[2], Alpha: 1, Triples: tr}, free
}

// BenchmarkPlan is the cost of a fresh plan (NewPlan) for the solve's
// spectrum, per block: what a solver pays when its block structure changes.
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{2000, 20000} {
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			pr, free := spectrumProblem(b, a, n)
			defer free()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := benchtimer.ProcessCPU()
			for b.Loop() {
				p, err := NewPlan(pr, Options{})
				if err != nil {
					b.Fatal(err)
				}
				_ = p.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/block")
			b.ReportMetric(float64((benchtimer.ProcessCPU()-cpu0).Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/block")
		})
	}
}

// BenchmarkRunOn is the host's cost of running a planned solve-spectrum
// contraction on its buffers (enqueue_us: RunOn alone; ns/op adds the
// wait for the result), by backend and strategy: what a solve pays per
// GEMM phase once its plan exists. The CUDA backend is skipped without a GPU.
func BenchmarkRunOn(b *testing.B) {
	for _, backend := range []devalloc.Backend{devalloc.BackendHost, devalloc.BackendCUDA} {
		for _, st := range []Strategy{Auto, Grouped} {
			b.Run(fmt.Sprintf("backend=%v/strategy=%v", backend, st), func(b *testing.B) {
				a, err := devalloc.Open(devalloc.Options{Backend: backend, Warn: func(string) {}})
				if err != nil {
					b.Skipf("backend %v: %v", backend, err)
				}
				defer a.Close()
				s := a.DefaultStream()
				eng, err := NewEngine(s, EngineOptions{})
				if err != nil {
					b.Fatal(err)
				}
				defer eng.Close()
				pr, free := spectrumProblem(b, a, 2000)
				defer free()
				p, err := NewPlan(pr, Options{Strategy: st})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				o := Operands{A: pr.A, B: pr.B, C: pr.C, Alpha: 1}
				if err := eng.RunOn(p, o); err != nil { // first run: uploads the stack, loads the kernel
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
				var enqueue time.Duration
				for b.Loop() {
					t0 := time.Now()
					if err := eng.RunOn(p, o); err != nil {
						b.Fatal(err)
					}
					enqueue += time.Since(t0)
					if err := s.Synchronize(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(enqueue.Nanoseconds())/1e3/float64(b.N), "enqueue_us")
				b.ReportMetric(float64(p.Launches()), "launches")
			})
		}
	}
}

// BenchmarkEncodeStack is the host's part of a fresh plan's first run on
// CUDA: the parameter stack of 2000 products written for its upload.
func BenchmarkEncodeStack(b *testing.B) {
	probs := make([]problem, 2000)
	for i := range probs {
		probs[i] = problem{a: int64(64 * i), b: int64(128 * i), c: int64(32 * i), m: 4, n: 2, k: 8, lda: 8, ldb: 2, tripleIdx: int32(i)}
	}
	dst := make([]byte, stackEntryBytes*len(probs))
	for b.Loop() {
		encodeStack(dst, probs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(probs)), "ns/entry")
}

// BenchmarkHostGemm is the host GEMM alone, per shape class: every
// product of a plan run in order on one goroutine, as one wave of the host
// engine runs them below its parallel threshold. The classes are the
// solve's spectrum (2000 blocks of dimensions 1 to 8, one in a hundred of
// 24 to 64) in each dtype and, in float64, each pair of operations; the
// spectrum's tiny blocks alone and its large ones alone; 2000 products of
// one size d, d = 1 to 16 in each dtype and 32 and 64 in float64.
//
// Each iteration runs the products by the engine's path and, in turns with
// it, by another: where some products take the plain loops (every
// dimension at most hostTinyMax), by gonum's BLAS alone, vs-gonum being the
// median of the ratios engine/gonum (below 1 the loops pay, the goal); in
// the other classes of size up to 16, by the loops alone, loops-vs-gonum
// being loops/engine (where it is above 1 the edge is right). ns/product is
// the engine's path, mean over the products; GFLOP/s counts a complex
// multiply-add as eight real operations.
func BenchmarkHostGemm(b *testing.B) {
	type workload struct {
		name   string
		dt     packing.DType
		ta, tb Op
		dim    func(rng *rand.Rand) int
		loops  bool // also time the plain loops where gonum runs
	}
	within := func(lo, hi int) func(*rand.Rand) int {
		return func(rng *rand.Rand) int { return lo + rng.IntN(hi-lo+1) }
	}
	spectrum := func(rng *rand.Rand) int {
		if rng.Float64() < 0.01 {
			return 24 + rng.IntN(41)
		}
		return 1 + rng.IntN(8)
	}
	fixed := func(d int) func(*rand.Rand) int { return func(*rand.Rand) int { return d } }
	dtypes := []packing.DType{packing.Float32, packing.Float64, packing.Complex64, packing.Complex128}
	var cases []workload
	for _, dt := range dtypes {
		cases = append(cases, workload{"class=solve/" + dt.String() + "/NN", dt, NoTrans, NoTrans, spectrum, false})
	}
	for _, ops := range [][2]Op{{Trans, NoTrans}, {NoTrans, Trans}, {Trans, Trans}} {
		cases = append(cases, workload{"class=solve/float64/" + ops[0].String() + ops[1].String(), packing.Float64, ops[0], ops[1], spectrum, false})
	}
	cases = append(cases,
		workload{"class=solve-tiny/float64/NN", packing.Float64, NoTrans, NoTrans, within(1, 8), false},
		workload{"class=solve-large/float64/NN", packing.Float64, NoTrans, NoTrans, within(24, 64), false})
	for _, dt := range dtypes {
		for _, d := range []int{1, 2, 4, 7, 8, 9, 16} {
			cases = append(cases, workload{fmt.Sprintf("class=dim-%d/%v/NN", d, dt), dt, NoTrans, NoTrans, fixed(d), true})
		}
	}
	for _, d := range []int{32, 64} {
		cases = append(cases, workload{fmt.Sprintf("class=dim-%d/float64/NN", d), packing.Float64, NoTrans, NoTrans, fixed(d), false})
	}
	const n = 2000
	for _, w := range cases {
		b.Run(w.name, func(b *testing.B) {
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			s := a.DefaultStream()
			rng := rand.New(rand.NewPCG(1, 1))
			var da, db, dc []packing.Desc
			var flops int64
			tiny := false
			for i := range n {
				m, k, nn := w.dim(rng), w.dim(rng), w.dim(rng)
				tiny = tiny || max(m, k, nn) <= int(hostTinyMax(w.dt))
				ar, ac := m, k
				if w.ta == Trans {
					ar, ac = k, m
				}
				br, bc := k, nn
				if w.tb == Trans {
					br, bc = nn, k
				}
				id := uint64(i)
				da = append(da, packing.Desc{ID: id, DType: w.dt, Rows: ar, Cols: ac})
				db = append(db, packing.Desc{ID: id, DType: w.dt, Rows: br, Cols: bc})
				dc = append(dc, packing.Desc{ID: id, DType: w.dt, Rows: m, Cols: nn})
				flops += int64(2 * m * k * nn)
				if w.dt.IsComplex() { // a complex multiply-add is four real ones
					flops += int64(6 * m * k * nn)
				}
			}
			var ops [3]*packing.Coalesced
			for i, d := range [][]packing.Desc{da, db, dc} {
				p, err := packing.NewPlan(d, packing.Options{})
				if err != nil {
					b.Fatal(err)
				}
				if ops[i], err = packing.Alloc(a, p, s); err != nil {
					b.Fatal(err)
				}
				defer ops[i].Free()
				err = ops[i].OnHost(s, devalloc.Write, func(h *packing.HostBlocks) error {
					for k := range h.Len() {
						raw, err := h.Bytes(k)
						if err != nil {
							return err
						}
						v := make(values, int64(len(raw))/w.dt.Size())
						for j := range v {
							v[j] = randValue(rng, w.dt)
						}
						copy(raw, encode(w.dt, v))
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			tr := diagonal(n)
			p, err := NewPlan(Problem{A: ops[0], B: ops[1], C: ops[2], TransA: w.ta, TransB: w.tb, Alpha: 1, Beta: 1, Triples: tr}, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			x, err := newHostGemm(p, Operands{A: ops[0], B: ops[1], C: ops[2], Alpha: 1, Beta: 1})
			if err != nil {
				b.Fatal(err)
			}
			// other runs in turns with the engine's path: gonum alone where
			// the engine takes the plain loops, the loops alone in the other
			// classes of size up to 16.
			other, metric := x, ""
			switch {
			case tiny:
				other.tinyMax, metric = 0, "vs-gonum"
			case w.loops:
				other.tinyMax, metric = math.MaxInt32, "loops-vs-gonum"
			}
			// The operands are only read here: the stream has nothing else
			// queued, and the benchmark holds the memory until the end.
			if err := s.Synchronize(); err != nil {
				b.Fatal(err)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			timed := func(x hostGemm) time.Duration {
				t0 := time.Now()
				x.products(p.problems, 1)
				return time.Since(t0)
			}
			var own, theirs time.Duration
			var ratios []float64
			for i := 0; b.Loop(); i++ {
				if metric == "" {
					own += timed(x)
					continue
				}
				// Each goes first in every other iteration: neither
				// always finds the other's operands in cache.
				var t, o time.Duration
				if i%2 == 0 {
					t, o = timed(x), timed(other)
				} else {
					o, t = timed(other), timed(x)
				}
				own, theirs = own+t, theirs+o
				if tiny {
					ratios = append(ratios, float64(t)/float64(o))
				} else {
					ratios = append(ratios, float64(o)/float64(t))
				}
			}
			ns := float64(own.Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns/n, "ns/product")
			b.ReportMetric(float64(flops)/ns, "GFLOP/s")
			if metric != "" {
				r := benchtimer.Median(ratios)
				b.ReportMetric(r, metric)
				if tiny {
					b.ReportMetric(float64(theirs.Nanoseconds())/float64(b.N)/n, "gonum-ns/product")
					b.Logf("goal vs-gonum < 1 (the plain loops run only where they pay): %s", map[bool]string{true: "met", false: "MISSED"}[r < 1])
				}
			}
		})
	}
}
