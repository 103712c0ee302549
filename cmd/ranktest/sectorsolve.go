package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// Outcomes of a rank's part of a solve, as the ranks agree on them.
const (
	solveOK = iota
	solveOutOfMemory
	solveFailed
	solveEcho // failed because another rank did (an aborted exchange)
)

// errPeerFailed is what a rank returns from a solve that ended before the
// exchange because another rank failed there; agree then names that rank.
var errPeerFailed = errors.New("sectors: another rank failed before the exchange")

// peerOutOfMemory is what a rank returns when another rank ran out of
// memory in the same solve: the solve, and a run growing m, ends there on
// every rank. It matches distbuf.ErrOutOfMemory.
type peerOutOfMemory struct {
	rank int
	own  error // this rank's echo of it (an aborted exchange), or nil
}

func (e *peerOutOfMemory) Error() string {
	s := fmt.Sprintf("rank %d ran out of memory in this solve", e.rank)
	if e.own != nil && !errors.Is(e.own, errPeerFailed) {
		s += " (here: " + e.own.Error() + ")"
	}
	return s
}

func (e *peerOutOfMemory) Unwrap() []error {
	if e.own != nil {
		return []error{distbuf.ErrOutOfMemory, e.own}
	}
	return []error{distbuf.ErrOutOfMemory}
}

func outcomeOf(err error) int64 {
	switch {
	case err == nil:
		return solveOK
	case errors.Is(err, distbuf.ErrOutOfMemory):
		return solveOutOfMemory
	case errors.Is(err, errPeerFailed) || errors.Is(err, msg.ErrPeerAborted):
		return solveEcho
	}
	return solveFailed
}

// agree gathers every rank's outcome of a solve (one Allgather) and
// returns the error this rank reports: its own; or, when it has none or
// only the echo of another's failure, an error naming the rank that
// failed, matching distbuf.ErrOutOfMemory when that rank ran out of
// memory. So every rank of a solve that ran out of memory says so.
func (sv *solver) agree(own error) error {
	all := make([]int64, sv.size)
	if err := cluster.AllgatherWithin(sv.world, []int64{outcomeOf(own)}, all, sv.cfg.timeout); err != nil {
		return errors.Join(own, err)
	}
	if o := outcomeOf(own); o == solveOutOfMemory || o == solveFailed {
		return own
	}
	oom, failed := -1, -1
	for r, o := range all {
		switch {
		case o == solveOutOfMemory && oom < 0:
			oom = r
		case o == solveFailed && failed < 0:
			failed = r
		}
	}
	switch {
	case oom >= 0:
		return &peerOutOfMemory{rank: oom, own: own}
	case failed >= 0 && own != nil:
		return fmt.Errorf("rank %d failed in this solve (its own message names the cause): %w", failed, own)
	case failed >= 0:
		return fmt.Errorf("rank %d failed in this solve (its own message names the cause)", failed)
	}
	return own
}

// solveSectors runs one solve of the sectors workload at bond dimension m
// on the structure of bond (a growing run's step): collective, every rank
// calls it with the same arguments. The structure's layouts, plans and
// staged operands are made when (m, bond) is new to the solver (the solve
// is then fresh) and reused otherwise; dropSectors lets them go. The
// result carries the solve's phases and counts as iterate's does, and
// workingSet, the most bytes of buffers the solve held at once. A failure on any rank ends the solve on
// every rank with an error; an allocation that fails (or a peer's) is an
// error matching distbuf.ErrOutOfMemory, and the solve has freed what it
// allocated and dropped the structure's layout.
func (sv *solver) solveSectors(iter, m, bond int) (iterStats, error) {
	st := iterStats{deviceUS: -1, deviceGemmUS: -1}
	err := sv.frame(&st, func() error { return sv.sectors(iter, m, bond, &st) })
	// The ranks leave the solve together, each knowing how every other's
	// ended. A failed solve takes its structure's layout with it (its
	// plans' and staged operands' memory): the run is ending, or will
	// plan the structure afresh.
	if err = sv.agree(err); err != nil {
		err = errors.Join(err, sv.dropSectors(m, bond))
	}
	return st, err
}

