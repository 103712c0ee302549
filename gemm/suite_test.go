package gemm

import (
	"fmt"
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/distbuf/distbuf/internal/alloctest"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

var (
	backends   = alloctest.Backends()
	openHost   = alloctest.OpenHost
	closeClean = alloctest.CloseClean
)

// values is a block's elements as complex128, whatever the dtype.
type values []complex128

func encode(dt packing.DType, v values) []byte {
	out := make([]byte, int64(len(v))*dt.Size())
	for i, x := range v {
		switch dt {
		case packing.Float32:
			*(*float32)(unsafe.Pointer(&out[4*i])) = float32(real(x))
		case packing.Float64:
			*(*float64)(unsafe.Pointer(&out[8*i])) = real(x)
		case packing.Complex64:
			*(*complex64)(unsafe.Pointer(&out[8*i])) = complex64(x)
		case packing.Complex128:
			*(*complex128)(unsafe.Pointer(&out[16*i])) = x
		}
	}
	return out
}

func decode(dt packing.DType, b []byte) values {
	n := int64(len(b)) / dt.Size()
	out := make(values, n)
	for i := range out {
		switch dt {
		case packing.Float32:
			out[i] = complex(float64(*(*float32)(unsafe.Pointer(&b[4*i]))), 0)
		case packing.Float64:
			out[i] = complex(*(*float64)(unsafe.Pointer(&b[8*i])), 0)
		case packing.Complex64:
			out[i] = complex128(*(*complex64)(unsafe.Pointer(&b[8*i])))
		case packing.Complex128:
			out[i] = *(*complex128)(unsafe.Pointer(&b[16*i]))
		}
	}
	return out
}

// operand is a Coalesced with the host copy of its blocks.
type operand struct {
	c    *packing.Coalesced
	vals []values
	desc []packing.Desc
}

func randValue(rng *rand.Rand, dt packing.DType) complex128 {
	re := rng.Float64()*2 - 1
	if dt.IsComplex() {
		return complex(re, rng.Float64()*2-1)
	}
	return complex(re, 0)
}

// makeOperand lays out descs, fills them with random values and packs them.
func makeOperand(t *testing.T, s *devalloc.Stream, descs []packing.Desc, rng *rand.Rand) *operand {
	return makeOperandAt(t, s, descs, rng, 0)
}

// makeOperandAt is makeOperand with the layout starting prefix bytes into
// its buffer, as in a message buffer whose manifest comes first.
func makeOperandAt(t *testing.T, s *devalloc.Stream, descs []packing.Desc, rng *rand.Rand, prefix int64) *operand {
	t.Helper()
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	return packOperand(t, s, p, 0, descs, rng, prefix)
}

// packOperand allocates group g of p prefix bytes into a buffer and packs
// random values of the blocks descs into it.
func packOperand(t *testing.T, s *devalloc.Stream, p *packing.Plan, g int, descs []packing.Desc, rng *rand.Rand, prefix int64) *operand {
	t.Helper()
	c, err := packing.Alloc(s.Allocator(), p, s, packing.AllocOptions{Group: g, Prefix: prefix})
	require.NoError(t, err)
	return fillOperand(t, s, c, descs, rng)
}

// fillOperand packs random values of the blocks descs into c.
func fillOperand(t *testing.T, s *devalloc.Stream, c *packing.Coalesced, descs []packing.Desc, rng *rand.Rand) *operand {
	t.Helper()
	op := &operand{c: c, desc: descs}
	raw := make([][]byte, len(descs))
	for k, d := range descs {
		v := make(values, d.Rows*d.Cols)
		for i := range v {
			v[i] = randValue(rng, d.DType)
		}
		op.vals = append(op.vals, v)
		raw[k] = encode(d.DType, v)
	}
	require.NoError(t, packing.PackHost(s, c, raw))
	return op
}

func (op *operand) read(t *testing.T, s *devalloc.Stream) []values {
	t.Helper()
	raw := make([][]byte, len(op.desc))
	for k, d := range op.desc {
		raw[k] = make([]byte, d.Bytes())
	}
	require.NoError(t, packing.UnpackHost(s, op.c, raw))
	require.NoError(t, s.Synchronize())
	out := make([]values, len(raw))
	for k := range raw {
		out[k] = decode(op.desc[k].DType, raw[k])
	}
	return out
}

// at reads element (r, c) of op(X) for a row-major stored block.
func at(v values, d packing.Desc, op Op, r, c int) complex128 {
	if op == Trans {
		r, c = c, r
	}
	return v[r*d.Cols+c]
}

// reference computes beta*C + sum alpha*op(A)op(B) naively for every C
// block some triple writes (the others stay as they are), and the magnitude
// sum |beta||C| + |alpha| sum |a||b| that bounds rounding errors.
func reference(pr Problem, a, b, c *operand) (ref, mag []values) {
	written := make([]bool, len(c.vals))
	for _, t := range pr.Triples {
		written[t.C] = true
	}
	for k := range c.vals {
		r := make(values, len(c.vals[k]))
		m := make(values, len(c.vals[k]))
		beta := complex(1, 0)
		if written[k] {
			beta = pr.Beta
		}
		for i, x := range c.vals[k] {
			r[i] = beta * x
			m[i] = complex(cmplx.Abs(beta)*cmplx.Abs(x), 0)
		}
		ref, mag = append(ref, r), append(mag, m)
	}
	for _, t := range pr.Triples {
		dc := c.desc[t.C]
		kk := a.desc[t.A].Cols
		if pr.TransA == Trans {
			kk = a.desc[t.A].Rows
		}
		for i := 0; i < dc.Rows; i++ {
			for j := 0; j < dc.Cols; j++ {
				var sum complex128
				var abs float64
				for l := 0; l < kk; l++ {
					x := at(a.vals[t.A], a.desc[t.A], pr.TransA, i, l) * at(b.vals[t.B], b.desc[t.B], pr.TransB, l, j)
					sum += x
					abs += cmplx.Abs(x)
				}
				ref[t.C][i*dc.Cols+j] += pr.Alpha * sum
				mag[t.C][i*dc.Cols+j] += complex(cmplx.Abs(pr.Alpha)*abs, 0)
			}
		}
	}
	return ref, mag
}

func tolerance(dt packing.DType) float64 {
	if dt == packing.Float32 || dt == packing.Complex64 {
		return 1e-5
	}
	return 1e-12
}

// sparseProblem builds a random block-sparse contraction C(i,j) +=
// A(i,l) B(l,j) over index sectors of mixed sizes (1x1 blocks included),
// with some blocks absent, so that most C blocks take several products
// (waves) and some none (an empty group).
func sparseProblem(t *testing.T, s *devalloc.Stream, dt packing.DType, ta, tb Op, seed uint64) (Problem, *operand, *operand, *operand) {
	return sparseProblemOf(t, s, dt, ta, tb, seed, []int{1, 1, 2, 3, 4, 5, 7, 8, 12}, [3]int{6, 5, 6})
}

// sparseProblemOf is sparseProblem with sector sizes drawn from choices and
// the given numbers of row, inner and column sectors.
func sparseProblemOf(t *testing.T, s *devalloc.Stream, dt packing.DType, ta, tb Op, seed uint64, choices []int, sectors [3]int) (Problem, *operand, *operand, *operand) {
	rng := rand.New(rand.NewPCG(seed, uint64(dt)))
	dims := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = choices[rng.IntN(len(choices))]
		}
		return out
	}
	di, dl, dj := dims(sectors[0]), dims(sectors[1]), dims(sectors[2])
	type key struct{ x, y int }
	aIdx, bIdx, cIdx := map[key]int{}, map[key]int{}, map[key]int{}
	var aD, bD, cD []packing.Desc
	add := func(m map[key]int, list *[]packing.Desc, k key, rows, cols int, op Op) {
		if op == Trans {
			rows, cols = cols, rows
		}
		m[k] = len(*list)
		*list = append(*list, packing.Desc{ID: uint64(len(*list) + 1), DType: dt, Rows: rows, Cols: cols})
	}
	for i := range di {
		for l := range dl {
			// Row sector 0 has no A blocks: its C blocks take no product.
			if i > 0 && rng.Float64() < 0.7 {
				add(aIdx, &aD, key{i, l}, di[i], dl[l], ta)
			}
		}
	}
	for l := range dl {
		for j := range dj {
			if rng.Float64() < 0.7 {
				add(bIdx, &bD, key{l, j}, dl[l], dj[j], tb)
			}
		}
	}
	for i := range di {
		for j := range dj {
			add(cIdx, &cD, key{i, j}, di[i], dj[j], NoTrans)
		}
	}
	var triples []Triple
	for i := range di {
		for l := range dl {
			for j := range dj {
				ai, okA := aIdx[key{i, l}]
				bi, okB := bIdx[key{l, j}]
				if okA && okB && rng.Float64() < 0.85 {
					triples = append(triples, Triple{A: ai, B: bi, C: cIdx[key{i, j}]})
				}
			}
		}
	}
	rng.Shuffle(len(triples), func(x, y int) { triples[x], triples[y] = triples[y], triples[x] })
	a := makeOperand(t, s, aD, rng)
	b := makeOperand(t, s, bD, rng)
	c := makeOperand(t, s, cD, rng)
	pr := Problem{A: a.c, B: b.c, C: c.c, TransA: ta, TransB: tb, Alpha: randValue(rng, dt), Beta: randValue(rng, dt), Triples: triples}
	return pr, a, b, c
}

