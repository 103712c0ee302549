package gemm

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

func uniform(n int, dt packing.DType, rows, cols int) []packing.Desc {
	out := make([]packing.Desc, n)
	for i := range out {
		out[i] = packing.Desc{ID: uint64(i), DType: dt, Rows: rows, Cols: cols}
	}
	return out
}

// diagonal is n triples {i, i, i}: C block i takes the product of A and B
// blocks i.
func diagonal(n int) []Triple {
	tr := make([]Triple, n)
	for i := range tr {
		tr[i] = Triple{i, i, i}
	}
	return tr
}

// uniformOperands are the A, B and C of count float64 products of one
// shape, C (m x n) = A (m x k) B (k x n), block i of each for product i.
func uniformOperands(t *testing.T, a *devalloc.Allocator, count, m, k, n int) (A, B, C *packing.Coalesced) {
	t.Helper()
	return alloc(t, a, uniform(count, packing.Float64, m, k)), alloc(t, a, uniform(count, packing.Float64, k, n)), alloc(t, a, uniform(count, packing.Float64, m, n))
}

func alloc(t *testing.T, a *devalloc.Allocator, descs []packing.Desc) *packing.Coalesced {
	t.Helper()
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	c, err := packing.Alloc(a, p, a.DefaultStream())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Free() })
	return c
}

func TestPlanLaunchCounts(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	const n = 2000
	A, B, C := uniformOperands(t, a, n, 4, 5, 6)
	diag := diagonal(n)
	plan := func(tr []Triple, st Strategy) Summary {
		t.Helper()
		p, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Triples: tr}, Options{Strategy: st, SmallMax: -1})
		require.NoError(t, err)
		require.Equal(t, p.Summary().Launches, p.Launches())
		return p.Summary()
	}
	// cuBLAS's share, with the small-block kernel off.
	// One shape class at constant strides: one strided call, whatever the strategy.
	for _, st := range []Strategy{Auto, PerShape, Grouped} {
		s := plan(diag, st)
		want := Summary{Problems: n, Waves: 1, Launches: 1, Strided: 1}
		if st == Grouped {
			want = Summary{Problems: n, Waves: 1, Launches: 1, Grouped: 1}
		}
		require.Equal(t, want, s, st.String())
	}
	require.Equal(t, Summary{Problems: n, Waves: 1, Launches: n, Single: n}, plan(diag, Loop))
	// Same shape at shuffled offsets: one pointer-array call.
	shuffled := append([]Triple(nil), diag...)
	rand.New(rand.NewPCG(1, 1)).Shuffle(n, func(i, j int) { shuffled[i].C, shuffled[j].C = shuffled[j].C, shuffled[i].C })
	require.Equal(t, Summary{Problems: n, Waves: 1, Launches: 1, Pointers: 1}, plan(shuffled, Auto))
	// One A block against every B block: stride 0 for A is still strided.
	bcast := make([]Triple, n)
	for i := range bcast {
		bcast[i] = Triple{0, i, i}
	}
	require.Equal(t, Summary{Problems: n, Waves: 1, Launches: 1, Strided: 1}, plan(bcast, Auto))
	// Every product into C block 0: n waves of one product each.
	same := make([]Triple, 5)
	for i := range same {
		same[i] = Triple{i, i, 0}
	}
	require.Equal(t, Summary{Problems: 5, Waves: 5, Launches: 5, Strided: 5}, plan(same, Auto))
	require.Equal(t, Summary{}, plan(nil, Auto), "an empty list is no launch")
}

func TestPlanMixedShapes(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	for _, dt := range []packing.DType{packing.Float64, packing.Complex128} {
		// 3 shapes (m, n, k), 10 products each, all in one wave.
		var aD, bD, cD []packing.Desc
		var tr []Triple
		for s, shape := range [][3]int{{2, 3, 4}, {5, 1, 2}, {3, 3, 3}} {
			for i := range 10 {
				id := uint64(s*10 + i)
				aD = append(aD, packing.Desc{ID: id, DType: dt, Rows: shape[0], Cols: shape[2]})
				bD = append(bD, packing.Desc{ID: id, DType: dt, Rows: shape[2], Cols: shape[1]})
				cD = append(cD, packing.Desc{ID: id, DType: dt, Rows: shape[0], Cols: shape[1]})
				tr = append(tr, Triple{int(id), int(id), int(id)})
			}
		}
		rand.New(rand.NewPCG(2, 2)).Shuffle(len(tr), func(i, j int) { tr[i], tr[j] = tr[j], tr[i] })
		pr := Problem{A: alloc(t, a, aD), B: alloc(t, a, bD), C: alloc(t, a, cD), Alpha: 1, Triples: tr}
		get := func(st Strategy) Summary {
			p, err := NewPlan(pr, Options{Strategy: st, SmallMax: -1})
			require.NoError(t, err)
			return p.Summary()
		}
		if dt.IsComplex() {
			require.Equal(t, Summary{Problems: 30, Waves: 1, Launches: 3, Strided: 3}, get(Auto), "complex: per-shape batches")
			require.Equal(t, get(PerShape), get(Grouped), "no grouped GEMM for complex types")
		} else {
			require.Equal(t, Summary{Problems: 30, Waves: 1, Launches: 1, Grouped: 1}, get(Auto), "real mixed shapes: one grouped call")
			require.Equal(t, Summary{Problems: 30, Waves: 1, Launches: 3, Strided: 3}, get(PerShape))
		}
	}
}