// dropSectors lets the layout of structure (m, bond) go, if the solver
// holds it: a growing run moves on to the next m.
func (sv *solver) dropSectors(m, bond int) error {
	k := sectorKey{m, bond}
	l, ok := sv.sectorLayouts[k]
	if !ok {
		return nil
	}
	delete(sv.sectorLayouts, k)
	return l.close()
}

// sectorLayoutFor returns the layout of (m, bond), cached or made anew
// (fresh). planUS is the time spent on the structure, its layouts and
// views; staging the operands and computing the references are the
// harness's work, untimed.
func (sv *solver) sectorLayoutFor(m, bond int) (l *sectorLayout, fresh bool, planUS float64, err error) {
	sv.solves++
	k := sectorKey{m, bond}
	if l, ok := sv.sectorLayouts[k]; ok && !sv.cfg.fresh {
		l.lastUse = sv.solves
		return l, false, 0, nil
	}
	if err := sv.dropSectors(m, bond); err != nil {
		return nil, true, 0, err
	}
	if err := sv.evictSectorLayouts(); err != nil {
		return nil, true, 0, err
	}
	start := time.Now()
	st, err := newSectorStructure(sv.cfg.seed, bond, m, sv.size, sv.cfg.bigBlock)
	if err != nil {
		return nil, true, 0, err
	}
	if l, err = newSectorLayout(st, sv.rank); err != nil {
		return nil, true, 0, err
	}
	l.lastUse = sv.solves
	if sv.ex != nil {
		l.pattern = sv.ex.NewPattern()
	}
	planUS = since(start)
	if err := sv.harness(func() error { return l.stage(sv) }); err != nil {
		return nil, true, 0, errors.Join(err, l.close())
	}
	sv.lastStructure = st
	if !sv.cfg.fresh {
		sv.sectorLayouts[k] = l
	}
	return l, true, planUS, nil
}

// evictSectorLayouts makes room for one more layout, dropping the least
// recently used.
func (sv *solver) evictSectorLayouts() error {
	for len(sv.sectorLayouts) >= maxCachedLayouts {
		var oldest sectorKey
		first := true
		for k, l := range sv.sectorLayouts {
			if first || l.lastUse < sv.sectorLayouts[oldest].lastUse {
				oldest, first = k, false
			}
		}
		if err := sv.dropSectors(oldest.m, oldest.bond); err != nil {
			return err
		}
	}
	return nil
}