func checkResult(t *testing.T, dt packing.DType, got, ref, mag []values) {
	t.Helper()
	tol := tolerance(dt)
	worst := 0.0
	for k := range ref {
		for i := range ref[k] {
			scale := real(mag[k][i])
			if scale == 0 {
				scale = math.SmallestNonzeroFloat64
			}
			e := cmplx.Abs(got[k][i]-ref[k][i]) / scale
			worst = max(worst, e)
			if !(e <= tol) { // a NaN fails too

				t.Fatalf("C block %d element %d: got %v, want %v (relative error %.3g > %g)", k, i, got[k][i], ref[k][i], e, tol)
			}
		}
	}
	t.Logf("worst relative error %.3g (tolerance %g)", worst, tol)
}

// openClean opens an allocator with open, closed clean when the test ends,
// after what the test makes on it later (an engine's cleanup runs first).
func openClean(t *testing.T, open func(*testing.T) *devalloc.Allocator) *devalloc.Allocator {
	t.Helper()
	a := open(t)
	t.Cleanup(func() { closeClean(t, a) })
	return a
}

// newEngine makes an engine on s, closed when the test ends.
func newEngine(t *testing.T, s *devalloc.Stream) *Engine {
	t.Helper()
	eng, err := NewEngine(s, EngineOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, eng.Close()) })
	return eng
}

