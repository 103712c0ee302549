package gemm

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/distbuf/distbuf"
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

// BlockTriple names one product by block id: C[C] += alpha * op(A[A]) *
// op(B[B]), where A, B and C are the ids (packing.Desc.ID) of blocks in the
// problem's A, B and C buffers. It is how a tensor code names its
// contractions; the plan resolves the ids once.
type BlockTriple struct{ A, B, C uint64 }

// Triple names one product by group position in the A, B and C buffers
// (the index of Coalesced.View and Locate), the form NewPlan works in: a
// code that walks the buffers' views in order already has positions, and
// passing them skips the resolution of ids.
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
// later waves accumulate with beta = 1. With Beta = 0, C is written without
// being read, on every backend, so a NaN there does not survive. Alpha and
// Beta must be real for real dtypes. A, B and C may be the same Coalesced,
// but no C block may share memory with an A or B block of the problem.
//
// The products are given by block id (Blocks) or by position (Triples),
// one list or the other; "list order" is the order of the one given, and
// errors name a product by its index there. NewPlan keeps neither: the
// caller may reuse the slice once it returns.
type Problem struct {
	A, B, C        *packing.Coalesced
	TransA, TransB Op
	Alpha, Beta    complex128
	Blocks         []BlockTriple
	Triples        []Triple
}

// Operands binds a plan to buffers for one run: any Coalesced laid out by
// the same packing plans and groups as the plan's operands, and the scalars.
type Operands struct {
	A, B, C     *packing.Coalesced
	Alpha, Beta complex128
}

// Strategy chooses how a wave's products become launches.
type Strategy int

