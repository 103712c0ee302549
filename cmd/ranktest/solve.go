package main

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// maxCachedLayouts bounds the bonds whose layouts (plans, patterns, staged
// operands) a solver keeps: a sweep over more bonds than this plans every
// solve afresh, as a solver with a bounded plan cache would.
const maxCachedLayouts = 16

// solver runs one rank's synthetic solves over a sweep: solve i is at bond
// i mod cfg.bonds, and each bond has its own block structure, which repeats
// every time the sweep comes back to it, as in a DMRG sweep at fixed bond
// dimension. A bond's first solve (every solve with -fresh) lays the blocks
// out and plans the GEMMs and the exchange; later ones reuse all of it. Each
// solve allocates, uploads, multiplies, exchanges, verifies and frees anew.
type solver struct {
	cfg        config
	world      *cluster.Comm
	rank, size int
	a          *devalloc.Allocator
	s          *devalloc.Stream
	eng        *gemm.Engine
	ex         *msg.Exchanger // -mode packed
	shape      workloadShape
	timer      *deviceTimer // CUDA events; nil on the host backend

	bonds   map[int]*bondData // the workload at each bond: kept for the run
	layouts map[int]*layout   // the plans of recently used bonds
	solves  int               // solves started, for the layouts' recency

	// The sectors workload's layouts of recently used structures, and the
	// structure of the latest fresh solve, for the report.
	sectorLayouts map[sectorKey]*sectorLayout
	lastStructure *sectorStructure

	calls        *callTimes    // -calls; nil otherwise
	harnessCalls uint64        // runtime calls of the harness's own work (sv.harness), left out of the solves'
	plansBuilt   int64         // GEMM plans made by this rank
	triples      []gemm.Triple // triple i is (i, i, i), for every plan (NewPlan keeps none)
}

// bondData is the workload at one bond: every rank's block list and the
// references of the blocks this rank receives.
type bondData struct {
	index     int
	peerSpecs [][]blockSpec // by source rank
	specs     []blockSpec   // this rank's
	descs     operandDescs  // this rank's blocks as descriptors
	incoming  []incomingBlock
	refs      map[refKey][]float64
}

// layout is what a solve at a bond plans once: the packing plans, the
// operands staged in pinned memory, the GEMM plan (made at the bond's first
// solve) and the exchange pattern.
type layout struct {
	bond *bondData
	// planAB lays A and B out in one buffer, the parts of a joined plan:
	// group 0 is A, group 1 B.
	planAB, planC *packing.Plan
	// joinC lays every destination group of planC out in one buffer, each
	// after its manifest's room (msg.JoinSend): one allocation, one padding
	// clear and one GEMM plan for all destinations; its parts are the send
	// buffers.
	joinC *packing.Plan
	// stageAB holds the operands in pinned host memory, filled once: each
	// solve moves both to the device with one copy. stageA and stageB are
	// its parts.
	stageAB, stageA, stageB *packing.Coalesced
	gemmPlan                *gemm.Plan
	pattern                 *msg.Pattern
	blockPlans              [][3]*packing.Plan // -mode perblock: one plan per operand and block
	lastUse                 int
}

type refKey struct {
	src int
	id  uint64
}

// incomingBlock is a block this rank receives: from rank src, its id there.
type incomingBlock struct {
	src int
	id  uint64
	sp  blockSpec
}

func newSolver(cfg config, world *cluster.Comm, a *devalloc.Allocator) (*solver, error) {
	if cfg.mode == "" {
		cfg.mode = "packed"
	}
	if cfg.bonds == 0 {
		cfg.bonds = defaultBonds
	}
	sv := &solver{cfg: cfg, world: world, rank: world.Rank(), size: world.Size(), a: a, s: a.DefaultStream(),
		shape: defaultShape, bonds: map[int]*bondData{}, layouts: map[int]*layout{}, sectorLayouts: map[sectorKey]*sectorLayout{}}
	if cfg.blocks > 0 {
		sv.shape.blocks = cfg.blocks
	}
	var err error
	if sv.eng, err = gemm.NewEngine(sv.s, gemm.EngineOptions{}); err != nil {
		return nil, err
	}
	if a.Info().Backend == devalloc.BackendCUDA {
		if sv.timer, err = newDeviceTimer(sv.s); err != nil {
			return nil, errors.Join(err, sv.close())
		}
	}
	if cfg.mode == "packed" {
		if sv.ex, err = msg.New(msg.Options{Comm: world, Alloc: a}); err != nil {
			return nil, errors.Join(err, sv.close())
		}
	}
	return sv, nil
}

