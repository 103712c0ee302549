package packing

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/benchtimer"
)

// mixedDescs is a DMRG-like block list: ids in list order, shapes drawn
// from a few dozen classes, a mix of dtypes.
func mixedDescs(n int, seed uint64) []Desc {
	rng := rand.New(rand.NewPCG(seed, 7))
	dims := []int{1, 2, 3, 4, 6, 8, 12, 16}
	out := make([]Desc, n)
	for i := range out {
		out[i] = Desc{ID: uint64(i)*3 + 1, DType: Float64, Rows: dims[rng.IntN(len(dims))], Cols: dims[rng.IntN(len(dims))]}
		if rng.IntN(8) == 0 {
			out[i].DType = Complex128
		}
	}
	return out
}

// tinyRowDescs is the tiny blocks of a DMRG solve cycle as devalloc's
// BenchmarkAlloc packs them (packed/touch=T; internal/allocbench): sizes
// log-uniform in [64 B, 16 KiB] rounded up to 256 B, each a float32 row, so
// Rows 1 and Cols a multiple of 64 up to 4096 (at most 64 classes), ids
// increasing from 0.
func tinyRowDescs(n int, seed uint64) []Desc {
	rng := rand.New(rand.NewPCG(seed, 11))
	lo, hi := math.Log(64), math.Log(16<<10)
	out := make([]Desc, n)
	for i := range out {
		size := int64(math.Exp(lo + rng.Float64()*(hi-lo)))
		out[i] = Desc{ID: uint64(i), DType: Float32, Rows: 1, Cols: int((size + 255) / 256 * 64)}
	}
	return out
}

// benchPlan runs build (plan plus views of every block) b.N times over n
// blocks and reports ns/block. The buffer is allocated once outside the
// loop: it is one allocator call per plan, not per block.
func benchPlan(b *testing.B, n int, shuffled bool, build func(descs []Desc, buf *devalloc.Buffer) error) {
	descs := mixedDescs(n, 1)
	if shuffled {
		// Ids in no order: the duplicate check cannot take its fast path.
		rng := rand.New(rand.NewPCG(2, 2))
		rng.Shuffle(n, func(i, j int) { descs[i].ID, descs[j].ID = descs[j].ID, descs[i].ID })
	}
	benchPlanDescs(b, descs, build)
}