// engineOn is newEngine, or where fake is set the CUDA engine's launch
// code on a fake cuBLAS over host memory (newFakeEngine's, with or without
// grouped calls and kernels), closed when the test ends.
func engineOn(t *testing.T, s *devalloc.Stream, fake, grouped, kernels bool) (*Engine, *fakeBLAS) {
	t.Helper()
	if !fake {
		return newEngine(t, s), nil
	}
	eng, f := newFakeEngine(s, grouped, kernels)
	t.Cleanup(func() { require.NoError(t, eng.Close()) })
	return eng, f
}

// onBackends runs test on each backend, with an engine on the allocator's
// default stream.
func onBackends(t *testing.T, test func(t *testing.T, s *devalloc.Stream, eng *Engine)) {
	for _, bc := range backends {
		t.Run(bc.Name, func(t *testing.T) {
			s := openClean(t, bc.Open).DefaultStream()
			test(t, s, newEngine(t, s))
		})
	}
}

// runChecked runs p on eng, checks C against the reference ref and mag,
// and closes p.
func runChecked(t *testing.T, eng *Engine, p *Plan, dt packing.DType, C *operand, ref, mag []values) {
	t.Helper()
	require.NoError(t, eng.Run(p))
	checkResult(t, dt, C.read(t, eng.Stream()), ref, mag)
	require.NoError(t, p.Close())
}

func freeOperands(t *testing.T, ops ...*operand) {
	t.Helper()
	for _, op := range ops {
		require.NoError(t, op.c.Free())
	}
}

var dtypes = []packing.DType{packing.Float32, packing.Float64, packing.Complex64, packing.Complex128}

// opPairs are the four pairs of operations on A and B.
var opPairs = [][2]Op{{NoTrans, NoTrans}, {Trans, NoTrans}, {NoTrans, Trans}, {Trans, Trans}}

