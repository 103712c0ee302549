package main

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// sectorKey names a block structure of the sectors workload: the bond
// dimension and the bond (a growing run's step) it was made for.
type sectorKey struct{ m, bond int }

// blockLoc is where a block sits in a solve's operands: a slot (an index
// in the solve's list of Coalesced) and its group position there.
type blockLoc struct{ slot, pos int }

// gemmGroup is the products of one step that share their A, B and C
// buffers (slots): one gemm plan, made at the structure's first solve.
type gemmGroup struct {
	a, b, c int
	triples []gemm.Triple
	plan    *gemm.Plan
}

// step3Group is the step-3 products of one source's T2 blocks that share
// an R and an H·psi buffer. Its A, the received buffer, has the sender's
// layout, known once the first exchange has delivered it: the slabs are
// named by id until then.
type step3Group struct {
	src, b, c  int // source rank, R and H·psi slots
	ids        []uint64
	bpos, cpos []int
	plan       *gemm.Plan
}

// allocSpec is one allocation of a solve.
type allocSpec struct {
	plan *packing.Plan
	slot int
	// view, when set, is another layout of the same bytes (step 2's
	// reshape of T1), made a Coalesced over the allocation at viewSlot.
	view     *packing.Plan
	viewSlot int
	// stage holds the operand in pinned memory: the allocation is its
	// upload.
	stage *packing.Coalesced
	// zero clears the buffer before the GEMMs: H·psi, which step 3
	// accumulates into with beta = 1. A block's first product may come
	// from any of several plans (one per source, R buffer and H·psi
	// buffer), so no one plan could start it with beta = 0.
	zero bool
}

// hpsiCheck is one H·psi block this rank owns and its reference.
type hpsiCheck struct {
	ref *hpsiRef
	loc blockLoc
}

// sectorLayout is what a rank plans once per block structure and reuses
// every solve on it: the packing plans of its operands, the operands
// staged in pinned memory, the GEMM plans of the three steps, the exchange
// pattern and the references of the check.
//
// Each operand set is a tail buffer (one allocation for its many small
// blocks) plus one allocation per big block (structure.go: both sectors
// at least bigDim), so the GEMMs are grouped by the (A, B, C) buffers they
// read and write. The inputs' tails (Wc, L, psi, R) share one joined
// allocation and one upload. T2 is laid out by destination (msg.JoinSend):
// step 2 writes into the send buffers, and the message from each source
// is step 3's A operand as received.
type sectorLayout struct {
	st      *sectorStructure
	rank    int
	lastUse int
	nSlots  int

	inTail       *packing.Plan // Wc, L, psi and R tails, joined: groups 0 to 3
	inTailStage  *packing.Coalesced
	inTailSlot   [4]int      // slot of each part, by group (Dest); -1 when empty
	inTailGroups []int       // the groups with blocks, in the order of the parts
	inputs       []allocSpec // the big input blocks, each uploaded from its stage
	t1           []allocSpec // T1, with its step-2 view
	hpsi         []allocSpec // H·psi

	t2Joined   *packing.Plan // every destination's T2 slabs in one buffer, nil when none
	t2View     *packing.Plan // the same bytes as (Dw'') x (Da'·Db) blocks
	t2ViewSlot int

	step1, step2 []*gemmGroup
	step3        []*step3Group
	expect       map[int]int // slabs expected from each source
	recvSlot     map[int]int
	pattern      *msg.Pattern

	checks []hpsiCheck
	probes map[int][]float64 // by qb' sector
	bigs   int               // allocations of single big blocks (T1: of pairs)
}

// noRelease is the release of a view over a buffer another Coalesced of
// the solve owns (a reshape, the send buffer seen whole): freeing the view
// gives nothing back.
func noRelease() error { return nil }

// Desc ids of the joined input tail: the kind in the top byte.
const (
	idWc = uint64(iota+1) << 56
	idL
	idPsi
	idR
)

