package gemm

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/hostblas"
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
			tr := make([]Triple, c.n)
			for i := range tr {
				tr[i] = Triple{i, i, i}
			}
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
	tr := make([]Triple, n)
	for i := range tr {
		tr[i] = Triple{i, i, i}
	}
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
			for b.Loop() {
				p, err := NewPlan(pr, Options{})
				if err != nil {
					b.Fatal(err)
				}
				_ = p.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/block")
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

// BenchmarkHostGemm is the host GEMM alone: every product of a plan run in
// order on one goroutine, as one wave of the host engine runs them below
// its parallel threshold. The workloads are the solve's spectrum (2000
// blocks of dimensions 1 to 8, one in a hundred of 24 to 64) in each dtype
// and, in float64, each pair of operations; and 2000 float64 products of
// uniform size 8, 32 and 64. ns/product is the mean over the products, and
// cpu-ns/product the same in the thread's CPU time, which a busy machine
// disturbs less;
// GFLOP/s counts a complex multiply-add as eight real operations.
func BenchmarkHostGemm(b *testing.B) {
	type workload struct {
		name   string
		dt     packing.DType
		ta, tb Op
		dim    func(rng *rand.Rand) int
	}
	spectrum := func(rng *rand.Rand) int {
		if rng.Float64() < 0.01 {
			return 24 + rng.IntN(41)
		}
		return 1 + rng.IntN(8)
	}
	fixed := func(d int) func(*rand.Rand) int { return func(*rand.Rand) int { return d } }
	var cases []workload
	for _, dt := range []packing.DType{packing.Float32, packing.Float64, packing.Complex64, packing.Complex128} {
		cases = append(cases, workload{"solve/" + dt.String() + "/NN", dt, NoTrans, NoTrans, spectrum})
	}
	for _, ops := range [][2]Op{{Trans, NoTrans}, {NoTrans, Trans}, {Trans, Trans}} {
		cases = append(cases, workload{"solve/float64/" + ops[0].String() + ops[1].String(), packing.Float64, ops[0], ops[1], spectrum})
	}
	for _, d := range []int{8, 32, 64} {
		cases = append(cases, workload{fmt.Sprintf("dim=%d/float64/NN", d), packing.Float64, NoTrans, NoTrans, fixed(d)})
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
			for i := range n {
				m, k, nn := w.dim(rng), w.dim(rng), w.dim(rng)
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
			tr := make([]Triple, n)
			for i := range tr {
				tr[i] = Triple{i, i, i}
			}
			p, err := NewPlan(Problem{A: ops[0], B: ops[1], C: ops[2], TransA: w.ta, TransB: w.tb, Alpha: 1, Beta: 1, Triples: tr}, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			x, err := newHostGemm(p, Operands{A: ops[0], B: ops[1], C: ops[2], Alpha: 1, Beta: 1})
			if err != nil {
				b.Fatal(err)
			}
			// The operands are only read here: the stream has nothing else
			// queued, and the benchmark holds the memory until the end.
			if err := s.Synchronize(); err != nil {
				b.Fatal(err)
			}
			var w hostblas.Workspace
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU(b)
			for b.Loop() {
				for i := range p.problems {
					x.run(&p.problems[i], 1, &w)
				}
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns/n, "ns/product")
			b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N)/n, "cpu-ns/product")
			b.ReportMetric(float64(flops)/ns, "GFLOP/s")
		})
	}
}

// threadCPU is the CPU time the calling thread has used, in nanoseconds.
func threadCPU(b *testing.B) int64 {
	const rusageThread = 1 // RUSAGE_THREAD (Linux)
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		b.Skipf("no per-thread CPU time: %v", err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