// sectors is one solve. Its buffers live as long as a solver's would:
// T1 and T2 are allocated, the inputs uploaded, steps 1 and 2 run and T1
// freed (in stream order, after step 2 has read it); after the exchange
// the sent T2 is freed and H·psi allocated and cleared; step 3 runs on the
// received buffers, and the rest goes after the check. The phases are
// packed's: alloc (a fresh structure's planning, then T1 and T2, then
// H·psi), upload, gemm_plan, gemm (steps 1 and 2, then step 3 until H·psi
// is complete), exchange and free (T1, the sent T2, then the rest). The
// ranks agree before the exchange on whether every one has its buffers,
// so that a rank out of memory does not leave the others waiting for its
// messages.
func (sv *solver) sectors(iter, m, bond int, st *iterStats) (err error) {
	l, fresh, planUS, err := sv.sectorLayoutFor(m, bond)
	if err != nil {
		// Nothing collective happened yet: tell the others before they
		// wait in the exchange.
		return sv.agreeBeforeExchange(err)
	}
	st.fresh = fresh
	st.phase[phAlloc] = planUS
	var mem solveMemory
	if sv.cfg.fresh {
		mem.sectorLayout = l
	}
	defer func() {
		if !mem.freed {
			err = errors.Join(err, mem.free())
		}
		st.workingSet = mem.peakBytes
	}()
	bufs := make([]*packing.Coalesced, l.nSlots)
	sends, t2, err := sv.sectorsLocal(iter, l, bufs, &mem, st)
	if err := sv.agreeBeforeExchange(err); err != nil {
		return err
	}

	t := time.Now()
	before := sv.ex.Stats()
	recv, err := l.pattern.Exchange(sends)
	mem.recv = recv
	if errors.Is(err, msg.ErrTooLarge) && !errors.Is(err, distbuf.ErrOutOfMemory) {
		// A message larger than this rank's budget or memory can take:
		// out of memory as much as a failed allocation is.
		err = fmt.Errorf("%w: %w", distbuf.ErrOutOfMemory, err)
	}
	if err != nil {
		return err
	}
	st.phase[phExchange] = lap(&t)
	after := sv.ex.Stats()
	st.messages = after.Messages - before.Messages
	st.bytesMoved = after.Bytes - before.Bytes
	// The sent T2 goes once sent (its free waits, in stream order, for
	// the copy of this rank's own part); H·psi comes now.
	mem.observe()
	if t2 != nil {
		if err := mem.freeNow(t2); err != nil {
			return err
		}
		bufs[l.t2ViewSlot] = nil
	}
	st.phase[phFree] += lap(&t)
	for _, spec := range l.hpsi {
		if err := sv.allocSpec(spec, bufs, &mem); err != nil {
			return err
		}
	}
	st.phase[phAlloc] += lap(&t)

	// Step 3 on the received buffers as they are.
	for _, src := range recv.Sources() {
		slot, ok := l.recvSlot[src]
		if !ok {
			return fmt.Errorf("sectors: rank %d sent %d block(s), none expected", src, recv.From(src).Len())
		}
		if got := recv.From(src).Len(); got != l.expect[src] {
			return fmt.Errorf("sectors: %d block(s) from rank %d, want %d", got, src, l.expect[src])
		}
		bufs[slot] = recv.From(src)
	}
	for src, n := range l.expect {
		if bufs[l.recvSlot[src]] == nil {
			return fmt.Errorf("sectors: nothing from rank %d, want %d block(s)", src, n)
		}
	}
	for _, g := range l.step3 {
		A, B, C := bufs[l.recvSlot[g.src]], bufs[g.b], bufs[g.c]
		if g.plan == nil || !g.plan.Matches(A, B, C) {
			if err := sv.planStep3(g, A, B, C); err != nil {
				return err
			}
		}
	}
	st.phase[phPlan] += lap(&t)
	for _, g := range l.step3 {
		n, err := sv.runGroup(g.plan, bufs[l.recvSlot[g.src]], bufs[g.b], bufs[g.c], 1, 1)
		if err != nil {
			return err
		}
		st.gemmLaunches += n
	}
	if err := sv.timer.mark(2); err != nil {
		return err
	}
	// The solve ends when H·psi is complete.
	if err := sv.s.Synchronize(); err != nil {
		return err
	}
	st.phase[phGemm] += lap(&t)
	if st.deviceUS, st.deviceGemmUS, err = sv.timer.read(); err != nil {
		return err
	}

	vstart := time.Now()
	if err := sv.harness(func() error { return sv.checkSectors(st, l, bufs, iter) }); err != nil {
		return err
	}
	st.verifyUS = since(vstart)

	t = time.Now()
	err = mem.free()
	st.phase[phFree] += lap(&t)
	return err
}

// agreeBeforeExchange tells every rank whether each has its buffers and
// its first two steps enqueued (one Allreduce): a rank that failed returns
// its error, the others an error naming it, and none waits in an exchange
// for a rank that will not come.
func (sv *solver) agreeBeforeExchange(own error) error {
	if sv.size == 1 {
		return own
	}
	worst := []int64{outcomeOf(own)}
	if err := cluster.AllreduceWithin(sv.world, worst, worst, cluster.Max, sv.cfg.timeout); err != nil {
		return errors.Join(own, err)
	}
	if own == nil && worst[0] != solveOK {
		return errPeerFailed
	}
	return own
}