// newSectorLayout plans rank's part of structure st: layouts, views and
// GEMM groups, without allocating or staging anything.
func newSectorLayout(st *sectorStructure, rank int) (*sectorLayout, error) {
	l := &sectorLayout{st: st, rank: rank, expect: map[int]int{}, recvSlot: map[int]int{}}
	newSlot := func() int { l.nSlots++; return l.nSlots - 1 }
	f64 := packing.Float64

	// The inputs: which blocks this rank reads.
	useL := make([]bool, len(st.l))
	var myT1 []int
	for t, b := range st.t1 {
		if st.owner[b.ib] == rank {
			myT1 = append(myT1, t)
			useL[b.l] = true
		}
	}
	var tail []packing.Desc
	wcLoc := make([]blockLoc, len(st.wc))
	lLoc := make([]blockLoc, len(st.l))
	psiLoc := make([]blockLoc, len(st.psi))
	rLoc := make([]blockLoc, len(st.r)) // slab 0; slab w'' at pos + w'' (tail) or w'' (big)
	for i := range l.inTailSlot {
		l.inTailSlot[i] = -1
	}
	partSlot := func(g int) int {
		if l.inTailSlot[g] < 0 {
			l.inTailSlot[g] = newSlot()
		}
		return l.inTailSlot[g]
	}
	bigInput := func(descs []packing.Desc) (int, error) {
		p, err := packing.NewPlan(descs, packing.Options{})
		if err != nil {
			return 0, err
		}
		slot := newSlot()
		l.inputs = append(l.inputs, allocSpec{plan: p, slot: slot})
		l.bigs++
		return slot, nil
	}
	for w, b := range st.wc {
		wcLoc[w] = blockLoc{partSlot(0), w}
		tail = append(tail, packing.Desc{ID: idWc | uint64(w), DType: f64, Rows: dw(b.kw2), Cols: dw(b.kw), Dest: 0})
	}
	// place puts block d, of the tail part d.Dest, in a big input of its
	// own or next in that part (n counts the part's blocks).
	place := func(d packing.Desc, big bool, n *int) (blockLoc, error) {
		if big {
			slot, err := bigInput([]packing.Desc{d})
			return blockLoc{slot, 0}, err
		}
		tail = append(tail, d)
		*n++
		return blockLoc{partSlot(d.Dest), *n - 1}, nil
	}
	n := 0
	for i, e := range st.l {
		if !useL[i] {
			continue
		}
		d := packing.Desc{ID: idL | uint64(i), DType: f64, Rows: dw(e.kw) * st.da(e.outer), Cols: st.da(e.inner), Dest: 1}
		var err error
		if lLoc[i], err = place(d, st.lBig(i), &n); err != nil {
			return nil, err
		}
	}
	n = 0
	for p, b := range st.psi {
		if st.owner[b.ib] != rank {
			continue
		}
		d := packing.Desc{ID: idPsi | uint64(p), DType: f64, Rows: st.da(b.ia), Cols: st.db(b.ib), Dest: 2}
		var err error
		if psiLoc[p], err = place(d, st.psiBig(p), &n); err != nil {
			return nil, err
		}
	}
	n = 0
	for i, e := range st.r {
		if st.owner[e.outer] != rank {
			continue
		}
		slabs := make([]packing.Desc, dw(e.kw))
		for w := range slabs {
			slabs[w] = packing.Desc{ID: idR | uint64(i*4+w), DType: f64, Rows: st.db(e.outer), Cols: st.db(e.inner), Dest: 3}
		}
		if st.rBig(i) {
			slot, err := bigInput(slabs)
			if err != nil {
				return nil, err
			}
			rLoc[i] = blockLoc{slot, 0}
			continue
		}
		rLoc[i] = blockLoc{partSlot(3), n}
		tail = append(tail, slabs...)
		n += len(slabs)
	}
	plan, err := packing.NewPlan(tail, packing.Options{})
	if err != nil {
		return nil, err
	}
	if l.inTail, err = plan.Joined(nil); err != nil {
		return nil, err
	}
	for _, g := range plan.Groups() {
		l.inTailGroups = append(l.inTailGroups, g.Dest)
	}

	// T1: the tail and one allocation per big (qa', qb) pair, each with
	// its step-2 view.
	t1Loc := make([]blockLoc, len(st.t1))  // step 1: (Dw·Da') x Db
	t1View := make([]blockLoc, len(st.t1)) // step 2: Dw x (Da'·Db)
	pairs := map[[2]int][]int{}
	var pairOrder [][2]int
	var t1Tail []int
	for _, t := range myT1 {
		b := st.t1[t]
		if !st.t1Big(t) {
			t1Tail = append(t1Tail, t)
			continue
		}
		k := [2]int{b.iap, b.ib}
		if pairs[k] == nil {
			pairOrder = append(pairOrder, k)
		}
		pairs[k] = append(pairs[k], t)
	}
	t1Alloc := func(ts []int) error {
		descs := make([]packing.Desc, len(ts))
		for k, t := range ts {
			b := st.t1[t]
			descs[k] = packing.Desc{ID: uint64(t), DType: f64, Rows: dw(b.kw) * st.da(b.iap), Cols: st.db(b.ib)}
		}
		p, err := packing.NewPlan(descs, packing.Options{})
		if err != nil {
			return err
		}
		view, err := reshaped(p, func(k int) (int, int) {
			b := st.t1[ts[k]]
			return dw(b.kw), st.da(b.iap) * st.db(b.ib)
		})
		if err != nil {
			return err
		}
		spec := allocSpec{plan: p, slot: newSlot(), view: view, viewSlot: newSlot()}
		for k, t := range ts {
			t1Loc[t] = blockLoc{spec.slot, k}
			t1View[t] = blockLoc{spec.viewSlot, k}
		}
		l.t1 = append(l.t1, spec)
		return nil
	}
	if len(t1Tail) > 0 {
		if err := t1Alloc(t1Tail); err != nil {
			return nil, err
		}
	}
	for _, k := range pairOrder {
		if err := t1Alloc(pairs[k]); err != nil {
			return nil, err
		}
		l.bigs++
	}

	// T2, laid out by destination: each block as its Dw'' slabs (what
	// step 3 multiplies), and viewed whole for step 2.
	var myT2 []int
	t2Pos := map[int]int{}
	for t, b := range st.t2 {
		if st.owner[b.ib] == rank {
			t2Pos[t] = len(myT2)
			myT2 = append(myT2, t)
		}
	}
	if len(myT2) > 0 {
		var slabs []packing.Desc
		for _, t := range myT2 {
			b := st.t2[t]
			for w := range dw(b.kw2) {
				slabs = append(slabs, packing.Desc{ID: uint64(t*4 + w), DType: f64, Rows: st.da(b.iap), Cols: st.db(b.ib), Dest: st.ownerOfT2(t)})
			}
		}
		send, err := packing.NewPlan(slabs, packing.Options{})
		if err != nil {
			return nil, err
		}
		if l.t2Joined, err = msg.JoinSend(send); err != nil {
			return nil, err
		}
		if l.t2View, err = wholeBlocks(l.t2Joined, myT2, func(t int) (int, int) {
			b := st.t2[t]
			return dw(b.kw2), st.da(b.iap) * st.db(b.ib)
		}); err != nil {
			return nil, err
		}
		l.t2ViewSlot = newSlot()
	}

	// H·psi: the tail and one allocation per big block, cleared each solve.
	hLoc := make([]blockLoc, len(st.psi))
	var hTail []packing.Desc
	var hTailLocs []int
	for p, b := range st.psi {
		if st.owner[b.ib] != rank {
			continue
		}
		d := packing.Desc{ID: uint64(p), DType: f64, Rows: st.da(b.ia), Cols: st.db(b.ib)}
		if st.psiBig(p) {
			hp, err := packing.NewPlan([]packing.Desc{d}, packing.Options{})
			if err != nil {
				return nil, err
			}
			spec := allocSpec{plan: hp, slot: newSlot(), zero: true}
			hLoc[p] = blockLoc{spec.slot, 0}
			l.hpsi = append(l.hpsi, spec)
			l.bigs++
			continue
		}
		hTailLocs = append(hTailLocs, p)
		hTail = append(hTail, d)
	}
	if len(hTail) > 0 {
		hp, err := packing.NewPlan(hTail, packing.Options{})
		if err != nil {
			return nil, err
		}
		spec := allocSpec{plan: hp, slot: newSlot(), zero: true}
		for k, p := range hTailLocs {
			hLoc[p] = blockLoc{spec.slot, k}
		}
		l.hpsi = append(l.hpsi, spec)
	}

	// Step 1: T1 = alpha L·psi, one product per T1 block.
	groups := map[[3]int]*gemmGroup{}
	group := func(list *[]*gemmGroup, a, b, c blockLoc) {
		k := [3]int{a.slot, b.slot, c.slot}
		g := groups[k]
		if g == nil {
			g = &gemmGroup{a: a.slot, b: b.slot, c: c.slot}
			groups[k] = g
			*list = append(*list, g)
		}
		g.triples = append(g.triples, gemm.Triple{A: a.pos, B: b.pos, C: c.pos})
	}
	for _, t := range myT1 {
		b := st.t1[t]
		group(&l.step1, lLoc[b.l], psiLoc[b.psi], t1Loc[t])
	}
	// Step 2: T2 = Wc·T1, into the send buffers' view. Every product into
	// one T2 block reads the T1 buffer of its (qa', qb) pair, so one plan
	// writes each T2 block whole, with beta = 0.
	clear(groups)
	for _, p := range st.step2 {
		if st.owner[st.t1[p.t1].ib] != rank {
			continue
		}
		group(&l.step2, wcLoc[p.wc], t1View[p.t1], blockLoc{l.t2ViewSlot, t2Pos[p.t2]})
	}
	// Step 3: H·psi += T2slab · Rslab^T, by source, R buffer and H·psi buffer.
	s3 := map[[3]int]*step3Group{}
	for t, b := range st.t2 {
		if st.ownerOfT2(t) != rank {
			continue
		}
		src := st.owner[b.ib]
		rl, hl := rLoc[b.r], hLoc[b.hpsi]
		k := [3]int{src, rl.slot, hl.slot}
		g := s3[k]
		if g == nil {
			g = &step3Group{src: src, b: rl.slot, c: hl.slot}
			s3[k] = g
			l.step3 = append(l.step3, g)
		}
		for w := range dw(b.kw2) {
			g.ids = append(g.ids, uint64(t*4+w))
			g.bpos = append(g.bpos, rl.pos+w)
			g.cpos = append(g.cpos, hl.pos)
		}
		l.expect[src] += dw(b.kw2)
		if _, ok := l.recvSlot[src]; !ok {
			l.recvSlot[src] = newSlot()
		}
	}
	for p, b := range st.psi {
		if st.owner[b.ib] == rank {
			l.checks = append(l.checks, hpsiCheck{ref: &hpsiRef{psi: p}, loc: hLoc[p]})
		}
	}
	return l, nil
}