func (sv *solver) close() error {
	var errs []error
	for _, l := range sv.layouts {
		errs = append(errs, l.close())
	}
	sv.layouts = map[int]*layout{}
	for _, l := range sv.sectorLayouts {
		errs = append(errs, l.close())
	}
	sv.sectorLayouts = map[sectorKey]*sectorLayout{}
	if sv.timer != nil {
		errs = append(errs, sv.timer.close())
	}
	if sv.eng != nil {
		errs = append(errs, sv.eng.Close())
	}
	if sv.ex != nil {
		errs = append(errs, sv.ex.Close())
	}
	return errors.Join(errs...)
}

func (l *layout) close() error {
	return errors.Join(l.closePlan(), l.freeStaging())
}

// closePlan releases the GEMM plan, the solver's part of the layout.
func (l *layout) closePlan() error {
	if l.gemmPlan == nil {
		return nil
	}
	err := l.gemmPlan.Close()
	l.gemmPlan = nil
	return err
}

// freeStaging frees the staged operands, the harness's part of the layout.
func (l *layout) freeStaging() error {
	if l.stageAB == nil {
		return nil
	}
	err := l.stageAB.Free()
	l.stageAB, l.stageA, l.stageB = nil, nil, nil
	return err
}

// bondOf is the bond of solve iter.
func (sv *solver) bondOf(iter int) int { return iter % sv.cfg.bonds }

// bondData returns the workload at a bond, made on first use.
func (sv *solver) bondData(b int) *bondData {
	if bd, ok := sv.bonds[b]; ok {
		return bd
	}
	bd := &bondData{index: b, peerSpecs: make([][]blockSpec, sv.size), refs: map[refKey][]float64{}}
	for src := range sv.size {
		bd.peerSpecs[src] = specsFor(sv.cfg.seed, b, src, sv.size, sv.shape)
		for id, sp := range bd.peerSpecs[src] {
			if sp.dest == sv.rank {
				bd.incoming = append(bd.incoming, incomingBlock{src: src, id: uint64(id), sp: sp})
			}
		}
	}
	bd.specs = bd.peerSpecs[sv.rank]
	bd.descs = descsOf(bd.specs)
	sv.bonds[b] = bd
	return bd
}

// layoutFor returns the layout of solve iter's bond, cached or made anew
// (fresh). planUS is the time spent laying the blocks out, which belongs to
// the solve; staging the operands is the workload's, and is not timed.
func (sv *solver) layoutFor(iter int) (l *layout, fresh bool, planUS float64, err error) {
	sv.solves++
	b := sv.bondOf(iter)
	if l, ok := sv.layouts[b]; ok && !sv.cfg.fresh {
		l.lastUse = sv.solves
		return l, false, 0, nil
	}
	bd := sv.bondData(b)
	if old, ok := sv.layouts[b]; ok {
		delete(sv.layouts, b)
		if err := old.close(); err != nil {
			return nil, true, 0, err
		}
	}
	if err := sv.evictLayouts(); err != nil {
		return nil, true, 0, err
	}
	start := time.Now()
	l = &layout{bond: bd, lastUse: sv.solves}
	if l.planAB, l.planC, err = bd.descs.plans(); err != nil {
		return nil, true, 0, err
	}
	if sv.cfg.mode == "packed" {
		if l.joinC, err = msg.JoinSend(l.planC); err != nil {
			return nil, true, 0, err
		}
	}
	if sv.ex != nil {
		l.pattern = sv.ex.NewPattern()
	}
	planUS = since(start)
	err = sv.harness(func() (err error) {
		if l.stageAB, err = sv.stage(bd, l.planAB); err != nil {
			return err
		}
		parts, err := l.stageAB.Parts()
		if err != nil {
			return err
		}
		l.stageA, l.stageB = parts[0], parts[1]
		return nil
	})
	if err != nil {
		return nil, true, 0, errors.Join(err, l.close())
	}
	if !sv.cfg.fresh {
		sv.layouts[b] = l
	}
	return l, true, planUS, nil
}

// evictLayouts makes room for one more layout, dropping the least recently
// used.
func (sv *solver) evictLayouts() error {
	for len(sv.layouts) >= maxCachedLayouts {
		oldest := -1
		for b, l := range sv.layouts {
			if oldest < 0 || l.lastUse < sv.layouts[oldest].lastUse {
				oldest = b
			}
		}
		l := sv.layouts[oldest]
		delete(sv.layouts, oldest)
		if err := l.close(); err != nil {
			return err
		}
	}
	return nil
}

