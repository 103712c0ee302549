package msg

import (
	"fmt"
	"runtime"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/refbuf"
)

// exchange is one exchange's state and schedule: its messages out and in,
// in ring order (step k sends to rank+k and receives from rank-k), the
// requests in flight (q) and the errors so far. An exchanger keeps the
// state of its last successful exchange (spare) for the next one.
type exchange struct {
	x      *Exchanger
	epoch  uint64
	pat    *Pattern
	aware  bool
	outs   []*outMsg // through MPI, in schedule order
	ins    []*inMsg  // through MPI, in schedule order
	selfIn *inMsg    // the local copy to self, if any
	q      sched
	errs   []error
	probe  cluster.Probe // what the data phase matches: anything on the exchanger's communicator

	// Per-rank scratch and the message records, kept for the next exchange.
	byDest             []*outMsg
	sendSize, recvSize []int64
	abortTo            []bool
	bySrc              []*inMsg // the message each source owes, if any
	// silent: messages from this rank beyond what it owes are drained
	// without a report of their own (its count was refused, or its message
	// given up); strayed: a stray from it was reported.
	silent, strayed     []bool
	refuse              []bool  // its announced message is drained: this rank refused its length
	sentTo, matchedFrom []int64 // MPI messages posted to and matched from each rank
	agreeOut, agreeIn   []int64
	expecting           int64 // pieces still to match in the data phase
	outRecs             []*outMsg
	inRecs              []*inMsg
	nOut, nIn           int // records handed out in this exchange
	// joint is the one receive buffer of the messages that come through
	// node-local windows (allocJoint), jointOff each source's place in it
	// (-1: none); the exchange holds a reference until it ends.
	joint    *refbuf.Shared
	jointOff []int64
	// readHolds keep this rank's send buffers, and readCopies the host
	// copies of device ones, for the peers that read them, until the
	// agreement; agreeing: the agreement has begun, and nothing is read
	// any more.
	readHolds  []*devalloc.Hold
	readCopies [][]byte
	readPin    runtime.Pinner
	agreeing   bool
}

// begin returns the state of a new exchange: the spare one of the last
// exchange, emptied, or a new one.
func (x *Exchanger) begin(pat *Pattern) *exchange {
	e := x.spare
	x.spare = nil
	if e == nil {
		n := x.size
		e = &exchange{x: x, byDest: make([]*outMsg, n), sendSize: make([]int64, n), recvSize: make([]int64, n), abortTo: make([]bool, n),
			bySrc: make([]*inMsg, n), silent: make([]bool, n), strayed: make([]bool, n), refuse: make([]bool, n), sentTo: make([]int64, n), matchedFrom: make([]int64, n),
			agreeOut: make([]int64, n), agreeIn: make([]int64, n), jointOff: make([]int64, n)}
	}
	e.epoch, e.pat = x.epoch, pat
	e.probe = cluster.Probe{Comm: x.comm, Source: cluster.AnySource, Tag: cluster.AnyTag}
	for _, s := range [][]int64{e.sendSize, e.recvSize, e.sentTo, e.matchedFrom} {
		clear(s)
	}
	for _, s := range [][]bool{e.abortTo, e.silent, e.strayed, e.refuse} {
		clear(s)
	}
	clear(e.byDest)
	clear(e.bySrc)
	e.expecting, e.agreeing = 0, false
	x.layouts.startExchange()
	return e
}

// end keeps the state of an exchange that succeeded for the next one,
// without the references to buffers that are no longer its business.
func (x *Exchanger) end(e *exchange) {
	for _, m := range e.outRecs[:e.nOut] {
		clear(m.chunks)
		*m = outMsg{chunks: m.chunks[:0]}
	}
	for _, in := range e.inRecs[:e.nIn] {
		clear(in.chunks)
		*in = inMsg{chunks: in.chunks[:0]}
	}
	clear(e.byDest)
	clear(e.bySrc)
	e.nOut, e.nIn = 0, 0
	e.outs, e.ins, e.selfIn, e.pat, e.joint = e.outs[:0], e.ins[:0], nil, nil, nil
	e.q.reset()
	x.spare = e
}

