package msg

import (
	"runtime"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
)

// schedOp is one MPI request of an exchange: a chunk of a message.
type schedOp struct {
	out   *outMsg
	in    *inMsg
	chunk int
}

// sched is the request state of an exchange.
//
// Receives are posted in schedule order (step k: from rank-k), as are sends
// (step k: to rank+k), each chunk after the previous one of its message, at
// most Window of each direction outstanding; a completion frees a slot for
// the next. The order makes the window safe: the incomplete request of
// lowest (step, chunk) over all ranks is posted on both of its sides,
// because everything before it has completed there, so MPI completes it
// and the windows move on. A staged chunk is posted once its copy to pinned
// memory has completed.
//
// Waiting blocks in MPI (cluster.Waitsome) over every outstanding request
// of the rank, never on one chosen request, and only when nothing but an
// MPI completion can let the rank go on: everything is posted, or what is
// not waits for a window slot. That cannot deadlock: the lowest incomplete
// request is posted on both of its sides, both ranks are inside MPI (or
// doing local work that ends), so it completes and returns both ranks'
// waits, which then post what its slot allows. The one exception is a send
// held back by its staging copy, which completes outside MPI: the rank then
// polls MPI and the copy's event in turn. Messages are handled as their
// requests complete, so a manifest is checked while other transfers go on.
type sched struct {
	sendQ, recvQ []schedOp
	si, ri       int // next to post
	nSend, nRecv int // outstanding
	active       []*cluster.Request
	meta         []schedOp
	done         []int // indices into active that Waitsome completed
}

// reset empties the queues for the next exchange, keeping their arrays.
func (q *sched) reset() {
	clear(q.sendQ)
	clear(q.recvQ)
	clear(q.active)
	clear(q.meta)
	*q = sched{sendQ: q.sendQ[:0], recvQ: q.recvQ[:0], active: q.active[:0], meta: q.meta[:0], done: q.done[:0]}
}

// postRecvs posts receives while the window allows.
func (e *exchange) postRecvs() {
	q := &e.q
	for q.ri < len(q.recvQ) && q.nRecv < e.x.o.Window {
		op := q.recvQ[q.ri]
		q.ri++
		if r := e.postRecv(op.in, op.chunk); r != nil {
			q.active, q.meta = append(q.active, r), append(q.meta, op)
			q.nRecv++
		}
	}
	e.x.stats.MaxInFlight = max(e.x.stats.MaxInFlight, q.nRecv)
}

// postSends posts sends, in order, while the window allows and their data
// is ready.
func (e *exchange) postSends() {
	q := &e.q
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
		if r := e.postSend(op.out, op.chunk); r != nil {
			q.active, q.meta = append(q.active, r), append(q.meta, op)
			q.nSend++
		}
	}
	e.x.stats.MaxInFlight = max(e.x.stats.MaxInFlight, q.nSend)
}

// startRecvs posts the first receives as soon as their buffers exist, so
// that messages can be matched while this rank still prepares its sends.
func (e *exchange) startRecvs() {
	q := &e.q
	for _, in := range e.ins {
		for i := range in.chunks {
			q.recvQ = append(q.recvQ, schedOp{in: in, chunk: i})
		}
	}
	if e.x.hooks.beforePost != nil {
		e.x.hooks.beforePost(e)
	}
	e.postRecvs()
}

// complete handles the completion of active request k.
func (e *exchange) complete(k int, st cluster.Status, err error) {
	q := &e.q
	op := q.meta[k]
	last := len(q.active) - 1
	q.active[k], q.meta[k] = q.active[last], q.meta[last]
	q.active, q.meta = q.active[:last], q.meta[:last]
	if op.out != nil {
		q.nSend--
		if err != nil {
			e.fail(e.outErr(op.out.dest, "send", err))
		}
		return
	}
	q.nRecv--
	e.chunkDone(op.in, op.chunk, st, err)
}