// stage fills a pinned buffer laid out by the joined plan ab with the
// operands of every block at bond bd: A's blocks, then B's.
func (sv *solver) stage(bd *bondData, ab *packing.Plan) (*packing.Coalesced, error) {
	c, err := packing.Alloc(sv.a, ab, sv.s, packing.AllocOptions{Pinned: true})
	if err != nil {
		return nil, err
	}
	n := c.Len() / 2
	err = c.OnHost(sv.s, devalloc.Write, func(h *packing.HostBlocks) error {
		for k := range h.Len() {
			f, err := h.Float64s(k)
			if err != nil {
				return err
			}
			operand(f, sv.cfg.seed, bd.index, sv.rank, uint64(k%n), k/n)
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(err, c.Free())
	}
	return c, nil
}

// ref returns A*B of block id of rank src at bond bd, computed once.
func (sv *solver) ref(bd *bondData, src int, id uint64, sp blockSpec) []float64 {
	k := refKey{src, id}
	if r, ok := bd.refs[k]; ok {
		return r
	}
	r := reference(sv.cfg.seed, bd.index, src, id, sp)
	bd.refs[k] = r
	return r
}

// check verifies one received block and records the first failure.
func (sv *solver) check(st *iterStats, bd *bondData, src int, id uint64, got []float64, iter int) {
	specs := bd.peerSpecs[src]
	if id >= uint64(len(specs)) || specs[id].dest != sv.rank {
		st.verifyFailures++
		if st.firstFailure == "" {
			st.firstFailure = fmt.Sprintf("rank %d: block %d from rank %d was not meant for this rank", sv.rank, id, src)
		}
		return
	}
	sp := specs[id]
	if corruptHook != nil {
		corruptHook(src, id, got)
	}
	if err := verifyBlock(got, sv.ref(bd, src, id, sp), alphaFor(iter)); err != nil {
		st.verifyFailures++
		if st.firstFailure == "" {
			st.firstFailure = fmt.Sprintf("rank %d: block %d from rank %d (%dx%d): %v", sv.rank, id, src, sp.m, sp.n, err)
		}
	}
}

// hostView returns a host-accessible copy of buf's bytes [off, off+n): the
// buffer itself when Go can read it, else a pinned copy made on the stream.
// release frees the copy.
func (sv *solver) hostView(buf *devalloc.Buffer, off, n int64) (mem []byte, release func() error, err error) {
	if buf.Location().HostAccessible() {
		h, err := buf.Hold(devalloc.Read)
		if err != nil {
			return nil, nil, err
		}
		if err := h.Wait(); err != nil {
			return nil, nil, errors.Join(err, h.Release())
		}
		all, err := buf.Bytes()
		if err != nil {
			return nil, nil, errors.Join(err, h.Release())
		}
		return all[off : off+n], h.Release, nil
	}
	p, err := sv.a.AllocPinned(n, sv.s)
	if err != nil {
		return nil, nil, err
	}
	if err := sv.s.Copy(p, 0, buf, off, n); err != nil {
		return nil, nil, errors.Join(err, p.Free())
	}
	if err := sv.s.Synchronize(); err != nil {
		return nil, nil, errors.Join(err, p.Free())
	}
	mem, err = p.Bytes()
	if err != nil {
		return nil, nil, errors.Join(err, p.Free())
	}
	return mem, p.Free, nil
}

func float64s(b []byte) []float64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// gemmPlans plans C[g] = alpha*A*B for every destination group of l, on the
// first solve at its bond: the plans depend on the layouts only, and later
// solves run them on their own buffers.
func (sv *solver) gemmPlan(l *layout, A, B, C *packing.Coalesced) error {
	if l.gemmPlan != nil {
		return nil
	}
	// Block i of every operand is the i-th contraction, and the joined C
	// keeps planC's indices whatever the destination.
	// The list is the same for every plan: it is written once, and
	// extended when a plan has more blocks than any before.
	n := C.Len()
	for i := len(sv.triples); i < n; i++ {
		sv.triples = append(sv.triples, gemm.Triple{A: i, B: i, C: i})
	}
	p, err := gemm.NewPlan(gemm.Problem{A: A, B: B, C: C, Alpha: 1, Triples: sv.triples[:n]}, gemm.Options{})
	if err != nil {
		return err
	}
	sv.plansBuilt++
	l.gemmPlan = p
	return nil
}

// multiply runs C = alpha*A*B, every destination's blocks in one plan.
func (sv *solver) multiply(l *layout, A, B, C *packing.Coalesced, alpha float64) (launches int64, err error) {
	if err := sv.eng.RunOn(l.gemmPlan, gemm.Operands{A: A, B: B, C: C, Alpha: complex(alpha, 0)}); err != nil {
		return 0, err
	}
	return int64(l.gemmPlan.Launches()), nil
}

// harness runs f, the harness's own work within a solve (the operands'
// staging, the verification), leaving its runtime calls out of the
// solve's.
func (sv *solver) harness(f func() error) error {
	sv.calls.pause()
	before := cudart.CallsTotal()
	err := f()
	sv.harnessCalls += cudart.CallsTotal() - before
	sv.calls.resume()
	return err
}

// iterate runs solve number iter in the configured mode.
func (sv *solver) iterate(iter int) (iterStats, error) {
	if sv.cfg.workload == "sectors" {
		return sv.solveSectors(iter, sv.cfg.m, sv.bondOf(iter))
	}
	st := iterStats{deviceUS: -1, deviceGemmUS: -1}
	err := sv.frame(&st, func() error {
		if sv.cfg.mode == "perblock" {
			return sv.perBlock(iter, &st)
		}
		return sv.packed(iter, &st)
	})
	return st, err
}

// frame runs one solve's body in the frame every solve shares. The ranks
// start together: the verification of the last solve is the harness's work,
// not the solver's, and its time differs between ranks, so without the
// barrier the earlier rank would wait for the later one in the next
// exchange, and that wait would count as exchange. After the body the phase
// ends, the policy's work (AggressiveFree trims there), timed in the free
// phase; then the solve's counts and total time are taken.
func (sv *solver) frame(st *iterStats, body func() error) error {
	if sv.size > 1 {
		if err := sv.world.BarrierWithin(sv.cfg.timeout); err != nil {
			return err
		}
	}
	before, calls, harness := sv.a.Stats(), cudart.CallsTotal(), sv.harnessCalls
	sv.calls.begin()
	err := body()
	if err == nil {
		t := time.Now()
		err = sv.a.EndPhase()
		st.phase[phFree] += since(t)
	}
	st.allocCalls = sv.a.Stats().AllocCalls - before.AllocCalls
	st.runtimeCalls = int64(cudart.CallsTotal() - calls - (sv.harnessCalls - harness))
	sv.calls.finish()
	for _, v := range st.phase {
		st.solveUS += v
	}
	return err
}

// solveMemory is what one solve allocates, freed once at its end (timed as
// the free phase) or, after a failure, on the way out. With -fresh the
// solve's GEMM plan goes with it (its staged operands are the harness's,
// freed after the solve as they were made before it).
type solveMemory struct {
	coalesced    []*packing.Coalesced
	buffers      []*devalloc.Buffer
	recv         *msg.Received
	layout       *layout       // its GEMM plan closed too, when set
	sectorLayout *sectorLayout // closed too, when set
	freed        bool
	// peakBytes is the solve's working set: the most bytes of its buffers
	// outside pinned memory (device memory, or host-backend memory standing
	// for it) held at once, as observe saw them (free observes too).
	peakBytes int64
}

// observe notes the bytes the solve holds now: call it where they peak,
// before buffers are freed early.
func (m *solveMemory) observe() { m.peakBytes = max(m.peakBytes, m.bytes()) }

// freeNow frees c, one of the solve's buffers, before the solve's end.
func (m *solveMemory) freeNow(c *packing.Coalesced) error {
	i := slices.Index(m.coalesced, c)
	if i < 0 {
		return fmt.Errorf("ranktest: freeing a buffer the solve does not hold")
	}
	m.coalesced = slices.Delete(m.coalesced, i, i+1)
	return c.Free()
}

// bytes sums the sizes of the distinct buffers the solve holds, pinned
// staging left out.
func (m *solveMemory) bytes() int64 {
	seen := map[*devalloc.Buffer]bool{}
	var n int64
	add := func(b *devalloc.Buffer) {
		if b != nil && !seen[b] && b.Location() != devalloc.Pinned {
			seen[b] = true
			n += b.Size()
		}
	}
	for _, c := range m.coalesced {
		add(c.Buffer())
	}
	for _, b := range m.buffers {
		add(b)
	}
	if m.recv != nil {
		for _, src := range m.recv.Sources() {
			add(m.recv.From(src).Buffer())
		}
	}
	return n
}

func (m *solveMemory) free() error {
	if m.freed {
		return nil
	}
	m.freed = true
	m.observe()
	var errs []error
	for _, c := range m.coalesced {
		errs = append(errs, c.Free())
	}
	for _, b := range m.buffers {
		errs = append(errs, b.Free())
	}
	if m.recv != nil {
		errs = append(errs, m.recv.Free())
	}
	if m.layout != nil {
		errs = append(errs, m.layout.closePlan())
	}
	if m.sectorLayout != nil {
		errs = append(errs, m.sectorLayout.close())
	}
	return errors.Join(errs...)
}

// corruptHook lets tests damage a received block just before it is checked.
var corruptHook func(src int, id uint64, vals []float64)

func since(t time.Time) float64 { return float64(time.Since(t).Nanoseconds()) / 1e3 }

// lap returns the microseconds since *t and restarts it.
func lap(t *time.Time) float64 {
	now := time.Now()
	us := float64(now.Sub(*t).Nanoseconds()) / 1e3
	*t = now
	return us
}
