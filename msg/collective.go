package msg

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/internal/wire"
)

// The collective steps of an exchange (docs/WIRE.md, "Exchange protocol"):
// the count exchange before the data phase and the agreement after it.
// They are the only calls of an exchange that wait for every rank; all of
// them go through collectives, as cluster's bounded collectives, so that a
// rank that never arrives is named after the timeout instead of holding
// the others for ever.

// collectives are the exchange's collective calls on the exchanger's
// communicator: one AlltoallWithin of an int64 per rank each, which fails
// with a *cluster.TimeoutError naming the ranks not heard from when
// timeout passes first (no limit when it is 0).
type collectives interface {
	// counts is the count exchange: send[d] is what this rank announces
	// to rank d, recv[s] what rank s announces to it.
	counts(send, recv []int64, timeout time.Duration) error
	// agree is the agreement: out[d] is what this rank tells rank d.
	agree(out, in []int64, timeout time.Duration) error
}

// boundedCollectives makes them cluster's bounded collectives.
type boundedCollectives struct{ comm *cluster.Comm }

func (c boundedCollectives) counts(send, recv []int64, timeout time.Duration) error {
	return cluster.AlltoallWithin(c.comm, send, recv, timeout)
}

func (c boundedCollectives) agree(out, in []int64, timeout time.Duration) error {
	return cluster.AlltoallWithin(c.comm, out, in, timeout)
}

// agreeGrace is how much longer than the timeout the agreement waits,
// and how long it waits after this rank's own data phase timed out. A
// rank whose data phase runs until the timeout (it waits for a peer that
// sends fewer pieces than it announced) reaches the agreement up to a
// timeout after a rank that had nothing to wait for; the grace lets the
// latter hear from it. After a data phase that timed out, the other live
// ranks are either in the agreement already or time out about as late,
// so the grace is all the agreement needs: a rank that stopped for good
// is then named a grace after the timeout, not two timeouts after.
const agreeGrace = time.Second