// run posts the sends and the remaining receives and completes every
// request. The message to self, if any, is copied once the first requests
// are posted: the copy needs no peer, and done before, it would delay
// every peer's receive.
func (e *exchange) run(self *outMsg) {
	x, q := e.x, &e.q
	for _, m := range e.outs {
		for i := range m.chunks {
			q.sendQ = append(q.sendQ, schedOp{out: m, chunk: i})
		}
	}
	e.postRecvs()
	e.postSends()
	if self != nil {
		e.copyToSelf(self)
	}
	if x.hooks.afterPost != nil {
		x.hooks.afterPost(e)
	}
	idle := 0
	for q.si < len(q.sendQ) || q.ri < len(q.recvQ) || len(q.active) > 0 {
		e.postRecvs()
		e.postSends()
		awaitsCopy := q.si < len(q.sendQ) && q.nSend < x.o.Window // postSends stopped at a staging event
		if len(q.active) == 0 {
			if awaitsCopy {
				// Nothing in flight: the next send waits for its staging copy.
				op := q.sendQ[q.si]
				if err := op.out.chunks[op.chunk].ready.Wait(); err != nil {
					e.fail(e.outErr(op.out.dest, "staging", err))
				}
			}
			continue
		}
		if !awaitsCopy {
			// Only a completion can let this rank go on: wait in MPI for
			// the next ones, whichever they are (see sched).
			var err error
			if q.done, err = cluster.Waitsome(q.active, q.done[:0]); err != nil {
				e.progressFailed(err)
				return
			}
			// From the highest index down: complete moves the last request
			// into the slot it empties, which is then already handled.
			for i := len(q.done) - 1; i >= 0; i-- {
				k := q.done[i]
				st, err := q.active[k].Wait() // completed: returns its result
				e.complete(k, st, err)
			}
			continue
		}
		// A send waits for its staging copy, which completes outside MPI:
		// poll both, without sleeping, since MPI only moves data (Open
		// MPI's shared-memory transport a fragment of a large message)
		// while it is called.
		k, st, ok, err := cluster.Testany(q.active)
		switch {
		case ok && k >= 0:
			e.complete(k, st, err)
			idle = 0
		case err != nil:
			e.progressFailed(err)
			return
		default:
			if idle++; idle >= 64 {
				runtime.Gosched()
			}
		}
	}
}

// progressFailed ends an exchange whose requests MPI can no longer
// complete (finalized, or the requests are corrupt).
func (e *exchange) progressFailed(err error) {
	q := &e.q
	e.fail(e.outErr(e.x.rank, "progress", err))
	e.abandon(q.sendQ[q.si:], q.recvQ[q.ri:])
}

// abandon releases what requests never posted hold.
func (e *exchange) abandon(sends, recvs []schedOp) {
	for _, op := range sends {
		op.out.release()
	}
	for _, op := range recvs {
		op.in.releaseChunks()
	}
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
		_ = buf.Free() // deferred by the hold until the send completes
		ch.buf = nil
	}
	if err != nil {
		e.fail(e.outErr(m.dest, "send", err))
		if r == nil {
			return nil
		}
	}
	x.stats.MPISends++
	x.stats.BytesSent += ch.n
	if i == 0 && !m.abort {
		x.stats.Messages++
	}
	return r
}

// postRecv posts chunk i of in; nil when the post failed (reported).
func (e *exchange) postRecv(in *inMsg, i int) *cluster.Request {
	x := e.x
	ch := &in.chunks[i]
	if ch.posted {
		return nil
	}
	rel := in.attach(i)
	r, err := x.comm.Irecv(ch.mem, in.src, x.o.Tag)
	if err == nil {
		err = r.Attach(rel)
	} else {
		_ = rel.Release()
	}
	ch.posted = true
	if r == nil {
		// Never posted, so it never completes: count it as failed now.
		e.chunkDone(in, i, cluster.Status{}, err)
		return nil
	}
	if err != nil {
		e.fail(e.inErr(in, "receive", err))
	}
	return r
}