// TestPlanSmallSplit checks Auto's split of each wave between the
// small-block kernel (every dimension at most SmallMax) and cuBLAS, and the
// Kernel strategy, which takes every product.
func TestPlanSmallSplit(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	// 40 tiny products of mixed shapes, 5 of 24x24x24, 5 of 80x80x80, then
	// the same again into the same C blocks (a second wave).
	var aD, bD, cD []packing.Desc
	var tr []Triple
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 50 {
		m, n, k := 1+rng.IntN(8), 1+rng.IntN(8), 1+rng.IntN(8)
		switch {
		case i >= 45:
			m, n, k = 80, 80, 80
		case i >= 40:
			m, n, k = 24, 24, 24
		}
		aD = append(aD, packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: m, Cols: k})
		bD = append(bD, packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: k, Cols: n})
		cD = append(cD, packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: m, Cols: n})
		tr = append(tr, Triple{i, i, i})
	}
	tr = append(tr, tr...)
	pr := Problem{A: alloc(t, a, aD), B: alloc(t, a, bD), C: alloc(t, a, cD), Alpha: 1, Triples: tr}
	get := func(o Options) Summary {
		p, err := NewPlan(pr, o)
		require.NoError(t, err)
		for _, l := range p.launches { // small launches come first in their wave and hold only small products, tiny ones first
			for i, q := range p.problems[l.lo:l.hi] {
				d := max(q.m, q.n, q.k)
				require.Equal(t, l.kind == small, d <= smallMaxOf(o), "%v launch holds %dx%dx%d", l.kind, q.m, q.n, q.k)
				if l.kind == small {
					require.Equal(t, d <= warpMax, i < l.tiny, "product %d (%dx%dx%d) of a small launch with %d tiny", i, q.m, q.n, q.k, l.tiny)
				}
			}
		}
		return p.Summary()
	}
	require.Equal(t, Summary{Problems: 100, Waves: 2, Launches: 4, Strided: 2, Small: 2, SmallProblems: 90}, get(Options{}))
	require.Equal(t, Summary{Problems: 100, Waves: 2, Launches: 2, Small: 2, SmallProblems: 100}, get(Options{Strategy: Kernel}))
	require.Equal(t, Summary{Problems: 100, Waves: 2, Launches: 4, Small: 2, SmallProblems: 80, Grouped: 2}, get(Options{SmallMax: 16}))
	require.Equal(t, Summary{Problems: 100, Waves: 2, Launches: 2, Small: 2, SmallProblems: 100}, get(Options{SmallMax: 80}))
	require.Equal(t, Summary{Problems: 100, Waves: 2, Launches: 2, Grouped: 2}, get(Options{SmallMax: -1}))
	require.Equal(t, 0, get(Options{Strategy: Grouped}).Small, "explicit cuBLAS strategies never use the kernel")
}