// TestContractions is the shared correctness suite: every dtype, every
// transpose combination and every strategy, on the host, on CUDA, and on
// the CUDA engine's launch code driven through a column-major fake of
// cuBLAS on host memory (so the mapping is checked without a GPU).
func TestContractions(t *testing.T) {
	for _, bc := range append(backends, alloctest.Backend{Name: "fake-cublas", Open: openHost}) {
		t.Run(bc.Name, func(t *testing.T) {
			a := openClean(t, bc.Open)
			s := a.DefaultStream()
			run, err := a.NewStream() // a second stream: the ledger must order it after the fills
			require.NoError(t, err)
			eng, fake := engineOn(t, run, bc.Name == "fake-cublas", true, true)
			seed := uint64(1)
			for _, dt := range dtypes {
				for _, ops := range opPairs {
					for _, st := range []Strategy{Auto, Loop, PerShape, Grouped, Kernel} {
						seed++
						name := fmt.Sprintf("%v/%v%v/%v", dt, ops[0], ops[1], st)
						t.Run(name, func(t *testing.T) {
							pr, A, B, C := sparseProblem(t, s, dt, ops[0], ops[1], seed)
							ref, mag := reference(pr, A, B, C)
							p, err := NewPlan(pr, Options{Strategy: st})
							require.NoError(t, err)
							fake.track(p, A, B, C)
							sum := p.Summary()
							require.Equal(t, len(pr.Triples), sum.Problems)
							require.Greater(t, sum.Waves, 1, "the random problem repeats C blocks")
							written := map[int]bool{}
							for _, tr := range pr.Triples {
								written[tr.C] = true
							}
							require.Less(t, len(written), C.c.Len(), "some C blocks take no product (an empty group)")
							if st == Loop {
								require.Equal(t, len(pr.Triples), sum.Launches)
							}
							runChecked(t, eng, p, dt, C, ref, mag)
							freeOperands(t, A, B, C)
						})
					}
				}
			}
			if bc.Name == "cuda" {
				require.NoError(t, eng.KernelStatus(), "the small-block kernel ran (on the GPU, or the fake runtime's host version)")
				require.Zero(t, eng.Stats().SmallFallbacks)
			}
		})
	}
}

// TestContractionsSizes runs the small-block kernel's two paths (a warp for
// dimensions up to warpMax, a thread block in 64 x 64 tiles above) and
// cuBLAS on products of 1 to 70 rows and columns: every dtype and
// transpose, sizes on both sides of each path's edges.
func TestContractionsSizes(t *testing.T) {
	for _, bc := range append(backends, alloctest.Backend{Name: "fake-cublas", Open: openHost}) {
		t.Run(bc.Name, func(t *testing.T) {
			s := openClean(t, bc.Open).DefaultStream()
			eng, fake := engineOn(t, s, bc.Name == "fake-cublas", true, true)
			seed := uint64(300)
			dts, allOps := dtypes, opPairs
			if fake != nil { // the fake's element-by-element products are slow: a real and a complex type, two transposes
				dts, allOps = []packing.DType{packing.Float64, packing.Complex64}, [][2]Op{{NoTrans, Trans}, {Trans, NoTrans}}
			}
			for _, dt := range dts {
				for _, ops := range allOps {
					for _, st := range []Strategy{Auto, Kernel} {
						seed++
						t.Run(fmt.Sprintf("%v/%v%v/%v", dt, ops[0], ops[1], st), func(t *testing.T) {
							pr, A, B, C := sparseProblemOf(t, s, dt, ops[0], ops[1], seed, []int{1, 5, 16, 17, 64, 65, 70}, [3]int{4, 3, 4})
							ref, mag := reference(pr, A, B, C)
							p, err := NewPlan(pr, Options{Strategy: st})
							require.NoError(t, err)
							fake.track(p, A, B, C)
							sum := p.Summary()
							if st == Kernel {
								require.Equal(t, sum.Problems, sum.SmallProblems)
							} else {
								require.LessOrEqual(t, sum.SmallProblems, sum.Problems)
							}
							runChecked(t, eng, p, dt, C, ref, mag)
							freeOperands(t, A, B, C)
						})
					}
				}
			}
		})
	}
}

// TestSharedBuffer puts A, B and C blocks in one Coalesced.
func TestSharedBuffer(t *testing.T) {
	onBackends(t, func(t *testing.T, s *devalloc.Stream, eng *Engine) {
		rng := rand.New(rand.NewPCG(77, 1))
		descs := []packing.Desc{
			{ID: 1, DType: packing.Float64, Rows: 3, Cols: 4}, // A
			{ID: 2, DType: packing.Float64, Rows: 4, Cols: 2}, // B
			{ID: 3, DType: packing.Float64, Rows: 3, Cols: 2}, // C
			{ID: 4, DType: packing.Float64, Rows: 1, Cols: 1}, // 1x1 A
			{ID: 5, DType: packing.Float64, Rows: 1, Cols: 1}, // 1x1 B
			{ID: 6, DType: packing.Float64, Rows: 1, Cols: 1}, // 1x1 C
		}
		op := makeOperand(t, s, descs, rng)
		pr := Problem{A: op.c, B: op.c, C: op.c, Alpha: 2, Beta: 0.5, Triples: []Triple{{0, 1, 2}, {3, 4, 5}, {4, 3, 5}}}
		ref, mag := reference(pr, op, op, op)
		p, err := NewPlan(pr, Options{})
		require.NoError(t, err)
		require.NoError(t, eng.Run(p))
		got := op.read(t, s)
		checkResult(t, packing.Float64, got[2:3], ref[2:3], mag[2:3])
		checkResult(t, packing.Float64, got[5:6], ref[5:6], mag[5:6])
		require.Equal(t, op.vals[0], got[0], "inputs untouched")
		require.NoError(t, p.Close())
		require.NoError(t, op.c.Free())
	})
}