// reshaped is p (one group) with block k seen as shape(k) instead, at the
// same offset: the same bytes, rows and columns regrouped.
func reshaped(p *packing.Plan, shape func(k int) (rows, cols int)) (*packing.Plan, error) {
	entries, size, err := p.Manifest(0)
	if err != nil {
		return nil, err
	}
	for k := range entries {
		rows, cols := shape(k)
		if rows*cols != entries[k].Rows*entries[k].Cols {
			return nil, fmt.Errorf("sectors: block %d of %dx%d cannot be viewed as %dx%d", entries[k].ID, entries[k].Rows, entries[k].Cols, rows, cols)
		}
		entries[k].Rows, entries[k].Cols = rows, cols
	}
	return packing.FromManifest(entries, size)
}

// wholeBlocks views the joined send layout, whose blocks are the slabs of
// the T2 blocks ts in order, as the T2 blocks themselves: each at its
// first slab's offset, its slabs having been laid out one after the other
// (consecutive in the list, of one shape and destination: one class).
func wholeBlocks(joined *packing.Plan, ts []int, shape func(t int) (rows, cols int)) (*packing.Plan, error) {
	slabs, size, err := joined.Manifest(0)
	if err != nil {
		return nil, err
	}
	out := make([]packing.Entry, len(ts))
	k := 0
	for i, t := range ts {
		rows, cols := shape(t)
		first := slabs[k]
		for w := range rows {
			e := slabs[k+w]
			if e.ID != uint64(t*4+w) || e.Offset != first.Offset+int64(w)*int64(e.Rows*e.Cols)*8 || e.Rows*e.Cols != cols {
				return nil, fmt.Errorf("sectors: slab %d of T2 block %d is not where a whole-block view needs it (offset %d, first slab at %d)", w, t, e.Offset, first.Offset)
			}
		}
		out[i] = packing.Entry{ID: uint64(t), DType: packing.Float64, Rows: rows, Cols: cols, Offset: first.Offset}
		k += rows
	}
	return packing.FromManifest(out, size)
}