func TestPlanBadInput(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	A := alloc(t, a, uniform(3, packing.Float64, 2, 3))
	B := alloc(t, a, uniform(3, packing.Float64, 3, 4))
	C := alloc(t, a, uniform(3, packing.Float64, 2, 4))
	F := alloc(t, a, uniform(3, packing.Float32, 3, 4))
	Z := alloc(t, a, uniform(3, packing.Complex128, 2, 4))
	both := alloc(t, a, append(uniform(2, packing.Float64, 2, 2), packing.Desc{ID: 9, DType: packing.Float64, Rows: 2, Cols: 2}))
	ok := Problem{A: A, B: B, C: C, Alpha: 1, Triples: []Triple{{0, 0, 0}}}
	cases := []struct {
		name string
		mod  func(p *Problem)
		want error
	}{
		{"nil operand", func(p *Problem) { p.B = nil }, distbuf.ErrInvalid},
		{"bad op", func(p *Problem) { p.TransA = 7 }, distbuf.ErrInvalid},
		{"A index past the end", func(p *Problem) { p.Triples = []Triple{{3, 0, 0}} }, errOutOfRange},
		{"negative C index", func(p *Problem) { p.Triples = []Triple{{0, 0, -1}} }, errOutOfRange},
		{"inner dimensions", func(p *Problem) { p.TransB = Trans }, errShape},
		{"C shape", func(p *Problem) { p.C = A }, errShape},
		{"dtype", func(p *Problem) { p.B = F }, errDType},
		{"C dtype", func(p *Problem) { p.C = Z }, errDType},
		{"complex alpha for real blocks", func(p *Problem) { p.Alpha = 1i }, errDType},
		{"C is A", func(p *Problem) { p.A, p.B, p.C = both, both, both; p.Triples = []Triple{{0, 1, 0}} }, errAlias},
		{"C is another triple's B", func(p *Problem) {
			p.A, p.B, p.C = both, both, both
			p.Triples = []Triple{{0, 1, 2}, {2, 0, 1}}
		}, errAlias},
	}
	for _, c := range cases {
		pr := ok
		c.mod(&pr)
		_, err := NewPlan(pr, Options{})
		require.ErrorIs(t, err, c.want, c.name)
		require.ErrorIs(t, err, distbuf.ErrInvalid, c.name)
	}
	_, err := NewPlan(ok, Options{Strategy: 9})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	// Disjoint blocks of one buffer are fine.
	_, err = NewPlan(Problem{A: both, B: both, C: both, Alpha: 1, Triples: []Triple{{0, 1, 2}}}, Options{})
	require.NoError(t, err)
}

// TestPlanByBlockID checks that products named by block id plan as the
// same products named by group position, for operands of one group and for
// a group of a plan of several (where positions are not plan indices), and
// that a bad list is refused by name.
func TestPlanByBlockID(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	const n = 60
	A := alloc(t, a, uniform(n, packing.Float64, 2, 3))
	B := alloc(t, a, uniform(n, packing.Float64, 3, 4))
	// C's blocks go to three ranks in turn: group 1 holds ids 1, 4, 7, ...
	// at positions 0, 1, 2, ...
	cdescs := uniform(3*n, packing.Float64, 2, 4)
	for i := range cdescs {
		cdescs[i].ID = uint64(1000 + i)
		cdescs[i].Dest = i % 3
	}
	cp, err := packing.NewPlan(cdescs, packing.Options{})
	require.NoError(t, err)
	C, err := packing.Alloc(a, cp, a.DefaultStream(), packing.AllocOptions{Group: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = C.Free() })
	rng := rand.New(rand.NewPCG(3, 4))
	byID := make([]BlockTriple, 2*n)
	byPos := make([]Triple, 2*n)
	for i := range byID {
		ka, kb, kc := rng.IntN(n), rng.IntN(n), rng.IntN(n)
		byID[i] = BlockTriple{A: uint64(ka), B: uint64(kb), C: uint64(1000 + 3*kc + 1)}
		byPos[i] = Triple{ka, kb, kc}
	}
	pid, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Blocks: byID}, Options{})
	require.NoError(t, err)
	ppos, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Triples: byPos}, Options{})
	require.NoError(t, err)
	require.Equal(t, ppos.problems, pid.problems)
	require.Equal(t, ppos.Summary(), pid.Summary())
	for i, want := range byPos { // what errors of later runs name, found again from the offsets
		require.Equal(t, want, tripleOf(&pid.prob, pid.problems, i), "triple %d", i)
	}

	_, err = NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Blocks: byID, Triples: byPos}, Options{})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "give one list")
	bad := slices.Clone(byID)
	bad[5].C = 1000 // a block of group 0, not C's
	_, err = NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Blocks: bad}, Options{})
	require.ErrorIs(t, err, errOutOfRange)
	require.ErrorContains(t, err, "product 5")
	require.ErrorContains(t, err, "no block with id 1000 in the C buffer")
	bad = slices.Clone(byID)
	bad[7].A = n // past A's ids
	_, err = NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Blocks: bad}, Options{})
	require.ErrorIs(t, err, errOutOfRange)
	require.ErrorContains(t, err, "in the A buffer")
}

