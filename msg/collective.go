package msg

import (
	"errors"
	"fmt"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/internal/wire"
)

// The collective steps of an exchange (docs/WIRE.md, "Exchange protocol"):
// the count exchange before the data phase and the agreement after it.
// They are the only calls of an exchange that wait for every rank; all of
// them go through collectives.

// collectives are the exchange's collective calls on the exchanger's
// communicator: one Alltoall of an int64 per rank each.
type collectives interface {
	// counts is the count exchange: send[d] is what this rank announces
	// to rank d, recv[s] what rank s announces to it.
	counts(send, recv []int64) error
	// agree is the agreement: out[d] is what this rank tells rank d.
	agree(out, in []int64) error
}

// mpiCollectives makes them blocking MPI collectives.
type mpiCollectives struct{ comm *cluster.Comm }

func (c mpiCollectives) counts(send, recv []int64) error { return cluster.Alltoall(c.comm, send, recv) }
func (c mpiCollectives) agree(out, in []int64) error     { return cluster.Alltoall(c.comm, out, in) }

// countExchange learns what every rank sends this one: from the count
// exchange, or from a learned pattern, which skips it. localErr is this
// rank's failure so far: the rank then announces -1 and sends nothing (a
// pattern's destinations get abort notices). It returns an error only when
// the collective itself failed: nothing can be posted then.
func (e *exchange) countExchange(localErr error) error {
	x, pat := e.x, e.pat
	if pat != nil && pat.learned {
		copy(e.recvSize, pat.recvSize)
		pat.check(e, localErr != nil)
		e.fail(localErr)
		return nil
	}
	e.announce(localErr != nil)
	if err := x.coll.counts(e.sendSize, e.recvSize); err != nil {
		return errors.Join(localErr, fmt.Errorf("msg: count exchange: %w", err))
	}
	x.stats.CountExchanges++
	if localErr != nil {
		// Every rank saw -1 from this one: nobody sends here or expects
		// anything from here. What arrives all the same is a stray.
		clear(e.recvSize)
		clear(e.byDest)
	}
	e.checkCounts()
	e.fail(localErr)
	return nil
}

// announce sets the lengths this rank announces in the count exchange (see
// docs/WIRE.md): each message's, 0 where there is none, or -1 to every rank
// when it failed before the exchange.
func (e *exchange) announce(failed bool) {
	for d, m := range e.byDest {
		switch {
		case failed:
			e.sendSize[d] = -1
		case m != nil:
			e.sendSize[d] = m.size
		default:
			e.sendSize[d] = 0
		}
	}
}

// checkCounts validates what every rank announced for this one, before
// anything is sized from it (docs/WIRE.md, "Exchange protocol"). A rank
// that failed (-1) is neither sent to nor expected; one that announced
// another negative length is not expected. A length this rank refuses
// (shorter than any message, or more than it can take) is expected all the
// same, as pieces that are drained as they come, so that the sender
// completes: nothing is allocated for it. A length beyond the protocol's
// limit cannot come from a sender that has the message, so nothing is
// expected from that sender; whatever it sends is drained once the
// agreement says how much it was.
func (e *exchange) checkCounts() {
	x, tag := e.x, e.x.o.Tag
	for s, v := range e.recvSize {
		var w *WireError
		switch {
		case v == 0:
			continue
		case v == -1:
			w = wireErr(ErrPeerAborted, s, tag, "count", "rank %d failed before the exchange and sends nothing (its own error says why)", s)
			e.byDest[s] = nil // it expects nothing either
		case v < 0:
			// Not the -1 of a rank that failed: it may well expect this
			// rank's message, which is sent.
			w = wireErr(ErrMalformed, s, tag, "count", "rank %d announced %d bytes: a length is -1, 0 or at least %d", s, v, wire.AbortSize)
		case v > maxMessageBytes:
			w = wireErr(ErrTooLarge, s, tag, "count", "rank %d announced %d bytes, beyond the protocol's limit of %d; nothing was allocated", s, v, int64(maxMessageBytes))
		case v < wire.AbortSize:
			w = wireErr(ErrMalformed, s, tag, "count", "rank %d announced %d bytes: a message has at least %d; it is drained", s, v, wire.AbortSize)
			e.refuse[s] = true
		case v > x.lim.maxIn:
			w = wireErr(ErrTooLarge, s, tag, "count", "rank %d announced %d bytes, more than this rank takes in one message (%d: %s); nothing was allocated, it is drained",
				s, v, x.lim.maxIn, x.maxInWhy())
			e.refuse[s] = true
		default:
			continue
		}
		e.fail(w)
		e.silent[s] = true
		if !e.refuse[s] {
			e.recvSize[s] = 0
		}
	}
}

// maxInWhy says what bounds the announced lengths this rank accepts.
func (x *Exchanger) maxInWhy() string {
	switch l := x.a.Info().Limit; {
	case l > 0 && l == x.lim.maxIn:
		return "its allocator's budget"
	case x.lim.maxIn == maxMessageBytes:
		return "the protocol's limit"
	}
	return "its memory"
}