// Operands whose layouts start inside their buffers (a send buffer with its
// manifest first) are addressed from the layout's start.
func TestPrefixedOperands(t *testing.T) {
	onBackends(t, func(t *testing.T, s *devalloc.Stream, eng *Engine) {
		rng := rand.New(rand.NewPCG(78, 1))
		A := makeOperandAt(t, s, uniform(3, packing.Float64, 5, 4), rng, 256)
		B := makeOperandAt(t, s, uniform(3, packing.Float64, 4, 6), rng, 512)
		C := makeOperandAt(t, s, uniform(3, packing.Float64, 5, 6), rng, 768)
		pr := Problem{A: A.c, B: B.c, C: C.c, Alpha: 1.5, Beta: 0.25, Triples: []Triple{{0, 0, 0}, {1, 1, 1}, {2, 2, 2}}}
		ref, mag := reference(pr, A, B, C)
		for _, strategy := range []Strategy{Auto, Loop} {
			if strategy == Loop { // run again from the original C
				pr.Beta = 0
				ref, mag = reference(pr, A, B, C)
			}
			p, err := NewPlan(pr, Options{Strategy: strategy})
			require.NoError(t, err)
			runChecked(t, eng, p, packing.Float64, C, ref, mag)
		}
		freeOperands(t, A, B, C)
	})
}

// refill makes an operand laid out as op (the same packing plan and group)
// in a new buffer at another offset, with new random values.
func refill(t *testing.T, s *devalloc.Stream, op *operand, rng *rand.Rand, prefix int64) *operand {
	t.Helper()
	return packOperand(t, s, op.c.Plan(), op.c.Group(), op.desc, rng, prefix)
}

// TestRunOnNewBuffers plans once and runs the plan on other buffers with the
// same layouts and other scalars, then on the first buffers again (on CUDA
// the pointer arrays follow the addresses), and refuses operands laid out
// otherwise.
func TestRunOnNewBuffers(t *testing.T) {
	type variant struct {
		name          string
		open          func(*testing.T) *devalloc.Allocator
		fake, kernels bool
	}
	variants := []variant{{name: "fake-cublas-kernels", open: openHost, fake: true, kernels: true}, {name: "fake-cublas", open: openHost, fake: true}}
	for _, bc := range backends {
		variants = append(variants, variant{name: bc.Name, open: bc.Open})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			s := openClean(t, v.open).DefaultStream()
			eng, fake := engineOn(t, s, v.fake, true, v.kernels)
			for _, dt := range []packing.DType{packing.Float64, packing.Complex64} {
				for _, st := range []Strategy{Auto, PerShape, Grouped} {
					t.Run(fmt.Sprintf("%v/%v", dt, st), func(t *testing.T) {
						pr, A, B, C := sparseProblem(t, s, dt, Trans, NoTrans, 500+uint64(st))
						rng := rand.New(rand.NewPCG(5, uint64(st)))
						A2, B2, C2 := refill(t, s, A, rng, 512), refill(t, s, B, rng, 0), refill(t, s, C, rng, 256)
						live := []*operand{A, B, C, A2, B2, C2}
						p, err := NewPlan(pr, Options{Strategy: st})
						require.NoError(t, err)
						fake.track(p, live...)
						check := func(o Operands, a, b, c *operand) {
							t.Helper()
							q := pr
							q.A, q.B, q.C, q.Alpha, q.Beta = o.A, o.B, o.C, o.Alpha, o.Beta
							ref, mag := reference(q, a, b, c)
							require.NoError(t, eng.RunOn(p, o))
							got := c.read(t, s)
							checkResult(t, dt, got, ref, mag)
							c.vals = got
						}
						check(Operands{A: A2.c, B: B2.c, C: C2.c, Alpha: randValue(rng, dt), Beta: 0}, A2, B2, C2)
						check(Operands{A: A.c, B: B2.c, C: C.c, Alpha: randValue(rng, dt), Beta: randValue(rng, dt)}, A, B2, C)
						check(Operands{A: A2.c, B: B.c, C: C2.c, Alpha: randValue(rng, dt), Beta: 1}, A2, B, C2)
						other := makeOperand(t, s, C.desc, rng)
						require.ErrorIs(t, eng.RunOn(p, Operands{A: A.c, B: B.c, C: other.c, Alpha: 1}), errLayout)
						if !dt.IsComplex() {
							require.ErrorIs(t, eng.RunOn(p, Operands{A: A.c, B: B.c, C: C.c, Alpha: 1i}), errDType)
						}
						require.NoError(t, p.Close())
						freeOperands(t, append(live, other)...)
					})
				}
			}
			if v.fake && !v.kernels {
				require.Positive(t, eng.Stats().SmallFallbacks, "without kernels, small launches run on cuBLAS")
				require.Error(t, eng.KernelStatus())
			}
		})
	}
}