// TestRunOnAliasedOperands: a plan made on separate buffers and run with C
// on its A buffer is refused, naming the triple whose C block is read as
// an input, as NewPlan would have named it.
func TestRunOnAliasedOperands(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	sq, err := packing.NewPlan(uniform(3, packing.Float64, 2, 2), packing.Options{})
	require.NoError(t, err)
	buffers := make([]*packing.Coalesced, 3)
	for i := range buffers {
		buffers[i], err = packing.Alloc(a, sq, a.DefaultStream())
		require.NoError(t, err)
		t.Cleanup(func() { _ = buffers[i].Free() })
	}
	A, B, C := buffers[0], buffers[1], buffers[2]
	triples := []Triple{{A: 0, B: 0, C: 1}, {A: 1, B: 1, C: 2}}
	p, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Triples: slices.Clone(triples)}, Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	eng, err := NewEngine(a.DefaultStream(), EngineOptions{})
	require.NoError(t, err)
	defer func() { require.NoError(t, eng.Close()) }()
	err = eng.RunOn(p, Operands{A: A, B: B, C: A, Alpha: 1})
	require.ErrorIs(t, err, errAlias)
	var te *TripleError
	require.ErrorAs(t, err, &te)
	require.Equal(t, 0, te.Index)
	require.Equal(t, triples[0], te.Triple)
	require.Contains(t, te.Reason, "C block 1 shares memory with an input of triple 1")
	_, err = NewPlan(Problem{A: A, B: B, C: A, Alpha: 1, Triples: triples}, Options{})
	require.Equal(t, err.Error(), eng.RunOn(p, Operands{A: A, B: B, C: A, Alpha: 1}).Error(), "the error NewPlan gives")
	require.NoError(t, eng.RunOn(p, Operands{A: A, B: B, C: C, Alpha: 1}))
}

func TestRunAfterFree(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	eng, err := NewEngine(s, EngineOptions{})
	require.NoError(t, err)
	mk := func(d []packing.Desc) *packing.Coalesced {
		p, err := packing.NewPlan(d, packing.Options{})
		require.NoError(t, err)
		c, err := packing.Alloc(a, p, s)
		require.NoError(t, err)
		return c
	}
	A, B, C := mk(uniform(2, packing.Float64, 2, 2)), mk(uniform(2, packing.Float64, 2, 2)), mk(uniform(2, packing.Float64, 2, 2))
	p, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Triples: []Triple{{0, 0, 0}, {1, 1, 1}}}, Options{})
	require.NoError(t, err)
	require.NoError(t, eng.Run(p))
	require.NoError(t, B.Free())
	require.ErrorIs(t, eng.Run(p), distbuf.ErrFreed)
	require.NoError(t, p.Close())
	require.ErrorIs(t, eng.Run(p), distbuf.ErrClosed, "closed plan")
	require.ErrorIs(t, p.Close(), distbuf.ErrClosed)
	require.NoError(t, eng.Close())
	require.ErrorIs(t, eng.Run(p), distbuf.ErrClosed, "closed engine")
	require.ErrorIs(t, eng.Close(), distbuf.ErrClosed, "engine closed twice")
	require.NoError(t, A.Free())
	require.NoError(t, C.Free())
	_, err = NewPlan(Problem{A: A, B: A, C: C, Alpha: 1, Triples: []Triple{{0, 0, 0}}}, Options{})
	require.ErrorIs(t, err, distbuf.ErrFreed)
}

// TestEncodeStack checks the stack's two encoders against each other: the
// one that stores entries whole (aligned memory on a little-endian host)
// and the byte-wise one (used otherwise, here by misaligning the buffer).
func TestEncodeStack(t *testing.T) {
	probs := []problem{
		{a: 8, b: 1 << 40, c: 24, m: 1, n: 2, k: 3, lda: 3, ldb: 2, tripleIdx: 5},
		{a: 1<<62 + 16, b: 0, c: 1 << 33, m: 1<<31 - 1, n: 64, k: 7, lda: 1<<31 - 1, ldb: 64, tripleIdx: 1<<31 - 1},
	}
	whole := make([]byte, len(probs)*stackEntryBytes)
	encodeStack(whole, probs)
	raw := make([]byte, len(whole)+1)
	encodeStack(raw[1:], probs)
	require.Equal(t, whole, raw[1:])
	require.Equal(t, uint64(1<<62+16), binary.LittleEndian.Uint64(whole[stackEntryBytes:]))
	require.Equal(t, uint32(1<<31-1), binary.LittleEndian.Uint32(whole[stackEntryBytes+24:]))
	require.Zero(t, binary.LittleEndian.Uint32(whole[44:48]), "the triple index is not part of the entry")
	require.Zero(t, binary.LittleEndian.Uint32(whole[stackEntryBytes+44:]))
}