const (
	// Auto: on CUDA, the products whose dimensions are all at most
	// Options.SmallMax go to distbuf's own batched kernel, one launch per
	// wave, except a shape with a dimension above 16 that 1024 or more
	// products share: cuBLAS's batched call outruns the kernel there. The
	// others get one grouped call per wave for real dtypes with
	// several shapes (one strided or pointer-array call when the wave has
	// one shape), and per-shape batched calls for complex dtypes.
	Auto Strategy = iota
	// Loop: one GEMM per triple (the baseline the batches are measured against).
	Loop
	// PerShape: one batched call per shape and wave: strided when the blocks
	// sit at constant strides, else pointer-array.
	PerShape
	// Grouped: one grouped call per wave for real dtypes (complex dtypes
	// have no grouped GEMM and get PerShape).
	Grouped
	// Kernel: every product in distbuf's own batched kernel, one launch per
	// wave, whatever its size.
	Kernel
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
	case Kernel:
		return "kernel"
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// DefaultSmallMax is the largest dimension of a product that Auto sends to
// the small-block kernel. It is the crossover measured on an H200 with
// `go test -bench KernelCrossover ./gemm`: below it one
// launch of the kernel beats a grouped cuBLAS call over the same products.
const DefaultSmallMax = 64

// uniformRunMin is how many products of one shape, with a dimension above
// 16, make Auto give them to cuBLAS instead of the small-block kernel. Measured on
// an H200 with `go test -bench UniformCrossover ./gemm`: one strided call
// takes 0.54-0.68 of the kernel's time from 1024 products of 24^3 to 64^3
// and 0.23-0.45 from 4096, while at 16^3 and below the kernel wins up to
// 4096 products.
const uniformRunMin = 1024

// Options configures NewPlan.
type Options struct {
	Strategy Strategy
	// SmallMax bounds the dimensions (m, n and k) of the products Auto gives
	// to the small-block kernel: 0 means DefaultSmallMax, a negative value
	// sends none there.
	SmallMax int
}

// kind is the kind of one launch.
type kind int

const (
	single   kind = iota + 1 // one GEMM
	strided                  // strided batched: one shape, constant strides
	pointers                 // pointer-array batched: one shape, any offsets
	grouped                  // grouped batched: several shapes in one call
	small                    // distbuf's batched kernel: any shapes
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
	case small:
		return "small"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// problem is one product: byte offsets in the A, B and C layouts, the shape
// (C is m x n, the inner dimension k), the row lengths of the stored A and
// B blocks, and the index of its triple. Its wave and shape class live in
// the planner's scratch: the plan keeps 48 bytes a product.
type problem struct {
	a, b, c   int64
	m, n, k   int32
	lda, ldb  int32
	tripleIdx int32
}

func (q *problem) flops() int64 { return 2 * int64(q.m) * int64(q.n) * int64(q.k) }

// launch is one library call (or kernel launch) over problems[lo:hi].
type launch struct {
	kind   kind
	wave   int
	lo, hi int
	// strided: byte strides between consecutive problems.
	sa, sb, sc int64
	// grouped, and small when it falls back to cuBLAS: the sizes of its
	// shape runs, in order.
	groups []int
	// small: how many of its products, the first ones, take a warp each.
	tiny int
}

// layoutRef is what an operand's offsets depend on: its packing plan and
// group. A Coalesced with the same pair has the same views at the same
// offsets from its layout's start.
type layoutRef struct {
	plan  *packing.Plan
	group int
}

func layoutOf(c *packing.Coalesced) layoutRef { return layoutRef{c.Plan(), c.Group()} }

// Plan is a contraction list planned into launches, once per block
// structure: it depends on the operands' layouts (their packing plans and
// groups), the operations and the triples, not on the buffers, so it runs on
// any buffers with those layouts (Engine.RunOn). On CUDA its parameter
// stack, the products' offsets and shapes, is uploaded on the first run and
// stays on the device; cuBLAS pointer arrays are derived from it on the
// device when the buffers' addresses change. Close releases that memory.
type Plan struct {
	prob     Problem // the operands it was planned on: Engine.Run's
	layouts  [3]layoutRef
	dtype    packing.DType
	strategy Strategy
	problems []problem // in launch order
	launches []launch
	waves    int
	needArr  bool // some cuBLAS launch reads pointer arrays
	smallN   int  // products in small launches
	count    int  // products (len(problems) until Close)

	mu     sync.Mutex // serialises runs: the device state is shared
	dev    *deviceState
	closed bool
}

// Summary counts a plan's launches by kind.
type Summary struct {
	Problems, Waves, Launches          int
	Single, Strided, Pointers, Grouped int
	// Small counts launches of the small-block kernel, SmallProblems the
	// products they carry.
	Small, SmallProblems int
}

// plansBuilt counts successful NewPlan calls in the process.
var plansBuilt atomic.Int64

// PlansBuilt is the number of plans NewPlan has made in this process: a
// solver whose block structure repeats should see it stop growing.
func PlansBuilt() int64 { return plansBuilt.Load() }

// NewPlan validates a problem and plans it into the fewest launches its
// strategy allows. It costs O(n) for n triples in the usual case (products
// bucketed by wave and shape in one counting pass) and O(n log n) at worst
// (a bucket whose C offsets are out of order is sorted); nothing goes
// through reflection. Problem.A, B and C give the layouts; Engine.Run runs
// the plan on them, Engine.RunOn on any buffers with the same layouts.
func NewPlan(pr Problem, opts Options) (*Plan, error) {
	if pr.A == nil || pr.B == nil || pr.C == nil {
		return nil, fmt.Errorf("gemm: nil operand buffer: %w", distbuf.ErrInvalid)
	}
	if pr.TransA > Trans || pr.TransB > Trans {
		return nil, fmt.Errorf("gemm: operations %d, %d: want NoTrans or Trans: %w", pr.TransA, pr.TransB, distbuf.ErrInvalid)
	}
	if opts.Strategy < Auto || opts.Strategy > Kernel {
		return nil, fmt.Errorf("gemm: strategy %v: %w", opts.Strategy, distbuf.ErrInvalid)
	}
	if len(pr.Blocks) > 0 {
		if len(pr.Triples) > 0 {
			return nil, fmt.Errorf("gemm: %d products by block id and %d by position: give one list: %w", len(pr.Blocks), len(pr.Triples), distbuf.ErrInvalid)
		}
		triples, err := resolveBlocks(&pr)
		if err != nil {
			return nil, err
		}
		pr.Triples = triples
	}
	p := &Plan{prob: pr, strategy: opts.Strategy, layouts: [3]layoutRef{layoutOf(pr.A), layoutOf(pr.B), layoutOf(pr.C)}}
	if err := p.build(smallMaxOf(opts)); err != nil {
		return nil, err
	}
	p.prob.Triples, p.prob.Blocks = nil, nil // the caller's: errors find a triple again from its product (tripleOf)
	plansBuilt.Add(1)
	return p, nil
}

func smallMaxOf(o Options) int32 {
	switch {
	case o.Strategy == Kernel:
		return 1<<31 - 1
	case o.Strategy != Auto || o.SmallMax < 0:
		return 0
	case o.SmallMax == 0:
		return DefaultSmallMax
	}
	return int32(min(o.SmallMax, 1<<31-1))
}

func (p *Plan) build(smallMax int32) error {
	pr := &p.prob
	n := len(pr.Triples)
	if n > 1<<31-1 {
		return fmt.Errorf("gemm: %d triples: at most 2^31-1: %w", n, distbuf.ErrInvalid)
	}
	sc := scratchPool.Get().(*planScratch)
	defer scratchPool.Put(sc)
	sc.reset(n, pr.C.Len(), smallMax)
	probs, waveOf, shapeOf, waveAt := sc.probs, sc.waveOf, sc.shapeOf, sc.waveAt
	mem := takePlanMemory(n)
	// Each operand's class table, read once: a block's shape, dtype and
	// size come from its class, so the loop reads one class per operand
	// instead of going through the view for every field.
	planA, planB, planC := pr.A.Plan(), pr.B.Plan(), pr.C.Plan()
	clsA, clsB, clsC := planA.Classes(), planB.Classes(), planC.Classes()
	// A product's shape follows from the classes of its A and B blocks, so
	// its shape class is looked up once per pair of classes (a solve has
	// hundreds of pairs, not one per product) where the pairs are few
	// enough to tabulate. The table counts only the classes of the
	// operands' own groups: A and B may be parts of one plan that holds
	// both operands' classes.
	rowA, nA := sc.denseA.of(clsA, planA.Groups()[pr.A.Group()].Classes)
	rowB, nB := sc.denseB.of(clsB, planB.Groups()[pr.B.Group()].Classes)
	pairs := sc.pairTable(nA, nB, n)
	// Each operand is checked once here, not at every block.
	la, errA := pr.A.Locator()
	lb, errB := pr.B.Locator()
	lc, errC := pr.C.Locator()
	if n > 0 && (errA != nil || errB != nil || errC != nil) {
		return locateError(pr, 0, pr.Triples[0])
	}
	if n > 0 {
		if ia, _, ok := la.Locate(pr.Triples[0].A); ok {
			p.dtype = clsA[ia].DType
		}
	}
	transA, transB := pr.TransA == Trans, pr.TransB == Trans
	waves := int32(0)
	for i, t := range pr.Triples {
		ia, offA, okA := la.Locate(t.A)
		ib, offB, okB := lb.Locate(t.B)
		ic, offC, okC := lc.Locate(t.C)
		if !okA || !okB || !okC {
			return locateError(pr, i, t)
		}
		ca, cb, cc := &clsA[ia], &clsB[ib], &clsC[ic]
		if ca.DType != p.dtype || cb.DType != p.dtype || cc.DType != p.dtype {
			return &TripleError{Index: i, Triple: t, Reason: fmt.Sprintf("dtypes %v, %v, %v (the problem is %v)", ca.DType, cb.DType, cc.DType, p.dtype), Err: errDType}
		}
		m, k := ca.Rows, ca.Cols
		if transA {
			m, k = k, m
		}
		kb, nn := cb.Rows, cb.Cols
		if transB {
			kb, nn = nn, kb
		}
		if k != kb || cc.Rows != m || cc.Cols != nn {
			return &TripleError{Index: i, Triple: t, Reason: fmt.Sprintf("op%v(A) is %dx%d, op%v(B) %dx%d, C %dx%d",
				pr.TransA, m, k, pr.TransB, kb, nn, cc.Rows, cc.Cols), Err: errShape}
		}
		var s int32
		if pairs != nil {
			pair := &pairs[int(rowA[ia])*nB+int(rowB[ib])]
			if s = *pair - 1; s < 0 {
				s = sc.shapeClass(int32(m), int32(nn), int32(k))
				*pair = s + 1
			}
		} else {
			s = sc.shapeClass(int32(m), int32(nn), int32(k))
		}
		sc.perShape[s]++
		w := waveOf[t.C]
		waveOf[t.C]++
		// Field by field: a literal is built on the stack and copied in
		// 16-byte moves that stall on its 4-byte stores. A class's
		// dimensions are below 2^31 (packing's bound), so they fit.
		q := &probs[i]
		q.a, q.b, q.c = offA, offB, offC
		q.m, q.n, q.k = int32(m), int32(nn), int32(k)
		q.lda, q.ldb, q.tripleIdx = int32(ca.Cols), int32(cb.Cols), int32(i)
		shapeOf[i], waveAt[i] = s, w
		waves = max(waves, w+1)
	}
	p.problems, p.count, p.waves = mem.problems, n, int(waves)
	if err := checkScalars(p.dtype, n, pr.Alpha, pr.Beta); err != nil {
		return err
	}
	if err := checkAliasing(pr, probs, p.dtype.Size()); err != nil {
		return err
	}
	p.plan(sc)
	return nil
}

func checkScalars(dt packing.DType, n int, alpha, beta complex128) error {
	if n > 0 && !dt.IsComplex() && (imag(alpha) != 0 || imag(beta) != 0) {
		return fmt.Errorf("gemm: complex alpha %v or beta %v for %v blocks: %w", alpha, beta, dt, errDType)
	}
	return nil
}

// locateError is the error of triple i, one of whose blocks Locate did
// not find: the first operand's, in the order A, B, C.
// resolveBlocks turns the products of pr given by block id into group
// positions (packing's Coalesced.Position).
func resolveBlocks(pr *Problem) ([]Triple, error) {
	ops := [3]*packing.Coalesced{pr.A, pr.B, pr.C}
	out := make([]Triple, len(pr.Blocks))
	for i, b := range pr.Blocks {
		ids := [3]uint64{b.A, b.B, b.C}
		var k [3]int
		for o, id := range ids {
			var err error
			if k[o], err = ops[o].Position(id); err != nil {
				name := [3]string{"A", "B", "C"}[o]
				if errors.Is(err, distbuf.ErrInvalid) {
					return nil, fmt.Errorf("gemm: product %d (A id %d, B id %d, C id %d): no block with id %d in the %s buffer: %w", i, b.A, b.B, b.C, id, name, errOutOfRange)
				}
				return nil, fmt.Errorf("gemm: product %d: the %s buffer: %w", i, name, err)
			}
		}
		out[i] = Triple{A: k[0], B: k[1], C: k[2]}
	}
	return out, nil
}

func locateError(pr *Problem, i int, t Triple) error {
	for _, o := range []struct {
		c    *packing.Coalesced
		k    int
		name string
	}{{pr.A, t.A, "A"}, {pr.B, t.B, "B"}, {pr.C, t.C, "C"}} {
		if _, err := viewOf(o.c, o.k, o.name, i, t); err != nil {
			return err
		}
	}
	return fmt.Errorf("gemm: triple %d: a block was not found: %w", i, errOutOfRange)
}

func viewOf(c *packing.Coalesced, k int, name string, i int, t Triple) (packing.View, error) {
	v, err := c.View(k)
	if err != nil {
		return v, &TripleError{Index: i, Triple: t, Reason: fmt.Sprintf("%s block %d of %d", name, k, c.Len()), Err: fmt.Errorf("%w: %w", errOutOfRange, err)}
	}
	return v, nil
}

// tripleOf returns triple i of pr, whose products are probs: from the
// list while NewPlan has it, and otherwise found again from the product's
// offsets, since blocks of one layout do not overlap and an offset names
// one block. The plan keeps no list: only errors ask.
func tripleOf(pr *Problem, probs []problem, i int) Triple {
	if pr.Triples != nil {
		return pr.Triples[i]
	}
	for j := range probs {
		if q := &probs[j]; int(q.tripleIdx) == i {
			return Triple{A: positionAt(pr.A, q.a), B: positionAt(pr.B, q.b), C: positionAt(pr.C, q.c)}
		}
	}
	return Triple{A: -1, B: -1, C: -1}
}

// positionAt is the group position of c's block at byte offset off, -1
// when there is none.
func positionAt(c *packing.Coalesced, off int64) int {
	loc, err := c.Locator()
	if err != nil {
		return -1
	}
	for k := range c.Len() {
		if _, o, _ := loc.Locate(k); o == off {
			return k
		}
	}
	return -1
}

// checkAliasing rejects a C block that shares bytes with any A or B block of
// the problem, whose products are probs. Only buffers whose memory overlaps
// need the sweep.
func checkAliasing(pr *Problem, probs []problem, elem int64) error {
	region := func(c *packing.Coalesced) (uintptr, uintptr) {
		v, _, _, _ := c.Buffer().Region()
		v += uintptr(c.Start())
		return v, v + uintptr(c.Size())
	}
	c0, c1 := region(pr.C)
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
	type iv struct {
		lo, hi uintptr
		input  bool
		triple int
	}
	ivs := make([]iv, 0, 3*len(probs))
	add := func(c *packing.Coalesced, input bool, off func(*problem) int64, bytes func(*problem) int64) {
		base, _, _, _ := c.Buffer().Region()
		base += uintptr(c.Start())
		for i := range probs {
			lo := base + uintptr(off(&probs[i]))
			ivs = append(ivs, iv{lo, lo + uintptr(bytes(&probs[i])), input, int(probs[i].tripleIdx)})
		}
	}
	sizeA := func(q *problem) int64 { return int64(q.m) * int64(q.k) * elem }
	sizeB := func(q *problem) int64 { return int64(q.k) * int64(q.n) * elem }
	sizeC := func(q *problem) int64 { return int64(q.m) * int64(q.n) * elem }
	add(pr.C, false, func(q *problem) int64 { return q.c }, sizeC)
	add(pr.A, true, func(q *problem) int64 { return q.a }, sizeA)
	add(pr.B, true, func(q *problem) int64 { return q.b }, sizeB)
	slices.SortFunc(ivs, func(x, y iv) int { return cmp.Compare(x.lo, y.lo) })
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
			t := tripleOf(pr, probs, ci.triple)
			return &TripleError{Index: ci.triple, Triple: t, Reason: fmt.Sprintf("C block %d shares memory with an input of triple %d", t.C, ii.triple), Err: errAlias}
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

// shapeTable numbers shapes in order of first appearance: open addressing
// over a power-of-two table that doubles at half load, a few nanoseconds a
// lookup while it stays in cache (a solve has hundreds of shapes, not one
// per product).
type shapeTable struct {
	keys    []uint64 // m<<42 | n<<21 | k, plus one; 0 is empty
	classes []int32
	shift   uint
	n       int32
}

func (t *shapeTable) reset(keys []uint64, classes []int32) {
	size := 64 // or the largest power of two the memory handed in holds
	if c := min(cap(keys), cap(classes)); c > size {
		size = 1 << (bits.Len(uint(c)) - 1)
	}
	t.keys, t.classes = slices.Grow(keys[:0], size)[:size], slices.Grow(classes[:0], size)[:size]
	clear(t.keys)
	t.shift, t.n = uint(64-bits.Len(uint(size-1))), 0
}

// class returns the shape's number, or -1 when the shape does not fit the
// key (dimensions of 2^21 and more), which the caller numbers itself.
func (t *shapeTable) class(m, n, k int32) int32 {
	if m >= 1<<21 || n >= 1<<21 || k >= 1<<21 {
		return -1
	}
	key := (uint64(m)<<42 | uint64(n)<<21 | uint64(k)) + 1
	mask := uint64(len(t.keys) - 1)
	for h := (key * 0x9e3779b97f4a7c15) >> t.shift; ; h = (h + 1) & mask {
		switch t.keys[h] {
		case key:
			return t.classes[h]
		case 0:
			t.keys[h], t.classes[h] = key, t.n
			t.n++
			if 2*int(t.n) > len(t.keys) {
				t.grow()
			}
			return t.n - 1
		}
	}
}

func (t *shapeTable) grow() {
	keys, classes := t.keys, t.classes
	size := 2 * len(keys)
	t.keys, t.classes = make([]uint64, size), make([]int32, size)
	t.shift = uint(64 - bits.Len(uint(size-1)))
	mask := uint64(size - 1)
	for i, key := range keys {
		if key == 0 {
			continue
		}
		h := (key * 0x9e3779b97f4a7c15) >> t.shift
		for t.keys[h] != 0 {
			h = (h + 1) & mask
		}
		t.keys[h], t.classes[h] = key, classes[i]
	}
}

// The categories of a product, in launch order within a wave: tiny ones
// take a warp of the small kernel, small ones a thread block of it, the
// others go to cuBLAS.
const (
	catTiny = iota
	catSmall
	catBLAS
	nCats
)

func categoryOf(m, n, k, smallMax int32) uint8 {
	switch d := max(m, n, k); {
	case d > smallMax:
		return catBLAS
	case d > warpMax:
		return catSmall
	}
	return catTiny
}

// planScratch is NewPlan's working memory, reused from plan to plan: a
// fresh plan of thousands of products would otherwise spend as long
// faulting in new pages as planning.
type planScratch struct {
	probs   []problem // in triple order
	shapeOf []int32   // each product's shape class
	waveAt  []int32   // each product's wave
	waveOf  []int32   // by C position: the products seen so far
	// pairs holds 1 + the shape class of each pair of A and B classes met
	// so far (0: not met), indexed by their ranks in their groups:
	// denseA[classA]*(B's group's classes) + denseB[classB].
	pairs          []int32
	denseA, denseB denseClasses
	start, next    []int32
	bucket         []int32 // each product's bucket, between counting and placing
	rank           []int32 // each shape's rank: by category, then first appearance
	order          []int32 // products in launch order, when comparison-sorted
	perShape       []int32 // products per shape, counted as they are met
	// shapes numbers shapes in order of first appearance (huge those too
	// large for its key); shapeCat is each shape's category.
	shapes   shapeTable
	huge     map[[3]int32]int32
	shapeCat []uint8
	smallMax int32
}

var scratchPool = sync.Pool{New: func() any { return new(planScratch) }}

// planMemory is a plan's own memory for n products, handed from a closed
// plan to the next: a fresh plan otherwise writes its products into memory
// no cache holds.
type planMemory struct {
	problems []problem
}

var planMemoryPool sync.Pool

func takePlanMemory(n int) *planMemory {
	m, _ := planMemoryPool.Get().(*planMemory)
	if m == nil {
		m = &planMemory{}
	}
	m.problems = slices.Grow(m.problems[:0], n)[:n]
	return m
}

func (sc *planScratch) reset(n, nC int, smallMax int32) {
	sc.probs = slices.Grow(sc.probs[:0], n)[:n]
	sc.shapeOf = slices.Grow(sc.shapeOf[:0], n)[:n]
	sc.waveAt = slices.Grow(sc.waveAt[:0], n)[:n]
	sc.waveOf = slices.Grow(sc.waveOf[:0], nC)[:nC]
	clear(sc.waveOf)
	sc.shapes.reset(sc.shapes.keys, sc.shapes.classes)
	sc.huge = nil
	sc.shapeCat = sc.shapeCat[:0]
	sc.perShape = sc.perShape[:0]
	sc.smallMax = smallMax
}

// denseClasses numbers the classes of one group 0, 1, ... in a plan's class
// table.
type denseClasses []int32

// of returns each class's rank among the group's classes (-1 outside it)
// and how many the group has.
func (d *denseClasses) of(all []packing.Class, group []int) ([]int32, int) {
	row := slices.Grow((*d)[:0], len(all))[:len(all)]
	for i := range row {
		row[i] = -1
	}
	for r, c := range group {
		row[c] = int32(r)
	}
	*d = row
	return row, len(group)
}

// pairTable returns the cleared table of shape classes by pair of A and B
// classes, or nil when the pairs are too many to be worth a table for n
// products.
func (sc *planScratch) pairTable(nA, nB, n int) []int32 {
	if nA == 0 || nB == 0 || nA > (4*n+4096)/nB {
		return nil
	}
	sc.pairs = slices.Grow(sc.pairs[:0], nA*nB)[:nA*nB]
	clear(sc.pairs)
	return sc.pairs
}

// shapeClass numbers the shape m x n x k in order of first appearance and
// notes the category of a new one.
func (sc *planScratch) shapeClass(m, n, k int32) int32 {
	s := sc.shapes.class(m, n, k)
	if s < 0 {
		key := [3]int32{m, n, k}
		var ok bool
		if s, ok = sc.huge[key]; !ok {
			if sc.huge == nil {
				sc.huge = map[[3]int32]int32{}
			}
			s = sc.shapes.n
			sc.shapes.n++
			sc.huge[key] = s
		}
	}
	if int(s) == len(sc.shapeCat) {
		sc.shapeCat = append(sc.shapeCat, categoryOf(m, n, k, sc.smallMax))
		sc.perShape = append(sc.perShape, 0)
	}
	return s
}

// uniformRunsToBLAS moves to cuBLAS's category every shape of the small
// category (a dimension above warpMax, 16: a thread block of the kernel
// each) that at least uniformRunMin products share (uniformRunMin's
// measurement says why). Tiny shapes stay in the kernel.
func (sc *planScratch) uniformRunsToBLAS() {
	for s, n := range sc.perShape {
		if n >= uniformRunMin && sc.shapeCat[s] == catSmall {
			sc.shapeCat[s] = catBLAS
		}
	}
}

// plan orders the problems by wave, then by category (tiny, small, then
// cuBLAS's), then by shape in order of first appearance, then by C offset,
// and cuts them into launches. Inside a wave the order of products is free
// (no two write one C block): sorting a shape's products by C offset finds
// the strides of a packing class whatever order the list gave them in.
func (p *Plan) plan(sc *planScratch) {
	probs, shapeOf, waveAt, shapeCat := sc.probs, sc.shapeOf, sc.waveAt, sc.shapeCat
	nShapes := len(shapeCat)
	if p.strategy == Auto {
		sc.uniformRunsToBLAS()
	}
	// Each shape belongs to one category, so ranking the shapes by
	// category, then by first appearance, orders a wave's products as
	// (category, shape) would with a third of the buckets. catStart[c] is
	// the rank of category c's first shape.
	var catStart [nCats + 1]int
	for _, c := range shapeCat {
		catStart[c+1]++
	}
	for c := range nCats {
		catStart[c+1] += catStart[c]
	}
	rank := slices.Grow(sc.rank[:0], nShapes)[:nShapes]
	sc.rank = rank
	next := catStart
	for s, c := range shapeCat {
		rank[s] = int32(next[c])
		next[c]++
	}
	bucketOf := func(i int32) int { return int(waveAt[i])*nShapes + int(rank[shapeOf[i]]) }
	sorted := p.problems[:len(probs)]
	groupable := !p.dtype.IsComplex() && (p.strategy == Auto || p.strategy == Grouped)
	// Bucket by (wave, shape rank): one counting pass, then each bucket in
	// C order (already so when the list follows the layout).
	if nb := p.waves * nShapes; nb <= 2*len(probs)+64 {
		start := slices.Grow(sc.start[:0], nb+1)[:nb+1]
		clear(start)
		bucket := slices.Grow(sc.bucket[:0], len(probs))[:len(probs)]
		sc.bucket = bucket
		for i := range probs {
			b := int32(bucketOf(int32(i)))
			bucket[i] = b
			start[b+1]++
		}
		for b := range nb {
			start[b+1] += start[b]
		}
		next := append(sc.next[:0], start[:nb]...)
		sc.start, sc.next = start, next
		// Placed in list order, a bucket's products are in C order unless
		// one lands before the product placed ahead of it (ties in C are
		// in triple order already).
		unsorted := false
		for i, b := range bucket {
			j := next[b]
			q := &probs[i]
			unsorted = unsorted || j > start[b] && sorted[j-1].c > q.c
			sorted[j] = *q
			next[b] = j + 1
		}
		for b := range nb {
			if lo, hi := start[b], start[b+1]; unsorted && hi-lo > 1 && !sortedByC(sorted[lo:hi]) {
				slices.SortFunc(sorted[lo:hi], byC)
			}
		}
		for w := range p.waves {
			b := w * nShapes
			at := func(cat int) int { return int(start[b+catStart[cat]]) }
			p.addWave(w, at(catTiny), at(catSmall), at(catBLAS), at(nCats), groupable,
				bucketRuns(start, b, b+catStart[catBLAS]), bucketRuns(start, b+catStart[catBLAS], b+nShapes))
		}
		return
	}
	// Many waves of few products: a comparison sort is cheaper than the
	// buckets.
	order := slices.Grow(sc.order[:0], len(probs))[:len(probs)]
	sc.order = order
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(x, y int32) int {
		return cmp.Or(cmp.Compare(bucketOf(x), bucketOf(y)), byC(probs[x], probs[y]))
	})
	for j, i := range order {
		sorted[j] = probs[i]
	}
	catAt := func(j int) uint8 { return shapeCat[shapeOf[order[j]]] }
	for lo := 0; lo < len(order); {
		w := waveAt[order[lo]]
		hi := lo
		for hi < len(order) && waveAt[order[hi]] == w {
			hi++
		}
		tinyEnd := lo
		for tinyEnd < hi && catAt(tinyEnd) == catTiny {
			tinyEnd++
		}
		mid := tinyEnd
		for mid < hi && catAt(mid) == catSmall {
			mid++
		}
		p.addWave(int(w), lo, tinyEnd, mid, hi, groupable, shapeRuns(order, shapeOf, lo, mid), shapeRuns(order, shapeOf, mid, hi))
		lo = hi
	}
}

// addWave makes the launches of one wave, whose products sorted[lo:hi] are
// its tiny ones up to tinyEnd, then its small ones up to mid, then cuBLAS's;
// smallRuns and blasRuns are the sizes of the runs of one shape in the two
// parts.
func (p *Plan) addWave(w, lo, tinyEnd, mid, hi int, groupable bool, smallRuns, blasRuns []int) {
	if mid > lo {
		p.launches = append(p.launches, launch{kind: small, wave: w, lo: lo, hi: mid, tiny: tinyEnd - lo, groups: smallRuns})
		p.smallN += mid - lo
	}
	if mid < hi {
		p.cut(mid, hi, w, groupable, blasRuns)
	}
}

func byC(x, y problem) int {
	return cmp.Or(cmp.Compare(x.c, y.c), cmp.Compare(x.tripleIdx, y.tripleIdx))
}

// sortedByC is slices.IsSortedFunc(run, byC) without a call per pair.
func sortedByC(run []problem) bool {
	for i := 1; i < len(run); i++ {
		if a, b := &run[i-1], &run[i]; a.c > b.c || a.c == b.c && a.tripleIdx > b.tripleIdx {
			return false
		}
	}
	return true
}

// shapeRuns is the lengths of the runs of equal shape in order[lo:hi].
func shapeRuns(order, shapeOf []int32, lo, hi int) []int {
	var runs []int
	for j := lo; j < hi; j++ {
		if j == lo || shapeOf[order[j]] != shapeOf[order[j-1]] {
			runs = append(runs, 0)
		}
		runs[len(runs)-1]++
	}
	return runs
}

// bucketRuns is the sizes of the non-empty buckets b0 to b1-1, whose
// products start at bounds[b]: the runs of one shape.
func bucketRuns(bounds []int32, b0, b1 int) []int {
	n := 0
	for b := b0; b < b1; b++ {
		if bounds[b+1] > bounds[b] {
			n++
		}
	}
	runs := make([]int, 0, n)
	for b := b0; b < b1; b++ {
		if k := bounds[b+1] - bounds[b]; k > 0 {
			runs = append(runs, int(k))
		}
	}
	return runs
}

// cut makes the cuBLAS launches of one wave's products problems[lo:hi],
// whose runs of one shape have the given sizes.
func (p *Plan) cut(lo, hi, wave int, groupable bool, runs []int) {
	switch {
	case p.strategy == Loop:
		for i := lo; i < hi; i++ {
			p.launches = append(p.launches, launch{kind: single, wave: wave, lo: i, hi: i + 1})
		}
	case groupable && (len(runs) > 1 || p.strategy == Grouped):
		p.launches = append(p.launches, launch{kind: grouped, wave: wave, lo: lo, hi: hi, groups: runs})
		p.needArr = true
	default:
		start := lo
		for _, r := range runs {
			p.launches = append(p.launches, p.batch(start, start+r, wave))
			start += r
		}
	}
}

// batch makes one launch of a same-shape run: strided when A, B and C
// offsets each advance by a constant, non-negative stride, else pointers.
func (p *Plan) batch(lo, hi, wave int) launch {
	l := launch{kind: strided, wave: wave, lo: lo, hi: hi}
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

// betaOf is the beta of a wave: the problem's in wave 0, 1 afterwards.
func betaOf(beta complex128, wave int) complex128 {
	if wave > 0 {
		return 1
	}
	return beta
}

// Launches is the number of library calls and kernel launches one Run
// makes where the small-block kernel is available.
func (p *Plan) Launches() int { return len(p.launches) }

// Waves is the number of conflict-free waves.
func (p *Plan) Waves() int { return p.waves }

// DType is the element type of the problem (0 for an empty list).
func (p *Plan) DType() packing.DType { return p.dtype }

// Summary counts the launches by kind.
func (p *Plan) Summary() Summary {
	s := Summary{Problems: p.count, Waves: p.waves, Launches: len(p.launches), SmallProblems: p.smallN}
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
		case small:
			s.Small++
		}
	}
	return s
}

// Matches reports whether a run on these operands can use the plan: each
// has the packing plan and group of the plan's operand in its place.
func (p *Plan) Matches(A, B, C *packing.Coalesced) bool {
	return A != nil && B != nil && C != nil && layoutOf(A) == p.layouts[0] && layoutOf(B) == p.layouts[1] && layoutOf(C) == p.layouts[2]
}

// bind checks operands against the plan. Aliasing needs a new check only
// when C shares a buffer with an input in a way the planned operands did not.
func (p *Plan) bind(o Operands) error {
	if !p.Matches(o.A, o.B, o.C) {
		which := "nil"
		for i, c := range []*packing.Coalesced{o.A, o.B, o.C} {
			if c != nil && layoutOf(c) != p.layouts[i] {
				which = [...]string{"A", "B", "C"}[i]
				break
			}
		}
		return fmt.Errorf("gemm: operand %s is not laid out as the plan's (another packing plan or group): plan again: %w", which, errLayout)
	}
	if err := checkScalars(p.dtype, len(p.problems), o.Alpha, o.Beta); err != nil {
		return err
	}
	shares := func(x, y *packing.Coalesced) bool { return x.Buffer() == y.Buffer() }
	pr := &p.prob
	same := func(x, y, px, py *packing.Coalesced) bool {
		return shares(x, y) == shares(px, py) && (!shares(x, y) || x.Start()-y.Start() == px.Start()-py.Start())
	}
	if (shares(o.C, o.A) || shares(o.C, o.B)) && !(same(o.C, o.A, pr.C, pr.A) && same(o.C, o.B, pr.C, pr.B)) {
		q := *pr
		q.A, q.B, q.C = o.A, o.B, o.C
		return checkAliasing(&q, p.problems, p.dtype.Size())
	}
	return nil
}

// Close releases the plan's device memory and gives its host memory to the
// next plan made. The plan cannot run afterwards; Summary still answers.
func (p *Plan) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("gemm: plan closed twice: %w", distbuf.ErrClosed)
	}
	p.closed = true
	// Nothing reads the products after Close (a run checks closed first):
	// the next plan reuses their memory while it is still in cache.
	planMemoryPool.Put(&planMemory{problems: p.problems[:0]})
	p.problems = nil
	if p.dev != nil {
		err := p.dev.free()
		p.dev = nil
		return err
	}
	return nil
}