// agree ends the data phase with the agreement (docs/WIRE.md, rule 5):
// one Alltoall in which every rank tells every other how many MPI messages
// it posted to it in this exchange and whether its part failed, on its own
// or only because others' did. Then each rank drains what its peers sent
// that it did not match, and waits for its own requests: every rank
// returns an error if any rank's part failed, and no message of this
// exchange is left for the next.
func (e *exchange) agree() {
	x, tag := e.x, e.x.o.Tag
	e.agreeing = true
	own, failed := e.errs.own(), len(e.errs) > 0
	for d, c := range e.sentTo {
		switch {
		case own:
			e.agreeOut[d] = -1 - c
		case failed:
			e.agreeOut[d] = -bystanderBias - 1 - c
		default:
			e.agreeOut[d] = c
		}
	}
	if err := x.coll.agree(e.agreeOut, e.agreeIn); err != nil {
		e.fail(fmt.Errorf("msg: agreement: %w", err))
		e.settle()
		return
	}
	x.stats.Agreements++
	var culprits, bystanders []int
	for s, v := range e.agreeIn {
		switch {
		case v < -bystanderBias:
			v = -bystanderBias - 1 - v
			bystanders = append(bystanders, s)
		case v < 0:
			v = -1 - v
			culprits = append(culprits, s)
		}
		e.agreeIn[s] = v // what s sent here
		if v < e.matchedFrom[s] {
			e.fail(wireErr(ErrUnexpectedPeer, s, tag, "agreement", "rank %d says it sent %d MPI messages to this rank in this exchange, %d arrived", s, v, e.matchedFrom[s]))
		}
	}
	if !own {
		// A rank whose own part failed needs no other's named: its own
		// errors say why it failed.
		if len(culprits) == 0 && !e.errs.namesAny() {
			// Failures with no cause anywhere: a peer sent an abort
			// notice or a -1 without a failure of its own. Name whoever
			// failed.
			culprits = bystanders
		}
		e.reportAborted(culprits)
	}
	e.settle()
}

// bystanderBias marks, in the agreement, a rank whose part of the exchange
// failed only because other ranks' parts did: it says -bystanderBias-1-k
// where a rank that failed on its own says -1-k (docs/WIRE.md, rule 5).
const bystanderBias = 1 << 62

// failures are an exchange's errors, in the order they came.
type failures []error

// own reports whether some error is this rank's own, not a peer's failure
// it heard of (ErrPeerAborted).
func (f failures) own() bool {
	for _, err := range f {
		if !errors.Is(err, ErrPeerAborted) {
			return true
		}
	}
	return false
}

// reportAborted names the ranks whose part of the exchange failed, unless
// an error already does (their abort notice, their -1): a few in full,
// then how many more. The rank itself is named by no error.
func (e *exchange) reportAborted(ranks []int) {
	const shown = 4
	named := 0
	for _, s := range ranks {
		if s == e.x.rank || e.errs.names(s) {
			continue
		}
		if named++; named > shown {
			continue
		}
		e.fail(wireErr(ErrPeerAborted, s, e.x.o.Tag, "agreement", "rank %d failed its part of this exchange (its own error says why)", s))
	}
	if named > shown {
		e.fail(fmt.Errorf("msg: and %d more ranks failed their part of this exchange: %w", named-shown, ErrPeerAborted))
	}
}

// names reports whether an error names rank s as failed.
func (f failures) names(s int) bool {
	for _, err := range f {
		var w *WireError
		if errors.As(err, &w) && w.Peer == s && errors.Is(w, ErrPeerAborted) {
			return true
		}
	}
	return false
}

// namesAny reports whether an error names a rank that failed.
func (f failures) namesAny() bool {
	for _, err := range f {
		if errors.Is(err, ErrPeerAborted) {
			return true
		}
	}
	return false
}

// result is the exchange's error: nil, this rank's own errors when its
// part failed on its own (none of them matches ErrPeerAborted, whatever
// else failed), else those that name the ranks whose failure failed it.
func (f failures) result() error {
	if !f.own() {
		return errors.Join(f...)
	}
	var own []error
	for _, err := range f {
		if !errors.Is(err, ErrPeerAborted) {
			own = append(own, err)
		}
	}
	return errors.Join(own...)
}

// settle drains, source by source, the MPI messages the agreement says
// were sent here and not yet matched (strays, or pieces of a message given
// up), then completes every request still active; each wait is bounded by
// the timeout. Messages from other sources are not touched: they may
// already belong to the next exchange.
func (e *exchange) settle() {
	x := e.x
	last := time.Now()
	expired := func() bool { return x.lim.timeout > 0 && time.Since(last) >= x.lim.timeout }
	wait := func() time.Duration {
		if x.lim.timeout <= 0 {
			return -1
		}
		return max(x.lim.timeout-time.Since(last), 0)
	}
	for s, sent := range e.agreeIn {
		probe := cluster.Probe{Comm: x.comm, Source: s, Tag: cluster.AnyTag}
		for e.matchedFrom[s] < sent {
			if expired() {
				e.fail(wireErr(ErrTimeout, s, x.o.Tag, "agreement", "rank %d says it sent %d MPI messages to this rank in this exchange, %d arrived within %v",
					s, sent, e.matchedFrom[s], x.lim.timeout))
				break
			}
			moved, ok := e.await(&probe, wait())
			if !ok {
				return
			}
			if moved {
				last = time.Now()
			}
		}
	}
	for len(e.q.active) > 0 {
		if expired() {
			e.fail(fmt.Errorf("msg: exchange with tag %d: %d MPI requests did not complete within %v of the agreement (their memory stays held): %w",
				x.o.Tag, len(e.q.active), x.lim.timeout, ErrTimeout))
			break
		}
		moved, ok := e.await(nil, wait())
		if !ok {
			break
		}
		if moved {
			last = time.Now()
		}
	}
	// Messages the exchange stopped waiting for give back what they hold.
	for _, in := range e.ins {
		if !in.ended {
			if in.failed == nil {
				in.failed = e.x.inErr(in, "receive", fmt.Errorf("%d of %d MPI messages arrived: %w", in.matched, in.pieces, ErrTimeout))
			}
			e.endIn(in)
		}
	}
}