// stage allocates the pinned copies of the inputs and fills them with the
// operands' values (in parallel), then computes the references of the
// check. It is the harness's work, once per structure.
func (l *sectorLayout) stage(sv *solver) (err error) {
	st := l.st
	defer func() {
		if err != nil {
			err = errors.Join(err, l.freeStages())
		}
	}()
	fill := func(d packing.Desc, dst []float64) error {
		id := d.ID &^ (0xff << 56)
		switch d.ID >> 56 {
		case idWc >> 56:
			copy(dst, st.wc[id].vals)
		case idL >> 56:
			fillParallel(dst, st.lKey(int(id)), 0)
		case idPsi >> 56:
			fillParallel(dst, st.psiKey(int(id)), 0)
		case idR >> 56:
			i, w := int(id/4), int(id%4)
			fillParallel(dst, st.rKey(i), w*len(dst))
		default:
			return fmt.Errorf("sectors: staging: unknown block id %#x", d.ID)
		}
		return nil
	}
	stageOne := func(p *packing.Plan) (*packing.Coalesced, error) {
		c, err := packing.Alloc(sv.a, p, sv.s, packing.AllocOptions{Pinned: true})
		if err != nil {
			return nil, err
		}
		err = c.OnHost(sv.s, devalloc.Write, func(h *packing.HostBlocks) error {
			return parallel(h.Len(), func(k int) error {
				d, err := h.Desc(k)
				if err != nil {
					return err
				}
				f, err := h.Float64s(k)
				if err != nil {
					return err
				}
				return fill(d, f)
			})
		})
		if err != nil {
			return nil, errors.Join(err, c.Free())
		}
		return c, nil
	}
	if l.inTailStage, err = stageOne(l.inTail); err != nil {
		return err
	}
	for i := range l.inputs {
		if l.inputs[i].stage, err = stageOne(l.inputs[i].plan); err != nil {
			return err
		}
	}
	refs, err := st.references(l.rank)
	if err != nil {
		return err
	}
	byPsi := map[int]*hpsiRef{}
	for _, r := range refs {
		byPsi[r.psi] = r
	}
	l.probes = map[int][]float64{}
	for i := range l.checks {
		c := &l.checks[i]
		r := byPsi[c.ref.psi]
		if r == nil {
			return fmt.Errorf("sectors: no reference for H·psi block %s", st.describePsi(c.ref.psi))
		}
		c.ref = r
		ib := st.psi[r.psi].ib
		if l.probes[ib] == nil {
			l.probes[ib] = make([]float64, st.db(ib))
			st.probeValues(l.probes[ib], ib)
		}
	}
	return nil
}