// agreeTimeout is the agreement's bound: the timeout and a grace, or the
// grace alone once the data phase timed out (stalled); 0 for no limit.
func (x *Exchanger) agreeTimeout(stalled bool) time.Duration {
	t := x.lim.timeout
	if t <= 0 {
		return 0
	}
	grace := min(t, agreeGrace)
	if stalled {
		return grace
	}
	return t + grace
}

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
	if err := x.coll.counts(e.sendSize, e.recvSize, x.lim.timeout); err != nil {
		return errors.Join(localErr, stepError("count exchange", err))
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
	e.drainSuspects()
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
	if err := x.coll.agree(e.agreeOut, e.agreeIn, x.agreeTimeout(e.stalled)); err != nil {
		// Nothing is known of what the others sent or whether they
		// failed: what has arrived is drained, nothing more is waited
		// for, and the error (a rank not heard from) ends the job.
		e.fail(stepError("agreement", err))
		copy(e.agreeIn, e.matchedFrom)
		e.settleNow()
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

// drainSuspects drains whatever has arrived from a source whose messages
// were wrong in this exchange (a stray, or a message rejected for its
// length, tag, header or manifest). Such a source may have sent this rank
// messages that no agreement counts (a stray between two exchanges, a
// message left by a failed exchange): MPI delivered them before the
// source's messages of this exchange, which they displaced, so that some
// of those are still to be matched. It runs before the agreement, when
// nothing of the next exchange can have come yet (no rank ends this
// agreement without this rank's part), and, unless a learned pattern
// skips the next count exchange, once more after it (settle), when every
// rank has posted all its messages of this exchange: so no displaced
// message is left for the next exchange (docs/WIRE.md, rule 5). Each is
// reported as a stray; the agreement then says the source sent fewer than
// arrived.
func (e *exchange) drainSuspects() {
	for s := range e.matchedFrom {
		if !e.suspect(s) {
			continue
		}
		probe := cluster.Probe{Comm: e.x.comm, Source: s, Tag: cluster.AnyTag}
		for {
			moved, ok := e.await(&probe, 0)
			if !ok || !moved {
				break
			}
		}
	}
}

// suspect reports whether a message from s in this exchange was a stray
// or was rejected as one that breaks the protocol (not an abort notice, a
// refused length or a timeout, which say nothing of what else s sent).
func (e *exchange) suspect(s int) bool {
	if s == e.x.rank && !e.x.o.SelfViaMPI {
		return false
	}
	if e.strayed[s] {
		return true
	}
	in := e.bySrc[s]
	return in != nil && in.failed != nil && errors.Is(in.failed, ErrMalformed) && !errors.Is(in.failed, ErrPeerAborted)
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
func (e *exchange) settle() { e.settleWithin(e.x.lim.timeout) }

// settleNow is settle without waiting: after an agreement that failed, a
// rank it did not hear from may never take this rank's messages or send
// the rest of its own, so what has not completed at once is left to MPI
// (its memory stays held) and reported.
func (e *exchange) settleNow() { e.settleWithin(-1) }

// settleWithin is settle with waits bounded by limit since the last
// progress (0: no limit; negative: no wait at all).
func (e *exchange) settleWithin(limit time.Duration) {
	x := e.x
	last := time.Now()
	expired := func() bool { return limit < 0 || limit > 0 && time.Since(last) >= limit }
	wait := func() time.Duration {
		switch {
		case limit < 0:
			return 0
		case limit == 0:
			return -1
		}
		return max(limit-time.Since(last), 0)
	}
	for s, sent := range e.agreeIn {
		probe := cluster.Probe{Comm: x.comm, Source: s, Tag: cluster.AnyTag}
		for e.matchedFrom[s] < sent {
			if expired() {
				e.fail(wireErr(ErrTimeout, s, x.o.Tag, "agreement", "rank %d says it sent %d MPI messages to this rank in this exchange, %d arrived within %v",
					s, sent, e.matchedFrom[s], limit))
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
	if e.pat == nil || !e.pat.learned {
		// The count exchange of the next exchange needs this rank's part:
		// no rank sends anything of the next exchange before this rank
		// has begun it, and every rank posted this exchange's messages
		// before it joined the agreement. So whatever has come from a
		// suspect source by now is this exchange's, or no exchange's.
		e.drainSuspects()
	}
	for polled := false; len(e.q.active) > 0; {
		if expired() && (limit >= 0 || polled) {
			e.fail(fmt.Errorf("msg: exchange with tag %d: %d MPI requests with %s did not complete within %v of the agreement (their memory stays held): %w",
				x.o.Tag, len(e.q.active), e.q.pendingPeers(), max(limit, 0), ErrTimeout))
			break
		}
		polled = true
		moved, ok := e.await(nil, wait())
		if !ok {
			break
		}
		if moved {
			last = time.Now()
		}
	}
	// Requests it gave up on stay the exchanger's, to complete later.
	x.leftover = append(x.leftover, e.q.active...)
	clear(e.q.active)
	e.q.active, e.q.meta = e.q.active[:0], e.q.meta[:0]
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

// pendingPeers names the ranks of the active requests: "rank 2" or
// "ranks 1, 3".
func (q *sched) pendingPeers() string {
	var ranks []int
	for _, op := range q.meta {
		p := -1
		switch {
		case op.out != nil:
			p = op.out.dest
		case op.in != nil:
			p = op.in.src
		}
		if p >= 0 && !slices.Contains(ranks, p) {
			ranks = append(ranks, p)
		}
	}
	slices.Sort(ranks)
	switch len(ranks) {
	case 0:
		return "peers unknown"
	case 1:
		return fmt.Sprintf("rank %d", ranks[0])
	}
	names := make([]string, len(ranks))
	for i, r := range ranks {
		names[i] = strconv.Itoa(r)
	}
	return "ranks " + strings.Join(names, ", ")
}
