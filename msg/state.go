package msg

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
)

// exchange is one exchange's state: its messages out and in, in ring order
// (step k sends to rank+k and receives from rank-k), the requests in
// flight (q), what it knows of each rank, and the errors so far. What each
// route keeps of an exchange is the route's own. An exchanger keeps the
// state of its last successful exchange (spare) for the next one.
type exchange struct {
	x      *Exchanger
	epoch  uint64
	pat    *Pattern
	outs   []*outMsg // through MPI, in schedule order
	ins    []*inMsg  // through MPI, in schedule order
	selfIn *inMsg    // the local copy to self, if any
	q      sched
	errs   failures
	probe  cluster.Probe // what the data phase matches: anything on the exchanger's communicator
	perRank
	records
	expecting int64 // pieces still to match in the data phase
	// agreeing: the agreement has begun; nothing is read from a peer's
	// memory any more.
	agreeing bool
	// stalled: the data phase ended because nothing moved for the
	// timeout; the agreement then waits only its grace (agreeTimeout).
	stalled bool
}

// perRank is an exchange's state by rank, kept for the next exchange.
type perRank struct {
	byDest             []*outMsg // this rank's message to each rank, if any
	bySrc              []*inMsg  // the message each source owes, if any
	sendSize, recvSize []int64   // the count exchange's
	abortTo            []bool    // an abort notice replaces the message announced to this rank
	refuse             []bool    // its announced message is drained: this rank refused its length
	// silent: messages from this rank beyond what it owes are drained
	// without a report of their own (its count was refused, or its message
	// given up); strayed: a stray from it was reported.
	silent, strayed     []bool
	sentTo, matchedFrom []int64 // MPI messages posted to and matched from each rank
	agreeOut, agreeIn   []int64
}

func newPerRank(n int) perRank {
	return perRank{byDest: make([]*outMsg, n), bySrc: make([]*inMsg, n), sendSize: make([]int64, n), recvSize: make([]int64, n),
		abortTo: make([]bool, n), refuse: make([]bool, n), silent: make([]bool, n), strayed: make([]bool, n),
		sentTo: make([]int64, n), matchedFrom: make([]int64, n), agreeOut: make([]int64, n), agreeIn: make([]int64, n)}
}

func (p *perRank) reset() {
	for _, s := range [][]int64{p.sendSize, p.recvSize, p.sentTo, p.matchedFrom} {
		clear(s)
	}
	for _, s := range [][]bool{p.abortTo, p.silent, p.strayed, p.refuse} {
		clear(s)
	}
	clear(p.byDest)
	clear(p.bySrc)
}

// records are the message records an exchange hands out, reused by the
// next exchange with the arrays of their chunks.
type records struct {
	outRecs   []*outMsg
	inRecs    []*inMsg
	nOut, nIn int // records handed out in this exchange
}

// newOut hands out a message record: a reused one, emptied but for the
// array of its chunks, or a new one.
func (r *records) newOut() *outMsg {
	m := nextRecord(&r.outRecs, &r.nOut)
	*m = outMsg{chunks: m.chunks[:0]}
	return m
}

// newIn is newOut for received messages.
func (r *records) newIn() *inMsg {
	in := nextRecord(&r.inRecs, &r.nIn)
	*in = inMsg{chunks: in.chunks[:0]}
	return in
}

// nextRecord is the next of the records handed out (n of them so far),
// new when all were.
func nextRecord[T any](recs *[]*T, n *int) *T {
	if *n == len(*recs) {
		*recs = append(*recs, new(T))
	}
	*n++
	return (*recs)[*n-1]
}

// empty lets go of the buffers the records referenced, keeping their
// arrays.
func (r *records) empty() {
	for _, m := range r.outRecs[:r.nOut] {
		clear(m.chunks)
		*m = outMsg{chunks: m.chunks[:0]}
	}
	for _, in := range r.inRecs[:r.nIn] {
		clear(in.chunks)
		*in = inMsg{chunks: in.chunks[:0]}
	}
	r.nOut, r.nIn = 0, 0
}

// begin returns the state of a new exchange: the spare one of the last
// exchange, emptied, or a new one.
func (x *Exchanger) begin(pat *Pattern) *exchange {
	_ = x.completeLeftover(0) // what is still pending stays for later
	e := x.spare
	x.spare = nil
	if e == nil {
		e = &exchange{x: x, perRank: newPerRank(x.size)}
	}
	e.epoch, e.pat = uint64(x.stats.Exchanges), pat
	e.probe = cluster.Probe{Comm: x.comm, Source: cluster.AnySource, Tag: cluster.AnyTag}
	e.perRank.reset()
	e.expecting, e.agreeing, e.stalled = 0, false, false
	x.layouts.startExchange()
	return e
}