// deviceBuffers lists the plan's device memory (tests resolve addresses in it).
func (p *Plan) deviceBuffers() []*devalloc.Buffer {
	var out []*devalloc.Buffer
	if p.dev != nil {
		for _, b := range []*devalloc.Buffer{p.dev.stack, p.dev.arrays} {
			if b != nil {
				out = append(out, b)
			}
		}
	}
	return out
}

// deviceState is a plan's memory on one device: the parameter stack, and
// the cuBLAS pointer arrays with the operand addresses they were made for.
// Runs on the stream s that made it read it in stream order without ledger
// entries; writes (the arrays for new addresses) are always declared.
type deviceState struct {
	a        *devalloc.Allocator
	s        *devalloc.Stream
	stack    *devalloc.Buffer // stackEntry per problem, in launch order
	arrays   *devalloc.Buffer // [A pointers | B pointers | C pointers], 8 bytes each
	arrBases [3]uintptr
	// arrWriter is the stream that last wrote the arrays: another stream's
	// reads must be declared to wait for it.
	arrWriter *devalloc.Stream
}

func (d *deviceState) free() error {
	var errs []error
	for _, b := range []*devalloc.Buffer{d.stack, d.arrays} {
		if b != nil {
			if err := b.Free(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("gemm: plan memory: %w", errs[0])
	}
	return nil
}