// allocSpec makes one allocation of a solve, with its view, cleared when
// the spec says so.
func (sv *solver) allocSpec(spec allocSpec, bufs []*packing.Coalesced, mem *solveMemory, opts ...packing.AllocOptions) error {
	c, err := packing.Alloc(sv.a, spec.plan, sv.s, opts...)
	if err != nil {
		return err
	}
	mem.coalesced = append(mem.coalesced, c)
	bufs[spec.slot] = c
	if spec.view != nil {
		if bufs[spec.viewSlot], err = packing.Wrap(c.Buffer(), c.Start(), spec.view, 0, noRelease); err != nil {
			return err
		}
	}
	if spec.zero {
		return sv.s.Memset(c.Buffer(), 0, c.Buffer().Size(), 0)
	}
	return nil
}

// sectorsLocal is the solve up to the exchange, on this rank alone: it
// allocates T1 and T2, uploads the inputs, runs steps 1 and 2, frees T1
// (in stream order, after step 2) and returns the send buffers and the
// joined buffer they are parts of.
func (sv *solver) sectorsLocal(iter int, l *sectorLayout, bufs []*packing.Coalesced, mem *solveMemory, st *iterStats) (sends []*packing.Coalesced, t2 *packing.Coalesced, err error) {
	t := time.Now()
	for _, spec := range l.t1 {
		if err := sv.allocSpec(spec, bufs, mem); err != nil {
			return nil, nil, err
		}
	}
	if l.t2Joined != nil {
		c, err := packing.Alloc(sv.a, l.t2Joined, sv.s)
		if err != nil {
			return nil, nil, err
		}
		mem.coalesced = append(mem.coalesced, c)
		t2 = c
		if sends, err = c.Parts(); err != nil {
			return nil, nil, err
		}
		if bufs[l.t2ViewSlot], err = packing.Wrap(c.Buffer(), c.Start(), l.t2View, 0, noRelease); err != nil {
			return nil, nil, err
		}
	}
	st.phase[phAlloc] += lap(&t)

	// The inputs come with their upload: the tails in one allocation and
	// one copy, each big block in its own.
	if err := sv.timer.mark(0); err != nil {
		return nil, nil, err
	}
	t = time.Now()
	in, err := packing.Alloc(sv.a, l.inTail, sv.s, packing.AllocOptions{CopyOf: l.inTailStage})
	if err != nil {
		return nil, nil, err
	}
	mem.coalesced = append(mem.coalesced, in)
	parts, err := in.Parts()
	if err != nil {
		return nil, nil, err
	}
	if err := l.assignInTail(parts, bufs); err != nil {
		return nil, nil, err
	}
	for _, spec := range l.inputs {
		if err := sv.allocSpec(spec, bufs, mem, packing.AllocOptions{CopyOf: spec.stage}); err != nil {
			return nil, nil, err
		}
	}
	st.phase[phUpload] = lap(&t)
	if err := sv.timer.mark(1); err != nil {
		return nil, nil, err
	}

	t = time.Now()
	for _, gs := range [][]*gemmGroup{l.step1, l.step2} {
		for _, g := range gs {
			if g.plan == nil {
				p, err := gemm.NewPlan(gemm.Problem{A: bufs[g.a], B: bufs[g.b], C: bufs[g.c], Alpha: 1, Triples: g.triples}, gemm.Options{})
				if err != nil {
					return nil, nil, err
				}
				sv.plansBuilt++
				g.plan = p
			}
		}
	}
	st.phase[phPlan] = lap(&t)
	alpha := alphaFor(iter)
	for _, g := range l.step1 {
		n, err := sv.runGroup(g.plan, bufs[g.a], bufs[g.b], bufs[g.c], alpha, 0)
		if err != nil {
			return nil, nil, err
		}
		st.gemmLaunches += n
	}
	for _, g := range l.step2 {
		n, err := sv.runGroup(g.plan, bufs[g.a], bufs[g.b], bufs[g.c], 1, 0)
		if err != nil {
			return nil, nil, err
		}
		st.gemmLaunches += n
	}
	st.phase[phGemm] = lap(&t)
	// T1 is done with once step 2 has read it.
	mem.observe()
	for _, spec := range l.t1 {
		if err := mem.freeNow(bufs[spec.slot]); err != nil {
			return nil, nil, err
		}
		bufs[spec.slot], bufs[spec.viewSlot] = nil, nil
	}
	st.phase[phFree] = lap(&t)
	return sends, t2, nil
}