// TestRunOnTwoStreams runs one plan from engines on two streams, with the
// buffers changing between runs: the second stream must follow the first's
// undeclared use of the plan's device memory before it rewrites it.
func TestRunOnTwoStreams(t *testing.T) {
	type variant struct {
		name string
		open func(*testing.T) *devalloc.Allocator
		fake bool
	}
	variants := []variant{{name: "fake-cublas-kernels", open: openHost, fake: true}}
	for _, bc := range backends {
		variants = append(variants, variant{name: bc.Name, open: bc.Open})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			a := openClean(t, v.open)
			s1 := a.DefaultStream()
			s2, err := a.NewStream()
			require.NoError(t, err)
			var engs [2]*Engine
			var fakes []*fakeBLAS
			for i, s := range []*devalloc.Stream{s1, s2} {
				var f *fakeBLAS
				engs[i], f = engineOn(t, s, v.fake, true, true)
				if v.fake {
					fakes = append(fakes, f)
				}
			}
			pr, A, B, C := sparseProblem(t, s1, packing.Float64, NoTrans, NoTrans, 900)
			rng := rand.New(rand.NewPCG(9, 9))
			A2, B2, C2 := refill(t, s1, A, rng, 256), refill(t, s1, B, rng, 256), refill(t, s1, C, rng, 256)
			require.NoError(t, s1.Synchronize())
			p, err := NewPlan(pr, Options{Strategy: Grouped}) // pointer arrays, rebuilt for each new set of buffers
			require.NoError(t, err)
			for _, f := range fakes {
				f.buffers = func() []*devalloc.Buffer {
					out := []*devalloc.Buffer{A.c.Buffer(), B.c.Buffer(), C.c.Buffer(), A2.c.Buffer(), B2.c.Buffer(), C2.c.Buffer()}
					return append(out, p.deviceBuffers()...)
				}
			}
			// Each round runs the plan on one set of buffers from one
			// stream and at once on the other set from the other stream,
			// before either has run, then checks both.
			sets := [][3]*operand{{A, B, C}, {A2, B2, C2}}
			for round := range 8 {
				var refs, mags [2][]values
				for i, set := range sets {
					q := pr
					q.A, q.B, q.C, q.Beta = set[0].c, set[1].c, set[2].c, 1
					refs[i], mags[i] = reference(q, set[0], set[1], set[2])
				}
				// Rounds 4 to 7 run one set from the stream that did not make
				// the plan's memory, then the other from the one that did,
				// whose run may then find the arrays already rewritten.
				engOf := func(i int) *Engine {
					if round >= 4 {
						return engs[1-i]
					}
					return engs[(i+round)%2]
				}
				for i, set := range sets {
					require.NoError(t, engOf(i).RunOn(p, Operands{A: set[0].c, B: set[1].c, C: set[2].c, Alpha: pr.Alpha, Beta: 1}))
				}
				for i, set := range sets {
					got := set[2].read(t, engOf(i).Stream())
					checkResult(t, packing.Float64, got, refs[i], mags[i])
					set[2].vals = got
				}
			}
			// The stream that made the plan's memory runs the buffers whose
			// arrays the other stream has just rewritten (no rewrite of its
			// own), and runs after it on the same C.
			for range 4 {
				q := pr
				q.A, q.B, q.C, q.Beta = A2.c, B2.c, C2.c, 1
				q.Alpha *= 2 // two runs on C2 add alpha*A*B each
				ref2, mag2 := reference(q, A2, B2, C2)
				require.NoError(t, engs[1].RunOn(p, Operands{A: A.c, B: B.c, C: C.c, Alpha: pr.Alpha, Beta: 1}))
				require.NoError(t, engs[1].RunOn(p, Operands{A: A2.c, B: B2.c, C: C2.c, Alpha: pr.Alpha, Beta: 1}))
				require.NoError(t, engs[0].RunOn(p, Operands{A: A2.c, B: B2.c, C: C2.c, Alpha: pr.Alpha, Beta: 1}))
				got := C2.read(t, engs[0].Stream())
				checkResult(t, packing.Float64, got, ref2, mag2)
				C2.vals = got
				C.vals = C.read(t, engs[1].Stream())
			}
			require.NoError(t, p.Close())
			freeOperands(t, A, B, C, A2, B2, C2)
		})
	}
}

