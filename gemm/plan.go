package gemm

import (
	"fmt"
	"sort"
	"sync"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
)

// Op is the operation applied to an A or B block before multiplying.
type Op uint8

const (
	NoTrans Op = iota
	Trans      // transpose (not conjugated, also for complex blocks)
)

func (o Op) String() string {
	if o == Trans {
		return "T"
	}
	return "N"
}

// Triple names one product by group position in the A, B and C buffers:
// C[C] += alpha * op(A[A]) * op(B[B]).
type Triple struct{ A, B, C int }

// Problem is a contraction list over coalesced operands.
//
// Every block is row-major (see packing). For each triple, op(A) is m x k,
// op(B) is k x n and C is m x n. The result is
//
//	C_final = Beta*C_initial + sum over triples of Alpha*op(A)*op(B)
//
// for every C block named by at least one triple (the others are left as
// they are), also one that appears in several triples: those triples
// are split into waves, the first occurrence of each C block in wave 0, the
// second in wave 1, and so on in list order; Beta applies in wave 0 only and
// later waves accumulate with beta = 1. Alpha and Beta must be real for real
// dtypes. A, B and C may be the same Coalesced, but no C block may share
// memory with an A or B block of the problem.
type Problem struct {
	A, B, C        *packing.Coalesced
	TransA, TransB Op
	Alpha, Beta    complex128
	Triples        []Triple
}

// Strategy chooses how a wave's products become launches.
type Strategy int

const (
	// Auto: one grouped call per wave for real dtypes with several shapes
	// (one strided or pointer-array call when the wave has one shape), and
	// per-shape batched calls for complex dtypes.
	Auto Strategy = iota
	// Loop: one GEMM per triple (the baseline the batches are measured against).
	Loop
	// PerShape: one batched call per shape and wave: strided when the blocks
	// sit at constant strides, else pointer-array.
	PerShape
	// Grouped: one grouped call per wave for real dtypes (complex dtypes
	// have no grouped GEMM and get PerShape).
	Grouped
)