// assignInTail puts each part of the joined input tail in its slot: the
// parts come in the order of the plan's groups, which exist only for the
// kinds this rank has blocks of.
func (l *sectorLayout) assignInTail(parts []*packing.Coalesced, bufs []*packing.Coalesced) error {
	groups := l.inTailGroups
	if len(parts) != len(groups) {
		return fmt.Errorf("sectors: the input tail has %d parts, want %d", len(parts), len(groups))
	}
	for k, g := range groups {
		if g < 0 || g >= len(l.inTailSlot) || l.inTailSlot[g] < 0 {
			return fmt.Errorf("sectors: the input tail has a part for group %d, which holds no blocks here", g)
		}
		bufs[l.inTailSlot[g]] = parts[k]
	}
	return nil
}

func (sv *solver) runGroup(p *gemm.Plan, A, B, C *packing.Coalesced, alpha, beta float64) (int64, error) {
	if err := sv.eng.RunOn(p, gemm.Operands{A: A, B: B, C: C, Alpha: complex(alpha, 0), Beta: complex(beta, 0)}); err != nil {
		return 0, err
	}
	return int64(p.Launches()), nil
}

// planStep3 plans one group of step 3 on the buffer received from its
// source: the slabs' positions there come from their ids.
func (sv *solver) planStep3(g *step3Group, A, B, C *packing.Coalesced) error {
	if g.plan != nil {
		if err := g.plan.Close(); err != nil {
			return err
		}
		g.plan = nil
	}
	triples := make([]gemm.Triple, len(g.ids))
	for k, id := range g.ids {
		pos, err := A.Position(id)
		if err != nil {
			return fmt.Errorf("sectors: the message from rank %d: %w", g.src, err)
		}
		triples[k] = gemm.Triple{A: pos, B: g.bpos[k], C: g.cpos[k]}
	}
	p, err := gemm.NewPlan(gemm.Problem{A: A, B: B, C: C, TransB: gemm.Trans, Alpha: 1, Beta: 1, Triples: triples}, gemm.Options{})
	if err != nil {
		return err
	}
	sv.plansBuilt++
	g.plan = p
	return nil
}

// checkSectors checks every H·psi block this rank owns, reading each
// buffer through one copy to host memory.
func (sv *solver) checkSectors(st *iterStats, l *sectorLayout, bufs []*packing.Coalesced, iter int) error {
	alpha := alphaFor(iter)
	views := map[int][]byte{}
	var releases []func() error
	defer func() {
		for _, r := range releases {
			_ = r()
		}
	}()
	for _, c := range l.checks {
		buf := bufs[c.loc.slot]
		mem, ok := views[c.loc.slot]
		if !ok {
			b := buf.Buffer()
			var release func() error
			var err error
			if mem, release, err = sv.hostView(b, 0, b.Size()); err != nil {
				return err
			}
			releases = append(releases, release)
			views[c.loc.slot] = mem
		}
		v, err := buf.View(c.loc.pos)
		if err != nil {
			return err
		}
		off := buf.Start() + v.Offset()
		got := float64s(mem[off : off+v.Desc().Bytes()])
		if corruptHook != nil {
			corruptHook(sv.rank, uint64(c.ref.psi), got)
		}
		b := l.st.psi[c.ref.psi]
		if err := l.st.checkBlock(c.ref, got, l.probes[b.ib], alpha); err != nil {
			st.verifyFailures++
			if st.firstFailure == "" {
				st.firstFailure = fmt.Sprintf("rank %d: H·psi block %d %s: %v", sv.rank, c.ref.psi, l.st.describePsi(c.ref.psi), err)
			}
		}
	}
	var errs []error
	for _, r := range releases {
		errs = append(errs, r())
	}
	releases = nil
	return errors.Join(errs...)
}
