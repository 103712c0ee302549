package msg

import (
	"fmt"
	"runtime"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
)

// schedOp is one MPI request of an exchange: a chunk of a message sent, a
// piece received into its place, or a message discarded (in nil for a
// stray, chunk -1 for a piece of a drained message).
type schedOp struct {
	out     *outMsg
	in      *inMsg
	chunk   int
	discard bool
}

// sched is the request state of an exchange.
//
// Sends are posted in schedule order (step k: to rank+k), each chunk after
// the previous one of its message, at most Window outstanding; a
// completion frees a slot for the next. A staged chunk is posted once its
// copy to pinned memory has completed.
//
// Receives are not posted ahead: the rank probes (MPI_Improbe on the
// exchanger's own communicator) for whatever has arrived, learns its
// source and length, and only then posts its receive, into the place of
// the piece its source owes next, or into scratch. At most Window receives
// are outstanding; while the window is full the rank does not probe, and
// the messages wait in MPI. Every outstanding receive is of a message
// already matched, so it completes as soon as its sender's MPI moves the
// data, whatever the receiver does next.
//
// That keeps the windows safe: the incomplete send of lowest (step, chunk)
// over all ranks is posted (every send before it on its rank completed),
// its receiver either probes (its window has room) and matches it, or has
// a full window of matched receives, which complete. Waiting tests the
// rank's requests and probes in turn (cluster.Await), never blocking
// inside MPI, so that a deadline can end a wait for a message that never
// comes.
type sched struct {
	sendQ        []schedOp
	si           int // next send to post
	nSend, nRecv int // outstanding
	active       []*cluster.Request
	meta         []schedOp
	done         []int // indices into active that Await completed
}

// reset empties the queues for the next exchange, keeping their arrays.
func (q *sched) reset() {
	clear(q.sendQ)
	clear(q.active)
	clear(q.meta)
	*q = sched{sendQ: q.sendQ[:0], active: q.active[:0], meta: q.meta[:0], done: q.done[:0]}
}

// track adds a posted request to the active set.
func (q *sched) track(r *cluster.Request, op schedOp) {
	q.active, q.meta = append(q.active, r), append(q.meta, op)
	if op.out != nil {
		q.nSend++
	} else {
		q.nRecv++
	}
}

// postSends posts sends, in order, while the window allows and their data
// is ready. It reports whether it posted any.
func (e *exchange) postSends() bool {
	q := &e.q
	posted := false
	for q.si < len(q.sendQ) && q.nSend < e.x.o.Window {
		op := q.sendQ[q.si]
		if op.out.chunks[op.chunk].mem == nil && !op.out.chunks[op.chunk].posted {
			break // staged once an earlier chunk's send completes
		}
		if ev := op.out.chunks[op.chunk].ready; ev != nil {
			done, err := ev.Done()
			if err != nil {
				e.fail(e.x.outErr(op.out.dest, "staging", err))
			} else if !done {
				break // posted in order: the next one waits for its copy
			}
		}
		q.si++
		posted = true
		if r := e.postSend(op.out, op.chunk); r != nil {
			q.track(r, op)
		}
	}
	e.x.stats.MaxInFlight = max(e.x.stats.MaxInFlight, q.nSend, q.nRecv)
	return posted
}

// complete handles the completion of active request k.
func (e *exchange) complete(k int, st cluster.Status, err error) {
	q := &e.q
	op := q.meta[k]
	last := len(q.active) - 1
	q.active[k], q.meta[k] = q.active[last], q.meta[last]
	q.active, q.meta = q.active[:last], q.meta[:last]
	switch {
	case op.out != nil:
		q.nSend--
		if err != nil {
			e.fail(e.x.outErr(op.out.dest, "send", err))
		}
		op.out.route.sent(e, op.out, op.chunk)
		return
	case op.in != nil && op.chunk >= 0:
		q.nRecv--
		e.chunkDone(op.in, op.chunk, st, err, op.discard)
	default:
		q.nRecv--
		if err != nil {
			e.fail(fmt.Errorf("msg: message from rank %d tag %d: drain: %w", st.Source, e.x.o.Tag, err))
		}
	}
}

// await waits for the next completions and arrivals (see cluster.Await)
// and handles them. It reports whether anything happened; false means the
// wait ran out, or failed (reported, and the exchange can go no further:
// ok is false).
func (e *exchange) await(probe *cluster.Probe, wait time.Duration) (progress, ok bool) {
	q := &e.q
	var m *cluster.Message
	var err error
	q.done, m, err = cluster.Await(q.active, q.done[:0], probe, wait)
	if err != nil {
		e.fail(e.x.outErr(e.x.rank, "progress", err))
		return false, false
	}
	// From the highest index down: complete moves the last request into
	// the slot it empties, which is then already handled.
	for i := len(q.done) - 1; i >= 0; i-- {
		k := q.done[i]
		st, err := q.active[k].Wait() // completed: returns its result
		e.complete(k, st, err)
	}
	if m != nil {
		e.arrived(m)
	}
	return len(q.done) > 0 || m != nil, true
}