// end keeps the state of an exchange that succeeded for the next one,
// without the references to buffers that are no longer its business.
func (x *Exchanger) end(e *exchange) {
	e.records.empty()
	e.perRank.reset()
	e.outs, e.ins, e.selfIn, e.pat = e.outs[:0], e.ins[:0], nil, nil
	e.q.reset()
	x.spare = e
}

func (e *exchange) fail(err error) {
	if err != nil {
		e.errs = append(e.errs, err)
	}
}

// collect validates the send list and describes each message (byDest).
func (e *exchange) collect(send []*packing.Coalesced) error {
	x := e.x
	var errs []error
	for i, c := range send {
		if c == nil {
			errs = append(errs, fmt.Errorf("msg: send buffer %d is nil: %w", i, distbuf.ErrInvalid))
			continue
		}
		if _, _, _, err := c.Buffer().Region(); err != nil {
			errs = append(errs, fmt.Errorf("msg: send buffer %d: %w", i, err))
			continue
		}
		d := c.Dest()
		if d == packing.NoDest {
			errs = append(errs, fmt.Errorf("msg: send buffer %d has no destination rank: a received or joined layout is not a send buffer; copy its blocks into one of a plan for the destination (AllocSend): %w", i, distbuf.ErrInvalid))
			continue
		}
		if d < 0 || d >= x.size {
			errs = append(errs, fmt.Errorf("msg: send buffer %d is for rank %d, outside a communicator of %d ranks: %w", i, d, x.size, distbuf.ErrInvalid))
			continue
		}
		if e.byDest[d] != nil {
			errs = append(errs, fmt.Errorf("msg: two send buffers for rank %d: %w", d, distbuf.ErrInvalid))
			continue
		}
		if c.Len() == 0 {
			continue // nothing to send: no message
		}
		m := e.newOut()
		m.dest, m.c, m.route = d, c, x.routes[d]
		if d == x.rank && !x.o.SelfViaMPI {
			// Delivered by a copy (copyToSelf): nothing to describe on the
			// wire, so no manifest; the size is the message's all the same.
			m.size = int64(wire.PayloadOffset(c.Len())) + c.Size()
			e.byDest[d] = m
			continue
		}
		man, built, err := x.layouts.forSend(d, c, e.pat)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if built {
			x.stats.ManifestsBuilt++
		}
		m.man, m.size = man, int64(man.PayloadOffset())+c.Size()
		e.byDest[d] = m
	}
	return errors.Join(errs...)
}

// count adds the messages of an exchange that succeeded (byDest) to the
// stats: every message was delivered, on its route.
func (x *Exchanger) count(byDest []*outMsg) {
	_, nccl := x.tr.(*ncclTransport)
	for d, m := range byDest {
		if m == nil {
			continue
		}
		r := RouteSelf
		switch {
		case d == x.rank && !x.o.SelfViaMPI:
		case nccl:
			r = RouteNCCL
		default:
			r = x.routes[d].kind()
		}
		x.stats.Routes[r].Messages++
		x.stats.Routes[r].Bytes += m.size
		if r != RouteSelf {
			x.stats.Messages++
			x.stats.Bytes += m.size
		}
	}
}

// deliver ends an exchange whose transfers are over: the received buffers
// by source, or, after any failure, the errors with every buffer freed. A
// pattern learns from its first successful exchange.
func (e *exchange) deliver() (*Received, error) {
	x := e.x
	res := make([]*packing.Coalesced, x.size)
	for _, in := range e.ins {
		if in.result != nil {
			res[in.src] = in.result
		}
	}
	if e.selfIn != nil && e.selfIn.result != nil {
		res[x.rank] = e.selfIn.result
	}
	if len(e.errs) > 0 {
		for _, c := range res {
			if c != nil {
				_ = c.Free()
			}
		}
		return nil, e.errs.result()
	}
	if e.pat != nil && !e.pat.learned {
		e.pat.learn(e)
	}
	x.count(e.byDest)
	x.end(e)
	return &Received{bySource: res, epoch: e.epoch}, nil
}
