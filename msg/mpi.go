package msg

import (
	"github.com/distbuf/distbuf/packing"
)

// mpiTransport runs exchanges over MPI, each message on its peer's route.
type mpiTransport struct{ x *Exchanger }

func (t *mpiTransport) close() error { return nil }

// exchange runs e, top to bottom: each peer's layout (collect), the count
// exchange or the pattern's counts, the receive buffers, each peer's
// message prepared on its route in schedule order, the data phase (run,
// sched.go), and the agreement; every route takes its steps between them.
func (t *mpiTransport) exchange(e *exchange, send []*packing.Coalesced) (*Received, error) {
	x := t.x
	n := x.size
	if err := e.countExchange(e.collect(send)); err != nil {
		return nil, err // the collective itself failed: nothing was posted, nothing can be
	}
	for _, r := range x.steps {
		r.sized(e)
	}
	// Receives: a pooled buffer per source, taken before anything is
	// enqueued on the receive stream, so that waiting for the allocation
	// waits for nothing else.
	for k := range n {
		s := (x.rank - k + n) % n
		if e.recvSize[s] <= 0 || (s == x.rank && !x.o.SelfViaMPI) {
			continue
		}
		e.ins = append(e.ins, e.newRecv(s, k, e.recvSize[s]))
	}
	e.writeManifests()
	// Sends, in schedule order; an abort notice replaces what cannot be sent.
	for k := range n {
		d := (x.rank + k) % n
		m := e.byDest[d]
		switch {
		case d == x.rank && !x.o.SelfViaMPI:
			continue // a local copy, or nothing: no MPI message to wait for
		case e.abortTo[d]:
			e.outs = append(e.outs, e.newAbort(d, k, e.abortSize(d, e.pat)))
			continue
		case m == nil:
			continue
		}
		m.step = k
		if err := m.route.prepare(e, m); err != nil {
			e.fail(err)
			m.release()
			m = e.newAbort(d, k, m.size)
		}
		e.outs = append(e.outs, m)
	}
	for _, r := range x.steps {
		r.prepared(e)
	}
	var self *outMsg // delivered by run once the MPI requests are posted
	if m := e.byDest[x.rank]; m != nil && !x.o.SelfViaMPI && !e.abortTo[x.rank] {
		self = m
	}
	e.run(self)
	for _, r := range x.steps {
		r.received(e)
	}
	e.agree()
	for _, r := range x.steps {
		r.agreed(e)
	}
	x.layouts.endExchange(len(e.errs) > 0)
	return e.deliver()
}

// abortSize is the length announced to rank d, which an abort notice
// replaces: the message's, or the pattern's when the message departs from
// it.
func (p *perRank) abortSize(d int, pat *Pattern) int64 {
	if m := p.byDest[d]; m != nil {
		return m.size
	}
	return pat.sendSize[d]
}