// run is the data phase: it posts the sends, matches and receives every
// piece the other ranks announced, and completes every request, or stops
// when nothing has moved for the exchanger's timeout. The message to self,
// if any, is copied once the first sends are posted: the copy needs no
// peer, and done before, it would delay every peer's receive.
func (e *exchange) run(self *outMsg) {
	x, q := e.x, &e.q
	for _, m := range e.outs {
		for i := range m.chunks {
			q.sendQ = append(q.sendQ, schedOp{out: m, chunk: i})
		}
	}
	e.postSends()
	if self != nil {
		e.copyToSelf(self)
	}
	idle := 0
	last := time.Now()
	// The phase ends once every send is posted and every piece owed here
	// received: sends still in flight complete after the agreement, so
	// that a receiver that takes a message only then (one it did not
	// expect) does not keep its sender out of the agreement.
	for q.si < len(q.sendQ) || q.nRecv > 0 || e.expecting > 0 {
		progress := e.postSends()
		awaitsCopy := q.si < len(q.sendQ) && q.nSend < x.o.Window // postSends stopped at a staging event
		var probe *cluster.Probe
		if q.nRecv < x.o.Window {
			probe = &e.probe // strays included: anything on the exchanger's communicator is for this exchange
		}
		if awaitsCopy && len(q.active) == 0 && e.expecting == 0 {
			// Nothing in flight or expected: the next send waits for its
			// staging copy, which completes by itself.
			op := q.sendQ[q.si]
			if err := op.out.chunks[op.chunk].ready.Wait(); err != nil {
				e.fail(e.x.outErr(op.out.dest, "staging", err))
			}
			last = time.Now()
			continue
		}
		wait := time.Duration(-1)
		if x.lim.timeout > 0 {
			if wait = x.lim.timeout - time.Since(last); wait <= 0 {
				e.timedOut()
				return
			}
		}
		if awaitsCopy {
			// The copy completes outside MPI: test both, without sleeping,
			// since MPI only moves data (Open MPI's shared-memory transport
			// a fragment of a large message) while it is called.
			wait = 0
		}
		moved, ok := e.await(probe, wait)
		for _, r := range x.steps {
			r.waited(e)
		}
		if !ok {
			e.abandonSends()
			return
		}
		if progress || moved {
			last, idle = time.Now(), 0
		} else if idle++; awaitsCopy && idle >= 64 {
			idle = 0
			runtime.Gosched()
		}
	}
}

// timedOut ends a data phase in which nothing moved for the exchanger's
// timeout: every message still owed is reported and given up, and every
// send not yet posted is given up too (the agreement tells the receivers
// what was sent). Posted requests stay active: matched receives complete
// by themselves, sends once their receivers drain them after the
// agreement.
func (e *exchange) timedOut() {
	x := e.x
	x.stats.Timeouts++
	e.stalled = true
	for _, in := range e.ins {
		if in.matched < in.pieces {
			err := wireErr(ErrTimeout, in.src, x.o.Tag, "pieces", "%d of the %d MPI messages of its %d-byte message arrived, then none for %v",
				in.matched, in.pieces, in.size, x.lim.timeout)
			in.matched = in.pieces // later arrivals are the agreement's business
			e.silent[in.src] = true
			if in.drain {
				e.fail(err)
				continue
			}
			if in.failed == nil {
				in.failed = err
			}
			e.endIn(in)
		}
	}
	e.expecting = 0
	q := &e.q
	reported := map[int]bool{}
	for _, op := range q.sendQ[q.si:] {
		if d := op.out.dest; !reported[d] {
			reported[d] = true
			e.fail(outgoing(wireErr(ErrTimeout, d, x.o.Tag, "pieces", "the exchange waited %v without progress; MPI messages from chunk %d on were not sent", x.lim.timeout, op.chunk)))
		}
	}
	e.abandonSends()
}

// abandonSends releases what sends never posted hold.
func (e *exchange) abandonSends() {
	q := &e.q
	for _, op := range q.sendQ[q.si:] {
		op.out.release()
	}
	q.si = len(q.sendQ)
}

// postSend posts chunk i of m; nil when the post failed (reported).
func (e *exchange) postSend(m *outMsg, i int) *cluster.Request {
	x := e.x
	ch := &m.chunks[i]
	if ch.posted {
		return nil // released after an earlier failure of its message
	}
	defer func() {
		if ch.ready != nil {
			_ = ch.ready.Release()
			ch.ready = nil
		}
	}()
	var rel cluster.Releaser // what the request holds until it completes; a ring slot goes back in sent
	if m.share != nil {
		rel = m.share
	}
	var buf = ch.buf
	switch {
	case ch.pin != nil:
		rel = ch.pin
	case buf != nil:
		h, err := buf.Hold(devalloc.Read)
		if err != nil {
			e.fail(e.x.outErr(m.dest, "staging", err))
			m.release()
			return nil
		}
		rel = h
	}
	r, err := x.comm.Isend(ch.mem, m.dest, x.o.Tag)
	switch {
	case err == nil && rel != nil:
		err = r.Attach(rel)
	case err != nil && rel != nil:
		_ = rel.Release()
	}
	ch.posted = true
	if r == nil && ch.slot != nil {
		ch.slot.put() // nothing was posted
		ch.slot = nil
	}
	if buf != nil {
		_ = buf.Free() // deferred by the hold until the send completes
		ch.buf = nil
	}
	if ch.notice != nil {
		// Kept for the next notice to the peer: rewritten only in a later
		// exchange, once this send has completed.
		var kerr error
		if r == nil {
			kerr = ch.notice.Drop() // nothing was posted
		} else {
			kerr = ch.notice.KeepSent(m.dest)
		}
		if kerr != nil {
			e.fail(e.x.outErr(m.dest, "notice", kerr))
		}
		ch.notice = nil
	}
	if err != nil {
		e.fail(e.x.outErr(m.dest, "send", err))
		if r == nil {
			return nil
		}
	}
	e.sentTo[m.dest]++
	x.stats.MPISends++
	x.stats.MPIBytes += ch.n
	return r
}
