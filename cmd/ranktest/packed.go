package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// packed is the solve distbuf is for: one allocation per operand (A, B) and
// per destination (C), one host-to-device copy per operand, the fewest GEMM
// launches, and one message per peer whose received buffer is the blocks.
func (sv *solver) packed(iter int, st *iterStats) (err error) {
	if sv.ex == nil {
		if sv.ex, err = msg.New(msg.Options{Comm: sv.world, Alloc: sv.a}); err != nil {
			return err
		}
		// The sparsity repeats from solve to solve: after the first exchange
		// the pattern skips the count exchange.
		sv.pattern = sv.ex.NewPattern()
	}
	var owned []*packing.Coalesced
	defer func() {
		for _, c := range owned {
			err = errors.Join(err, c.Free())
		}
	}()
	start := time.Now()
	alpha := alphaFor(iter)
	A, err := packing.Alloc(sv.a, sv.planA, sv.s)
	if err != nil {
		return err
	}
	owned = append(owned, A)
	B, err := packing.Alloc(sv.a, sv.planB, sv.s)
	if err != nil {
		return err
	}
	owned = append(owned, B)
	Cs, err := msg.AllocSend(sv.a, sv.planC, sv.s)
	if err != nil {
		return err
	}
	owned = append(owned, Cs...)
	if err := packing.Transfer(sv.s, A, sv.stageA); err != nil {
		return err
	}
	if err := packing.Transfer(sv.s, B, sv.stageB); err != nil {
		return err
	}
	if st.gemmLaunches, err = sv.multiply(A, B, Cs, alpha, gemm.Auto); err != nil {
		return err
	}
	before := sv.ex.Stats()
	recv, err := sv.pattern.Exchange(Cs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, recv.Free()) }()
	st.solveUS = since(start)
	after := sv.ex.Stats()
	st.messages = after.Messages - before.Messages
	st.bytesMoved = after.BytesSent - before.BytesSent

	vstart := time.Now()
	want := map[int]int{}
	for _, in := range sv.incoming {
		want[in.src]++
	}
	for _, src := range recv.Sources() {
		c := recv.From(src)
		if err := sv.verifyReceived(st, src, c, iter); err != nil {
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
	st.verifyUS = since(vstart)
	return nil
}

// verifyReceived checks every block of a received buffer, reading device
// memory through one copy to pinned memory.
func (sv *solver) verifyReceived(st *iterStats, src int, c *packing.Coalesced, iter int) error {
	buf := c.Buffer()
	base, err := buf.Addr()
	if err != nil {
		return err
	}
	mem, release, err := sv.hostView(buf, 0, buf.Size())
	if err != nil {
		return err
	}
	for _, v := range c.All() {
		off := int64(v.Addr() - base)
		sv.check(st, src, v.ID(), float64s(mem[off:off+v.Bytes()]), iter)
	}
	return release()
}