// TestPlanFirstError: of a long list with several bad triples, the error
// reported is the first failing triple's, and each triple's checks keep
// their order (A, B, C, then shapes).
func TestPlanFirstError(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	const n = 4096
	A, B, C := uniformOperands(t, a, n, 4, 5, 6)
	cases := []struct {
		name    string
		breakIt func(tr []Triple)
		index   int
		err     error
	}{
		{"late chunk only", func(tr []Triple) { tr[3900].C = n }, 3900, errOutOfRange},
		{"early before late", func(tr []Triple) { tr[3900].A = -1; tr[700].C = n + 5 }, 700, errOutOfRange},
		{"A before C in one triple", func(tr []Triple) { tr[2500].C = n; tr[2500].A = n }, 2500, errOutOfRange},
		{"first triple", func(tr []Triple) { tr[0].B = n; tr[4000].A = n }, 0, errOutOfRange},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := diagonal(n)
			c.breakIt(tr)
			_, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Triples: tr}, Options{})
			require.ErrorIs(t, err, c.err)
			var te *TripleError
			require.ErrorAs(t, err, &te)
			require.Equal(t, c.index, te.Index)
			require.Equal(t, tr[c.index], te.Triple)
		})
	}
	t.Run("shape before range", func(t *testing.T) {
		descs := uniform(n, packing.Float64, 5, 6)
		descs[2600].Cols = 7 // op(A)*B is then 4x7 where C is 4x6
		mixed := alloc(t, a, descs)
		tr := diagonal(n)
		tr[3500].A = n
		_, err := NewPlan(Problem{A: A, B: mixed, C: C, Alpha: 1, Triples: tr}, Options{})
		require.ErrorIs(t, err, errShape)
		var te *TripleError
		require.ErrorAs(t, err, &te)
		require.Equal(t, 2600, te.Index)
	})
}

// TestPlanAfterClose: a closed plan's products go to the next plan made, so
// a closed plan keeps only its summary, and the next plan, of another
// size, multiplies right in memory that held the first one's products.
func TestPlanAfterClose(t *testing.T) {
	s := openClean(t, openHost).DefaultStream()
	eng := newEngine(t, s)
	big, A1, B1, C1 := sparseProblem(t, s, packing.Float64, NoTrans, NoTrans, 7)
	defer freeOperands(t, A1, B1, C1)
	p1, err := NewPlan(big, Options{})
	require.NoError(t, err)
	sum := p1.Summary()
	require.NoError(t, p1.Close())
	require.Equal(t, sum, p1.Summary(), "the summary outlives Close")
	require.ErrorIs(t, eng.Run(p1), distbuf.ErrClosed)
	for seed := uint64(8); seed < 12; seed++ {
		pr, A, B, C := sparseProblem(t, s, packing.Float64, NoTrans, Trans, seed)
		ref, mag := reference(pr, A, B, C)
		p, err := NewPlan(pr, Options{})
		require.NoError(t, err)
		runChecked(t, eng, p, packing.Float64, C, ref, mag)
		freeOperands(t, A, B, C)
	}
}

// TestAutoUniformRuns: Auto gives a shape to cuBLAS instead of the
// small-block kernel once uniformRunMin products share it and a dimension
// is above 16; one product fewer, or dimensions of 16, stay in the kernel.
func TestAutoUniformRuns(t *testing.T) {
	a := openHost(t)
	defer func() { require.NoError(t, a.Sync()) }()
	for _, tc := range []struct {
		dim, n  int
		toBLAS  bool
		explain string
	}{
		{32, uniformRunMin, true, "a long run of 32^3"},
		{17, uniformRunMin, true, "a dimension just above 16"},
		{32, uniformRunMin - 1, false, "one product short of uniformRunMin"},
		{16, uniformRunMin, false, "dimensions of 16"},
	} {
		A, B, C := uniformOperands(t, a, tc.n, tc.dim, tc.dim, tc.dim)
		diag := diagonal(tc.n)
		for _, st := range []Strategy{Auto, Kernel} {
			p, err := NewPlan(Problem{A: A, B: B, C: C, Alpha: 1, Triples: diag}, Options{Strategy: st})
			require.NoError(t, err)
			want := Summary{Problems: tc.n, Waves: 1, Launches: 1, Small: 1, SmallProblems: tc.n}
			if tc.toBLAS && st == Auto {
				want = Summary{Problems: tc.n, Waves: 1, Launches: 1, Strided: 1}
			}
			require.Equal(t, want, p.Summary(), "%s under %s", tc.explain, st)
			require.NoError(t, p.Close())
		}
	}
}