// newOut hands out a message record: a reused one, emptied but for the
// array of its chunks, or a new one.
func (e *exchange) newOut() *outMsg {
	if e.nOut == len(e.outRecs) {
		e.outRecs = append(e.outRecs, new(outMsg))
	}
	m := e.outRecs[e.nOut]
	e.nOut++
	*m = outMsg{chunks: m.chunks[:0]}
	return m
}

// newIn is newOut for received messages.
func (e *exchange) newIn() *inMsg {
	if e.nIn == len(e.inRecs) {
		e.inRecs = append(e.inRecs, new(inMsg))
	}
	in := e.inRecs[e.nIn]
	e.nIn++
	*in = inMsg{chunks: in.chunks[:0]}
	return in
}

func (e *exchange) fail(err error) {
	if err != nil {
		e.errs = append(e.errs, err)
	}
}

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
		if ev := op.out.chunks[op.chunk].ready; ev != nil {
			done, err := ev.Done()
			if err != nil {
				e.fail(e.outErr(op.out.dest, "staging", err))
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
			e.fail(e.outErr(op.out.dest, "send", err))
		}
		return
	case op.in != nil && op.chunk >= 0:
		q.nRecv--
		e.chunkDone(op.in, op.chunk, st, err)
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
		e.fail(e.outErr(e.x.rank, "progress", err))
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
	if x.hooks.afterPost != nil {
		x.hooks.afterPost(e)
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
				e.fail(e.outErr(op.out.dest, "staging", err))
			}
			last = time.Now()
			continue
		}
		wait := time.Duration(-1)
		if x.timeout > 0 {
			if wait = x.timeout - time.Since(last); wait <= 0 {
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
		if x.ipc != nil && !x.ipc.kernelCopies {
			// Before the next wait: the copies need not wait for later
			// notices. Under MPS they do, and go in one launch at the end
			// of the phase (ipcConsumed): one device operation for every
			// peer instead of one each, queued behind the other ranks'.
			e.flushFromWindows()
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
	for _, in := range e.ins {
		if in.matched < in.pieces {
			err := wireErr(ErrTimeout, in.src, x.o.Tag, "pieces", "%d of the %d MPI messages of its %d-byte message arrived, then none for %v",
				in.matched, in.pieces, in.size, x.timeout)
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
			e.fail(outgoing(wireErr(ErrTimeout, d, x.o.Tag, "pieces", "the exchange waited %v without progress; MPI messages from chunk %d on were not sent", x.timeout, op.chunk)))
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
	var rel cluster.Releaser = m.share
	var buf = ch.buf
	switch {
	case ch.pin != nil:
		rel = ch.pin
	case buf != nil:
		h, err := buf.Hold(devalloc.Read)
		if err != nil {
			e.fail(e.outErr(m.dest, "staging", err))
			m.release()
			return nil
		}
		rel = h
	}
	r, err := x.comm.Isend(ch.mem, m.dest, x.o.Tag)
	if err == nil {
		err = r.Attach(rel)
	} else {
		_ = rel.Release()
	}
	ch.posted = true
	if buf != nil {
		if ch.keep && err == nil {
			if kerr := x.ipc.keepSent(m.dest, buf); kerr != nil {
				e.fail(e.outErr(m.dest, "notice", kerr))
			}
		} else {
			_ = buf.Free() // deferred by the hold until the send completes
		}
		ch.buf = nil
	}
	if err != nil {
		e.fail(e.outErr(m.dest, "send", err))
		if r == nil {
			return nil
		}
	}
	e.sentTo[m.dest]++
	x.stats.MPISends++
	x.stats.BytesSent += ch.n
	if i == 0 && !m.abort {
		x.stats.Messages++
	}
	return r
}