// fillParallel is fillValues over a large block, cut into pieces for the
// cores; a small one is filled at once (the tail's blocks are filled in
// parallel with each other instead).
func fillParallel(dst []float64, key uint64, first int) {
	const piece = 1 << 16
	if len(dst) <= piece {
		fillValues(dst, key, first)
		return
	}
	_ = parallel((len(dst)+piece-1)/piece, func(k int) error {
		lo := k * piece
		hi := min(lo+piece, len(dst))
		fillValues(dst[lo:hi], key, first+lo)
		return nil
	})
}

func (l *sectorLayout) freeStages() error {
	var errs []error
	if l.inTailStage != nil {
		errs = append(errs, l.inTailStage.Free())
		l.inTailStage = nil
	}
	for i := range l.inputs {
		if l.inputs[i].stage != nil {
			errs = append(errs, l.inputs[i].stage.Free())
			l.inputs[i].stage = nil
		}
	}
	return errors.Join(errs...)
}

// close releases what the layout holds: its GEMM plans and staged operands.
func (l *sectorLayout) close() error {
	var errs []error
	for _, gs := range [][]*gemmGroup{l.step1, l.step2} {
		for _, g := range gs {
			if g.plan != nil {
				errs = append(errs, g.plan.Close())
				g.plan = nil
			}
		}
	}
	for _, g := range l.step3 {
		if g.plan != nil {
			errs = append(errs, g.plan.Close())
			g.plan = nil
		}
	}
	errs = append(errs, l.freeStages())
	return errors.Join(errs...)
}
