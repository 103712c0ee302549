package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// packed is the solve distbuf is for: one allocation for the operands (A
// and B, the parts of one joined layout) and one for every destination's C
// (the joined send layout, whose parts are the messages), one
// host-to-device copy of both operands, the bond's GEMM plan
// run on this solve's buffers, and one message per peer whose received
// buffer is the blocks.
//
// Its phases, each timed on the host: alloc (on a fresh layout, laying the
// blocks out; then the send buffers), upload (the operands' allocation and
// its copy from pinned memory), gemm_plan (zero once the bond is
// planned), gemm (enqueueing the products), exchange (until every
// received block is complete where it lives, so it also waits for the
// device work before it) and free. Verification comes between exchange and
// free and is not part of the solve.
func (sv *solver) packed(iter int, st *iterStats) (err error) {
	l, fresh, planUS, err := sv.layoutFor(iter)
	if err != nil {
		return err
	}
	st.fresh = fresh
	st.phase[phAlloc] = planUS
	var mem solveMemory
	if sv.cfg.fresh {
		mem.layout = l
		defer func() { err = errors.Join(err, sv.harness(l.freeStaging)) }()
	}
	defer func() {
		if !mem.freed {
			err = errors.Join(err, mem.free())
		}
	}()
	alpha := alphaFor(iter)

	t := time.Now()
	C, err := packing.Alloc(sv.a, l.joinC, sv.s)
	if err != nil {
		return err
	}
	mem.coalesced = append(mem.coalesced, C)
	sends, err := C.Parts()
	if err != nil {
		return err
	}
	st.phase[phAlloc] += lap(&t)

	// The operands come with their upload: one allocator call and one copy
	// for both, the copy covering the padding.
	if err := sv.timer.mark(0); err != nil {
		return err
	}
	t = time.Now()
	AB, err := packing.Alloc(sv.a, l.stageAB.Plan(), sv.s, packing.AllocOptions{CopyOf: l.stageAB})
	if err != nil {
		return err
	}
	mem.coalesced = append(mem.coalesced, AB)
	operands, err := AB.Parts()
	if err != nil {
		return err
	}
	A, B := operands[0], operands[1]
	st.phase[phUpload] = lap(&t)
	if err := sv.timer.mark(1); err != nil {
		return err
	}

	t = time.Now()
	if err := sv.gemmPlan(l, A, B, C); err != nil {
		return err
	}
	st.phase[phPlan] = lap(&t)
	if st.gemmLaunches, err = sv.multiply(l, A, B, C, alpha); err != nil {
		return err
	}
	st.phase[phGemm] = lap(&t)
	if err := sv.timer.mark(2); err != nil {
		return err
	}

	t = time.Now()
	before := sv.ex.Stats()
	recv, err := l.pattern.Exchange(sends)
	mem.recv = recv
	if err != nil {
		return err
	}
	if err := waitReceived(recv); err != nil {
		return err
	}
	st.phase[phExchange] = lap(&t)
	after := sv.ex.Stats()
	st.messages = after.Messages - before.Messages
	// What this rank delivered to its peers, on every route: summed over
	// ranks, every byte that moved between them once.
	st.bytesMoved = after.Bytes - before.Bytes
	if st.deviceUS, st.deviceGemmUS, err = sv.timer.read(); err != nil {
		return err
	}

	vstart := time.Now()
	if err := sv.harness(func() error { return sv.verifyAll(st, l.bond, recv, iter) }); err != nil {
		return err
	}
	st.verifyUS = since(vstart)

	t = time.Now()
	err = mem.free()
	st.phase[phFree] = lap(&t)
	st.workingSet = mem.peakBytes
	return err
}

// waitReceived returns once every received block is complete where it
// lives: what a caller must wait for before reading them.
func waitReceived(recv *msg.Received) error {
	for _, src := range recv.Sources() {
		h, err := recv.From(src).Buffer().Hold(devalloc.Read)
		if err != nil {
			return err
		}
		if err := errors.Join(h.Wait(), h.Release()); err != nil {
			return err
		}
	}
	return nil
}

// verifyAll checks that every block this rank should receive at bond bd
// arrived, once, with the right values.
func (sv *solver) verifyAll(st *iterStats, bd *bondData, recv *msg.Received, iter int) error {
	want := map[int]int{}
	for _, in := range bd.incoming {
		want[in.src]++
	}
	for _, src := range recv.Sources() {
		c := recv.From(src)
		if err := sv.verifyReceived(st, bd, src, c, iter); err != nil {
			return err
		}
		if c.Len() != want[src] {
			st.verifyFailures++
			if st.firstFailure == "" {
				st.firstFailure = fmt.Sprintf("rank %d: %d block(s) from rank %d, want %d", sv.rank, c.Len(), src, want[src])
			}
		}
		delete(want, src)
	}
	for src, n := range want {
		st.verifyFailures += int64(n)
		if st.firstFailure == "" {
			st.firstFailure = fmt.Sprintf("rank %d: nothing from rank %d, want %d block(s)", sv.rank, src, n)
		}
	}
	return nil
}

// verifyReceived checks every block of a received buffer, reading device
// memory through one copy to pinned memory.
func (sv *solver) verifyReceived(st *iterStats, bd *bondData, src int, c *packing.Coalesced, iter int) error {
	buf := c.Buffer()
	mem, release, err := sv.hostView(buf, 0, buf.Size())
	if err != nil {
		return err
	}
	for _, v := range c.All() {
		off := c.Start() + v.Offset()
		sv.check(st, bd, src, v.Desc().ID, float64s(mem[off:off+v.Desc().Bytes()]), iter)
	}
	return release()
}
