package msg

import (
	"runtime"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
)

// schedOp is one MPI request of an exchange: a chunk of a message.
type schedOp struct {
	out   *outMsg
	in    *inMsg
	chunk int
}

// run posts the exchange's requests and completes them.
//
// Receives are posted in schedule order (step k: from rank-k), as are sends
// (step k: to rank+k), each chunk after the previous one of its message, at
// most Window of each direction outstanding; a completion frees a slot for
// the next. The order makes the window safe: the incomplete request of
// lowest (step, chunk) over all ranks is posted on both of its sides,
// because everything before it has completed there, so MPI completes it
// and the windows move on. A staged chunk is posted once its copy to pinned
// memory has completed.
func (e *exchange) run() {
	x := e.x
	var sendQ, recvQ []schedOp
	for _, m := range e.outs {
		for i := range m.chunks {
			sendQ = append(sendQ, schedOp{out: m, chunk: i})
		}
	}
	staged := false
	for _, in := range e.ins {
		staged = staged || in.staged
		for i := range in.chunks {
			recvQ = append(recvQ, schedOp{in: in, chunk: i})
		}
	}
	w := x.o.Window
	var active []*cluster.Request
	var meta []schedOp
	nSend, nRecv, si, ri := 0, 0, 0, 0
	post := func() {
		for ri < len(recvQ) && nRecv < w {
			op := recvQ[ri]
			ri++
			if r := e.postRecv(op.in, op.chunk); r != nil {
				active, meta = append(active, r), append(meta, op)
				nRecv++
			}
		}
		for si < len(sendQ) && nSend < w {
			op := sendQ[si]
			if ev := op.out.chunks[op.chunk].ready; ev != nil {
				done, err := ev.Done()
				if err != nil {
					e.fail(e.outErr(op.out.dest, "staging", err))
				} else if !done {
					break // posted in order: the next one waits for its copy
				}
			}
			si++
			if r := e.postSend(op.out, op.chunk); r != nil {
				active, meta = append(active, r), append(meta, op)
				nSend++
			}
		}
		x.stats.MaxInFlight = max(x.stats.MaxInFlight, nSend, nRecv)
	}
	complete := func(k int, st cluster.Status, err error) {
		op := meta[k]
		last := len(active) - 1
		active[k], meta[k] = active[last], meta[last]
		active, meta = active[:last], meta[:last]
		if op.out != nil {
			nSend--
			if err != nil {
				e.fail(e.outErr(op.out.dest, "send", err))
			}
			return
		}
		nRecv--
		e.chunkDone(op.in, op.chunk, st, err)
	}

	if x.hooks.beforePost != nil {
		x.hooks.beforePost(e)
	}
	hooked := false
	var idleSince time.Time
	idle := 0
	for si < len(sendQ) || ri < len(recvQ) || len(active) > 0 {
		post()
		if !hooked {
			hooked = true
			if x.hooks.afterPost != nil {
				x.hooks.afterPost(e)
			}
		}
		if len(active) == 0 {
			if si < len(sendQ) {
				// Nothing in flight: the next send waits for its staging copy.
				if err := sendQ[si].out.chunks[sendQ[si].chunk].ready.Wait(); err != nil {
					e.fail(e.outErr(sendQ[si].out.dest, "staging", err))
				}
			}
			continue
		}
		if si == len(sendQ) && ri == len(recvQ) && !staged {
			// Everything is posted and nothing needs handling as it
			// arrives: one wait for all (cluster polls, then blocks).
			_ = cluster.Waitall(active)
			for len(active) > 0 {
				st, err := active[0].Wait() // completed: returns its result
				complete(0, st, err)
			}
			continue
		}
		k, st, ok, err := cluster.Testany(active)
		switch {
		case ok && k >= 0:
			complete(k, st, err)
			idle = 0
			continue
		case err != nil:
			// MPI itself is unusable (finalized, or the requests are
			// corrupt): nothing more can complete.
			e.fail(e.outErr(x.rank, "progress", err))
			e.abandon(sendQ[si:], recvQ[ri:])
			return
		}
		if idle == 0 {
			idleSince = time.Now()
		}
		idle++
		switch {
		case idle < 64:
		case time.Since(idleSince) < 2*time.Millisecond:
			runtime.Gosched()
		default:
			// A long wait (a peer still computing): stop spinning hard.
			time.Sleep(20 * time.Microsecond)
		}
	}
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