func (s Strategy) String() string {
	switch s {
	case Auto:
		return "auto"
	case Loop:
		return "loop"
	case PerShape:
		return "pershape"
	case Grouped:
		return "grouped"
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// Options configures NewPlan.
type Options struct {
	Strategy Strategy
}

// kind is the kind of one launch.
type kind int

const (
	single   kind = iota + 1 // one GEMM
	strided                  // strided batched: one shape, constant strides
	pointers                 // pointer-array batched: one shape, any offsets
	grouped                  // grouped batched: several shapes in one call
)

func (k kind) String() string {
	switch k {
	case single:
		return "single"
	case strided:
		return "strided"
	case pointers:
		return "pointers"
	case grouped:
		return "grouped"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// problem is one product: byte offsets in the A, B and C buffers, the shape
// (C is m x n, the inner dimension k) and the row lengths of the stored A
// and B blocks.
type problem struct {
	a, b, c    int64
	m, n, k    int32
	lda, ldb   int32
	flops      int64
	tripleIdx  int32
	wave       int32
	shapeClass int32
}

// launch is one library call over problems[lo:hi].
type launch struct {
	kind   kind
	wave   int
	beta   complex128
	lo, hi int
	// strided: byte strides between consecutive problems.
	sa, sb, sc int64
	// grouped: the sizes of its shape groups, in order.
	groups []int
}

// Plan is a contraction list planned into launches. It is immutable once
// made, except for the device pointer arrays a CUDA engine builds on first
// use; Close releases them.
type Plan struct {
	prob     Problem
	dtype    packing.DType
	strategy Strategy
	problems []problem // in launch order
	launches []launch
	waves    int
	needArr  bool // some launch reads pointer arrays

	mu     sync.Mutex
	arrays *devalloc.Buffer // [A pointers | B pointers | C pointers], 8 bytes each
	closed bool
}

// Summary counts a plan's launches by kind.
type Summary struct {
	Problems, Waves, Launches          int
	Single, Strided, Pointers, Grouped int
}

// NewPlan validates a problem and plans it into the fewest launches its
// strategy allows.
func NewPlan(pr Problem, opts Options) (*Plan, error) {
	if pr.A == nil || pr.B == nil || pr.C == nil {
		return nil, fmt.Errorf("gemm: nil operand buffer: %w", ErrInvalid)
	}
	if pr.TransA > Trans || pr.TransB > Trans {
		return nil, fmt.Errorf("gemm: operations %d, %d: want NoTrans or Trans: %w", pr.TransA, pr.TransB, ErrInvalid)
	}
	if opts.Strategy < Auto || opts.Strategy > Grouped {
		return nil, fmt.Errorf("gemm: strategy %v: %w", opts.Strategy, ErrInvalid)
	}
	p := &Plan{prob: pr, strategy: opts.Strategy}
	p.prob.Triples = append([]Triple(nil), pr.Triples...)
	if err := p.build(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Plan) build() error {
	pr := &p.prob
	n := len(pr.Triples)
	probs := make([]problem, n)
	waveOf := make([]int32, pr.C.Len())
	for i, t := range pr.Triples {
		va, err := viewOf(pr.A, t.A, "A", i, t)
		if err != nil {
			return err
		}
		vb, err := viewOf(pr.B, t.B, "B", i, t)
		if err != nil {
			return err
		}
		vc, err := viewOf(pr.C, t.C, "C", i, t)
		if err != nil {
			return err
		}
		dt := va.DType()
		if i == 0 {
			p.dtype = dt
		}
		if dt != p.dtype || vb.DType() != p.dtype || vc.DType() != p.dtype {
			return &TripleError{Index: i, Triple: t, Reason: fmt.Sprintf("dtypes %v, %v, %v (the problem is %v)", dt, vb.DType(), vc.DType(), p.dtype), Err: ErrDType}
		}
		m, k := va.Rows(), va.Cols()
		if pr.TransA == Trans {
			m, k = k, m
		}
		kb, nn := vb.Rows(), vb.Cols()
		if pr.TransB == Trans {
			kb, nn = nn, kb
		}
		if k != kb || vc.Rows() != m || vc.Cols() != nn {
			return &TripleError{Index: i, Triple: t, Reason: fmt.Sprintf("op%v(A) is %dx%d, op%v(B) %dx%d, C %dx%d",
				pr.TransA, m, k, pr.TransB, kb, nn, vc.Rows(), vc.Cols()), Err: ErrShape}
		}
		w := waveOf[t.C]
		waveOf[t.C]++
		probs[i] = problem{a: va.Offset(), b: vb.Offset(), c: vc.Offset(), m: int32(m), n: int32(nn), k: int32(k),
			lda: int32(va.Cols()), ldb: int32(vb.Cols()), flops: 2 * int64(m) * int64(nn) * int64(k), tripleIdx: int32(i), wave: w}
		p.waves = max(p.waves, int(w)+1)
	}
	if n > 0 && !p.dtype.IsComplex() && (imag(pr.Alpha) != 0 || imag(pr.Beta) != 0) {
		return fmt.Errorf("gemm: complex alpha %v or beta %v for %v blocks: %w", pr.Alpha, pr.Beta, p.dtype, ErrDType)
	}
	if err := checkAliasing(pr, probs, p.dtype.Size()); err != nil {
		return err
	}
	p.plan(probs)
	return nil
}

func viewOf(c *packing.Coalesced, k int, name string, i int, t Triple) (packing.View, error) {
	v, err := c.View(k)
	if err != nil {
		return v, &TripleError{Index: i, Triple: t, Reason: fmt.Sprintf("%s block %d of %d", name, k, c.Len()), Err: fmt.Errorf("%w: %w", ErrOutOfRange, err)}
	}
	return v, nil
}

// checkAliasing rejects a C block that shares bytes with any A or B block of
// the problem. Only buffers whose memory overlaps need the sweep.
func checkAliasing(pr *Problem, probs []problem, elem int64) error {
	region := func(c *packing.Coalesced) (uintptr, uintptr) {
		v, _ := c.Buffer().Addr()
		return v, v + uintptr(c.Size())
	}
	c0, c1 := region(pr.C)
	type iv struct {
		lo, hi uintptr
		input  bool
		triple int
	}
	var ivs []iv
	add := func(c *packing.Coalesced, input bool, off func(*problem) int64, bytes func(*problem) int64) {
		base, _ := c.Buffer().Addr()
		for i := range probs {
			lo := base + uintptr(off(&probs[i]))
			ivs = append(ivs, iv{lo, lo + uintptr(bytes(&probs[i])), input, int(probs[i].tripleIdx)})
		}
	}
	sizeA := func(q *problem) int64 { return int64(q.m) * int64(q.k) * elem }
	sizeB := func(q *problem) int64 { return int64(q.k) * int64(q.n) * elem }
	sizeC := func(q *problem) int64 { return int64(q.m) * int64(q.n) * elem }
	overlaps := false
	for _, in := range []*packing.Coalesced{pr.A, pr.B} {
		a0, a1 := region(in)
		if a0 < c1 && c0 < a1 {
			overlaps = true
		}
	}
	if !overlaps {
		return nil
	}
	add(pr.C, false, func(q *problem) int64 { return q.c }, sizeC)
	add(pr.A, true, func(q *problem) int64 { return q.a }, sizeA)
	add(pr.B, true, func(q *problem) int64 { return q.b }, sizeB)
	sort.Slice(ivs, func(i, j int) bool { return ivs[i].lo < ivs[j].lo })
	// Sweep: remember the furthest-reaching C and input intervals so far.
	var lastC, lastIn *iv
	for i := range ivs {
		v := &ivs[i]
		other := lastC
		if !v.input {
			other = lastIn
		}
		if other != nil && other.hi > v.lo {
			ci, ii := v, other
			if v.input {
				ci, ii = other, v
			}
			t := pr.Triples[ci.triple]
			return &TripleError{Index: ci.triple, Triple: t, Reason: fmt.Sprintf("C block %d shares memory with an input of triple %d", t.C, ii.triple), Err: ErrAlias}
		}
		if v.input {
			if lastIn == nil || v.hi > lastIn.hi {
				lastIn = v
			}
		} else if lastC == nil || v.hi > lastC.hi {
			lastC = v
		}
	}
	return nil
}

// plan orders the problems by wave, then by shape in order of first
// appearance, then by C offset, and cuts them into launches.
func (p *Plan) plan(probs []problem) {
	type shapeKey struct{ m, n, k int32 }
	shapes := map[shapeKey]int32{}
	for i := range probs {
		q := &probs[i]
		key := shapeKey{q.m, q.n, q.k}
		s, ok := shapes[key]
		if !ok {
			s = int32(len(shapes))
			shapes[key] = s
		}
		q.shapeClass = s
	}
	// Inside a wave the order of products is free (no two write one C
	// block): sorting a shape's products by C offset finds the strides of
	// a packing class whatever order the list gave them in.
	sort.SliceStable(probs, func(i, j int) bool {
		if probs[i].wave != probs[j].wave {
			return probs[i].wave < probs[j].wave
		}
		if probs[i].shapeClass != probs[j].shapeClass {
			return probs[i].shapeClass < probs[j].shapeClass
		}
		return probs[i].c < probs[j].c
	})
	p.problems = probs
	groupable := !p.dtype.IsComplex() && (p.strategy == Auto || p.strategy == Grouped)
	for lo := 0; lo < len(probs); {
		w := probs[lo].wave
		hi := lo
		var runs []int // start of each shape run in the wave
		for hi < len(probs) && probs[hi].wave == w {
			if hi == lo || probs[hi].shapeClass != probs[hi-1].shapeClass {
				runs = append(runs, hi)
			}
			hi++
		}
		beta := p.prob.Beta
		if w > 0 {
			beta = 1
		}
		switch {
		case p.strategy == Loop:
			for i := lo; i < hi; i++ {
				p.launches = append(p.launches, launch{kind: single, wave: int(w), beta: beta, lo: i, hi: i + 1})
			}
		case groupable && (len(runs) > 1 || p.strategy == Grouped):
			l := launch{kind: grouped, wave: int(w), beta: beta, lo: lo, hi: hi}
			for r, start := range runs {
				end := hi
				if r+1 < len(runs) {
					end = runs[r+1]
				}
				l.groups = append(l.groups, end-start)
			}
			p.launches = append(p.launches, l)
			p.needArr = true
		default:
			for r, start := range runs {
				end := hi
				if r+1 < len(runs) {
					end = runs[r+1]
				}
				p.launches = append(p.launches, p.batch(start, end, int(w), beta))
			}
		}
		lo = hi
	}
}

// batch makes one launch of a same-shape run: strided when A, B and C
// offsets each advance by a constant, non-negative stride, else pointers.
func (p *Plan) batch(lo, hi, wave int, beta complex128) launch {
	l := launch{kind: strided, wave: wave, beta: beta, lo: lo, hi: hi}
	q := p.problems[lo:hi]
	if len(q) > 1 {
		l.sa, l.sb, l.sc = q[1].a-q[0].a, q[1].b-q[0].b, q[1].c-q[0].c
		for i := 2; i < len(q); i++ {
			if q[i].a-q[i-1].a != l.sa || q[i].b-q[i-1].b != l.sb || q[i].c-q[i-1].c != l.sc {
				l.kind = pointers
				break
			}
		}
		es := p.dtype.Size()
		if l.sa < 0 || l.sb < 0 || l.sc <= 0 || l.sa%es != 0 || l.sb%es != 0 || l.sc%es != 0 {
			l.kind = pointers
		}
	}
	if l.kind == pointers {
		p.needArr = true
	}
	return l
}

// Launches is the number of library calls one Run makes.
func (p *Plan) Launches() int { return len(p.launches) }

// Waves is the number of conflict-free waves.
func (p *Plan) Waves() int { return p.waves }

// DType is the element type of the problem (0 for an empty list).
func (p *Plan) DType() packing.DType { return p.dtype }

// Summary counts the launches by kind.
func (p *Plan) Summary() Summary {
	s := Summary{Problems: len(p.problems), Waves: p.waves, Launches: len(p.launches)}
	for _, l := range p.launches {
		switch l.kind {
		case single:
			s.Single++
		case strided:
			s.Strided++
		case pointers:
			s.Pointers++
		case grouped:
			s.Grouped++
		}
	}
	return s
}

// Close releases the device pointer arrays. The plan cannot run afterwards.
func (p *Plan) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("gemm: plan closed twice: %w", ErrInvalid)
	}
	p.closed = true
	if p.arrays != nil {
		err := p.arrays.Free()
		p.arrays = nil
		return err
	}
	return nil
}