// TestContractionsManyClasses runs a few products over operands of a
// hundred shape classes each: too many pairs of classes to tabulate for so
// few products, so NewPlan numbers every product's shape on its own; the
// result and the launches must be those of the tabulated path.
func TestContractionsManyClasses(t *testing.T) {
	for _, viaCUBLAS := range []bool{false, true} {
		t.Run(fmt.Sprintf("fake-cublas=%v", viaCUBLAS), func(t *testing.T) { testManyClasses(t, viaCUBLAS) })
	}
}

// testManyClasses runs TestContractionsManyClasses on the host engine, or
// on the CUDA engine's launch code through the fake cuBLAS, where the
// grouped calls depend on the shape classes.
func testManyClasses(t *testing.T, viaCUBLAS bool) {
	s := openClean(t, openHost).DefaultStream()
	eng, fake := engineOn(t, s, viaCUBLAS, false, false) // no kernels: a pointer-array call per shape run
	rng := rand.New(rand.NewPCG(7, 7))
	const side = 10 // A block x is (x/side+1) x (x%side+1); B block y is (y/side+1) x (y%side+1)
	grid := func() []packing.Desc {
		out := make([]packing.Desc, side*side)
		for x := range out {
			out[x] = packing.Desc{ID: uint64(x), DType: packing.Float64, Rows: x/side + 1, Cols: x%side + 1}
		}
		return out
	}
	var cD []packing.Desc
	var triples []Triple
	cOf := map[[2]int]int{}
	for range 12 {
		x := rng.IntN(side * side)
		k := x%side + 1
		y := (k-1)*side + rng.IntN(3) // a few column counts, so that C blocks repeat (waves)
		m, n := x/side+1, y%side+1
		c, ok := cOf[[2]int{m, n}]
		if !ok {
			c = len(cD)
			cOf[[2]int{m, n}] = c
			cD = append(cD, packing.Desc{ID: uint64(c), DType: packing.Float64, Rows: m, Cols: n})
		}
		triples = append(triples, Triple{A: x, B: y, C: c})
	}
	A, B, C := makeOperand(t, s, grid(), rng), makeOperand(t, s, grid(), rng), makeOperand(t, s, cD, rng)
	require.Nil(t, new(planScratch).pairTable(len(A.c.Plan().Classes()), len(B.c.Plan().Classes()), len(triples)),
		"the operands have too many pairs of classes for a table")
	pr := Problem{A: A.c, B: B.c, C: C.c, Alpha: 0.5, Beta: 2, Triples: triples}
	ref, mag := reference(pr, A, B, C)
	p, err := NewPlan(pr, Options{})
	require.NoError(t, err)
	fake.track(p, A, B, C)
	require.Equal(t, len(triples), p.Summary().Problems)
	runChecked(t, eng, p, packing.Float64, C, ref, mag)
	freeOperands(t, A, B, C)
}