func benchPlanDescs(b *testing.B, descs []Desc, build func(descs []Desc, buf *devalloc.Buffer) error) {
	n := len(descs)
	p0, err := NewPlan(descs, Options{})
	if err != nil {
		b.Fatal(err)
	}
	a := openHostBench(b)
	buf, err := a.Alloc(p0.Groups()[0].Bytes, a.DefaultStream())
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Free()
	b.ResetTimer()
	cpu0 := benchtimer.ProcessCPU()
	for range b.N {
		if err := build(descs, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/block")
	// The process's CPU time (GC included) per block: steadier than the wall
	// clock when other processes share the cores.
	b.ReportMetric(float64((benchtimer.ProcessCPU()-cpu0).Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/block")
}

// openHostBench opens a host allocator that keeps its warnings to itself,
// closed when the benchmark ends.
func openHostBench(b *testing.B) *devalloc.Allocator {
	b.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

var sink uintptr

// BenchmarkPlanViews is the plan plus one View per block whose address and
// shape are read, the way a solver walks its blocks (Coalesced.All): the
// goal is at most 15 ns/block at 1e5 blocks. BenchmarkPlanViewIndex does
// the same with the checked View(k).
func BenchmarkPlanViews(b *testing.B) {
	for _, c := range []struct {
		n        int
		shuffled bool
	}{{1000, false}, {100000, false}, {100000, true}} {
		b.Run(fmt.Sprintf("blocks=%d/shuffled-ids=%v", c.n, c.shuffled), func(b *testing.B) {
			benchPlan(b, c.n, c.shuffled, walkViews)
		})
	}
}

// planWrapped is the plan of descs over buf: the part every view benchmark
// times before it reads the views.
func planWrapped(descs []Desc, buf *devalloc.Buffer) (*Coalesced, error) {
	p, err := NewPlan(descs, Options{})
	if err != nil {
		return nil, err
	}
	return wrap(buf, 0, p, 0)
}

// walkViews is what BenchmarkPlanViews times per plan: NewPlan, then the
// address and shape of every view.
func walkViews(descs []Desc, buf *devalloc.Buffer) error {
	c, err := planWrapped(descs, buf)
	if err != nil {
		return err
	}
	for _, v := range c.All() {
		sink += v.addr() + uintptr(v.Desc().Rows*v.Desc().Cols)
	}
	return nil
}

// BenchmarkPlanTinyRows is BenchmarkPlanViews for the plan that devalloc's
// BenchmarkAlloc builds in every timed cycle of its packed replan
// measurement (the replan-* figures of packed/touch=T), and at each bond's
// first solve of the packed one (see tinyRowDescs): a few thousand blocks
// of few classes, where fixed costs count and the shapes are long rows.
// The goal is at most 5 ns/block at 2000 blocks, fixed costs included.
func BenchmarkPlanTinyRows(b *testing.B) {
	for _, n := range []int{2000, 1000} {
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			benchPlanDescs(b, tinyRowDescs(n, 1), walkViews)
		})
	}
}

func BenchmarkPlanViewIndex(b *testing.B) {
	benchPlan(b, 100000, false, func(descs []Desc, buf *devalloc.Buffer) error {
		c, err := planWrapped(descs, buf)
		if err != nil {
			return err
		}
		for k := range c.Len() {
			v, err := c.View(k)
			if err != nil {
				return err
			}
			sink += v.addr() + uintptr(v.Desc().Rows*v.Desc().Cols)
		}
		return nil
	})
}

// BenchmarkPlanViewSlice is the plan plus Views, which materialises a slice
// of every view (16 bytes per block on the heap).
func BenchmarkPlanViewSlice(b *testing.B) {
	benchPlan(b, 100000, false, func(descs []Desc, buf *devalloc.Buffer) error {
		c, err := planWrapped(descs, buf)
		if err != nil {
			return err
		}
		_, err = views(c)
		return err
	})
}

// solveDescs is the block structure of one rank's solve at the default
// workload of cmd/ranktest, n products of dimensions 1 to 8 with 1% of 24
// to 64: A (m x k) and B (k x n) as the two groups of one list, ids
// counting on from A's into B's, and C (m x n).
func solveDescs(n int, seed uint64) (ab, c []Desc) {
	rng := rand.New(rand.NewPCG(seed, 1))
	ab, c = make([]Desc, 2*n), make([]Desc, n)
	for i := range n {
		dim := func() int { return 1 + rng.IntN(8) }
		if rng.Float64() < 0.01 {
			dim = func() int { return 24 + rng.IntN(41) }
		}
		m, k, nn := dim(), dim(), dim()
		ab[i] = Desc{ID: uint64(i), DType: Float64, Rows: m, Cols: k}
		ab[n+i] = Desc{ID: uint64(n + i), DType: Float64, Rows: k, Cols: nn, Dest: 1}
		c[i] = Desc{ID: uint64(i), DType: Float64, Rows: m, Cols: nn}
	}
	return ab, c
}

// BenchmarkPlanSolve is what a solve on a fresh block structure pays in
// packing: the joined layout of its A and B operands and the layout of C,
// joined as its send buffers are, for 2000 products, over four structures
// in turn as a sweep's bonds (cpu-us is the process's CPU time per solve).
func BenchmarkPlanSolve(b *testing.B) {
	var abs, cs [][]Desc
	for s := range 4 {
		ab, c := solveDescs(2000, uint64(s))
		abs, cs = append(abs, ab), append(cs, c)
	}
	b.ReportAllocs()
	cpu0 := benchtimer.ProcessCPU()
	i := 0
	for b.Loop() {
		for _, d := range [][]Desc{abs[i%4], cs[i%4]} {
			p, err := NewPlan(d, Options{})
			if err == nil {
				_, err = p.Joined(nil)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		i++
	}
	b.ReportMetric(float64((benchtimer.ProcessCPU()-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-us")
}

// BenchmarkPlan is the plan alone.
func BenchmarkPlan(b *testing.B) {
	benchPlan(b, 100000, false, func(descs []Desc, _ *devalloc.Buffer) error {
		_, err := NewPlan(descs, Options{})
		return err
	})
}

// gatherBlocks and gatherBlockBytes size the gather benchmarks: 20000
// blocks of 4 KiB.
const gatherBlocks, gatherBlockBytes = 20000, 4096

// gatherSetup allocates the gather benchmarks' buffer and its blocks'
// scattered sources: every other 4 KiB slot of one buffer, shuffled, and
// touched once.
func gatherSetup(b *testing.B, a *devalloc.Allocator) (*Coalesced, *devalloc.Buffer, []Ref) {
	const n, size = gatherBlocks, gatherBlockBytes
	s := a.DefaultStream()
	descs := make([]Desc, n)
	for i := range descs {
		descs[i] = Desc{ID: uint64(i), DType: Float64, Rows: 16, Cols: size / 8 / 16}
	}
	p, err := NewPlan(descs, Options{})
	if err != nil {
		b.Fatal(err)
	}
	c, err := Alloc(a, p, s)
	if err != nil {
		b.Fatal(err)
	}
	src, err := a.Alloc(2*n*size, s)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Memset(src, 0, src.Size(), 1); err != nil {
		b.Fatal(err)
	}
	refs := make([]Ref, n)
	for i, j := range rand.New(rand.NewPCG(3, 3)).Perm(n) {
		refs[i] = Ref{Buf: src, Off: int64(2*j) * size}
	}
	return c, src, refs
}

// BenchmarkPackHost gathers 20000 scattered blocks of 4 KiB into one buffer
// on the host: parallel goroutines against one goroutine, in one run.
func BenchmarkPackHost(b *testing.B) {
	a := openHostBench(b)
	s := a.DefaultStream()
	c, src, refs := gatherSetup(b, a)
	m, err := newMover(s, c, refs, copyHost)
	if err != nil {
		b.Fatal(err)
	}
	pack := func(b *testing.B) {
		if err := m.Pack(s); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	// One pack before timing either variant, to fault the pages in.
	pack(b)
	parallel := m.parts
	var perWorker [2]float64
	for w, name := range []string{"workers=1", fmt.Sprintf("workers=%d", len(parallel))} {
		b.Run(name, func(b *testing.B) {
			m.parts = parallel
			if w == 0 {
				m.parts = []span{{0, gatherBlocks}}
			}
			b.SetBytes(gatherBlocks * gatherBlockBytes)
			for range b.N {
				pack(b)
			}
			perWorker[w] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if w == 1 && perWorker[0] > 0 {
				b.ReportMetric(perWorker[0]/perWorker[1], "x-vs-1-worker")
			}
		})
	}
	_ = m.Close()
	_ = src.Free()
	_ = c.Free()
}

// BenchmarkDetached is the cost of a group's layout as its receiver sees it,
// made from the plan (what a rank pays to view a new layout it sends to
// itself): the solve's spectrum of tiny blocks, ns per block.
func BenchmarkDetached(b *testing.B) {
	for _, n := range []int{2000, 20000} {
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			p, err := NewPlan(mixedDescs(n, 17), Options{})
			if err != nil {
				b.Fatal(err)
			}
			cpu0 := benchtimer.ProcessCPU()
			for b.Loop() {
				if q, err := p.Detached(0); err != nil || q.Len() != n {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/block")
			b.ReportMetric(float64((benchtimer.ProcessCPU()-cpu0).Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/block")
		})
	}
}