// TestOperandsOfOnePlan: A and B as the two parts of one joined layout, a
// plan holding both operands' classes. The products are right, and the
// table of shape classes by pair of classes counts each operand's own
// group only, so it is built where the whole plan's classes would be too
// many for it.
func TestOperandsOfOnePlan(t *testing.T) {
	a := openClean(t, openHost)
	s := a.DefaultStream()
	eng := newEngine(t, s)
	rng := rand.New(rand.NewPCG(11, 3))
	const n = 2000 // the solve's count, with its tiny blocks' dimensions
	var descs, aD, bD, cD []packing.Desc
	triples := make([]Triple, n)
	for i := range n {
		m, k, nn := 1+rng.IntN(8), 1+rng.IntN(8), 1+rng.IntN(8)
		aD = append(aD, packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: m, Cols: k})
		bD = append(bD, packing.Desc{ID: uint64(n + i), DType: packing.Float64, Rows: k, Cols: nn, Dest: 1})
		cD = append(cD, packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: m, Cols: nn})
		triples[i] = Triple{A: i, B: i, C: i}
	}
	descs = append(append(descs, aD...), bD...)
	two, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	joined, err := two.Joined(nil)
	require.NoError(t, err)
	buf, err := packing.Alloc(a, joined, s)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Free()) }()
	parts, err := buf.Parts()
	require.NoError(t, err)
	A, B := fillOperand(t, s, parts[0], aD, rng), fillOperand(t, s, parts[1], bD, rng)
	C := makeOperand(t, s, cD, rng)
	defer func() { require.NoError(t, C.c.Free()) }()

	all, groups := two.Classes(), two.Groups()
	require.Nil(t, new(planScratch).pairTable(len(all), len(all), n), "the whole plan's classes are too many for a table")
	require.NotNil(t, new(planScratch).pairTable(len(groups[0].Classes), len(groups[1].Classes), n), "each group's are not")

	pr := Problem{A: A.c, B: B.c, C: C.c, Alpha: 1.5, Triples: triples}
	ref, mag := reference(pr, A, B, C)
	p, err := NewPlan(pr, Options{})
	require.NoError(t, err)
	runChecked(t, eng, p, packing.Float64, C, ref, mag)
}

// TestBetaZeroOverwrites fills C with NaN and runs with Beta = 0: C is
// written without being read on every backend and path (products of 5 and
// 20 rows: the host's plain loops and gonum's BLAS, the kernel's warp and
// tile paths), so no NaN survives, in every dtype and pair of operations.
func TestBetaZeroOverwrites(t *testing.T) {
	onBackends(t, func(t *testing.T, s *devalloc.Stream, eng *Engine) {
		rng := rand.New(rand.NewPCG(91, 1))
		for _, dt := range dtypes {
			for _, ops := range opPairs {
				for _, st := range []Strategy{Auto, Loop} {
					t.Run(fmt.Sprintf("%v/%v%v/%v", dt, ops[0], ops[1], st), func(t *testing.T) {
						var da, db, dc []packing.Desc
						for i, d := range []int{5, 20} {
							a, b, c := productDescs(uint64(i), dt, ops, d, d+1, d+2)
							da, db, dc = append(da, a), append(db, b), append(dc, c)
						}
						A, B, C := makeOperand(t, s, da, rng), makeOperand(t, s, db, rng), makeOperand(t, s, dc, rng)
						raw := make([][]byte, len(dc))
						for k, v := range C.vals {
							for i := range v {
								v[i] = 0 // the reference's C: Beta*NaN would be NaN
							}
							nan := make(values, len(v))
							for i := range nan {
								nan[i] = complex(math.NaN(), math.NaN())
							}
							raw[k] = encode(dt, nan)
						}
						require.NoError(t, packing.PackHost(s, C.c, raw))
						pr := Problem{A: A.c, B: B.c, C: C.c, TransA: ops[0], TransB: ops[1], Alpha: 1.5, Beta: 0, Triples: []Triple{{0, 0, 0}, {1, 1, 1}}}
						ref, mag := reference(pr, A, B, C)
						p, err := NewPlan(pr, Options{Strategy: st})
						require.NoError(t, err)
						runChecked(t, eng, p, dt, C, ref, mag)
						freeOperands(t, A, B, C)
					})
				}
			}
		}
	})
}

// productDescs are the descriptors of block id of A, B and C for a product
// C (m x n) = op(A) op(B) with inner dimension k under ops: A and B stored
// transposed where their op is Trans.
func productDescs(id uint64, dt packing.DType, ops [2]Op, m, k, n int) (a, b, c packing.Desc) {
	ar, ac, br, bc := m, k, k, n
	if ops[0] == Trans {
		ar, ac = k, m
	}
	if ops[1] == Trans {
		br, bc = n, k
	}
	return packing.Desc{ID: id, DType: dt, Rows: ar, Cols: ac}, packing.Desc{ID: id, DType: dt, Rows: br, Cols: bc},
		packing.Desc{ID: id, DType: dt, Rows: m, Cols: n}
}
