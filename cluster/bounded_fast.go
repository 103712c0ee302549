package cluster

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

// A bounded collective's round usually completes within microseconds of
// its start: every rank is already there. Run through Go one request at a
// time (post, Await, Recv, Await again), that costs several times MPI's
// own collective; the control path of every exchange pays it. So the
// first part of a round runs in C, in one call: the sends posted, the
// parts probed, received and tested in one loop for at most fastSpin.
// Whatever is not done by then (a late rank, a part the round cannot
// take) becomes the Go side's requests and message, and the round goes on
// as if it had posted them itself: what reaches MPI is the same either
// way.

// fastSpin bounds the part in C: long enough for parts already on their
// way, short against any timeout. Where a node runs more ranks than it has
// CPUs online (state.crowded), the loop makes one pass and no more: a
// rank spinning in C there takes the core of the rank it waits for, while
// Await's polling, which gives way, does not (docs/PERFORMANCE.md).
const fastSpin = 50 * time.Microsecond

// fastMaxBytes bounds the parts the C loop takes: the control messages
// (counts, agreements, settings rows). Larger rounds go through Go.
const fastMaxBytes = 64 << 10

// fastResult is what the C loop left: its sends (the ones posted, in
// order), its parts, and a matched message it could not take.
type fastResult struct {
	pending     bool // a send or receive is still pending: its buffer must be pinned
	sends       []fastPart
	recvs       []fastPart // one per rank of the round's from
	extra       *msgImpl
	extraStatus Status
	// The storage of sends and recvs for the usual few peers.
	sendBuf, recvBuf [8]fastPart
}

// fastPart is one send or receive of the C loop: pending (its handle for
// a Request), complete (with its status and error), or, for a receive,
// not matched.
type fastPart struct {
	matched, complete bool
	pending           bool
	handle            reqImpl
	status            Status
	err               error
}

// fastEligible: the C loop runs only for a round that moves something
// (a rank alone, as in every 1-rank solve, has nothing to move), with
// nothing of earlier rounds to look after (no leftover requests, no late
// parts to drop) and small parts, on a backend that has it.
func (r *boundedRound) fastEligible(sends []span) bool {
	if len(sends) == 0 && len(r.from) == 0 {
		return false
	}
	if !boundedFastAvailable() || len(r.live) > 0 || len(r.c.bounded.late) > 0 || r.stride > fastMaxBytes {
		return false
	}
	for _, s := range sends {
		if s.n > fastMaxBytes {
			return false
		}
	}
	return true
}

// fast runs the C loop and takes over what it left: it returns how many
// parts were matched and the message it could not take, if any.
func (r *boundedRound) fast(sends []span, deadline time.Time) (matched int, m *Message, err error) {
	spin := fastSpin
	if state.crowded {
		spin = 0
	}
	if !deadline.IsZero() {
		spin = min(spin, until(deadline))
	}
	// The round's own result storage: a round is reused (see takeRound),
	// so the usual call allocates nothing for it.
	res := &r.fastRes
	*res = fastResult{}
	res.sends, res.recvs = res.sendBuf[:0], res.recvBuf[:0]
	ferr := backendBoundedFast(r.c.ctl.impl, r.tag, bytesAddr(r.sendBuf), sends, bytesAddr(r.recvBuf), r.from, r.slotOf, r.stride, spin, res)
	runtime.KeepAlive(r.sendBuf)
	runtime.KeepAlive(r.recvBuf)
	if res.pending {
		r.pin()
	}
	for i, p := range res.sends {
		s := sends[i]
		switch {
		case p.pending:
			req := &Request{impl: p.handle, posted: true, send: true, peer: s.peer, tag: r.tag, size: s.n, mem: Sub(r.mem[0], s.off, s.n)}
			track(req)
			if e := r.pins.attach(req); e != nil && err == nil {
				err = e
			}
			r.add(req, slotSend, s.peer)
		case p.err != nil && err == nil:
			err = fmt.Errorf("cluster: %s: rank %d: %w", r.name(), s.peer, p.err)
		}
	}
	for j, p := range res.recvs {
		if !p.matched {
			continue
		}
		peer := r.from[j]
		r.matched[j] = true
		matched++
		if !p.complete {
			req := &Request{impl: p.handle, posted: true, peer: peer, tag: r.tag, size: r.stride, mem: Sub(r.mem[1], int64(j)*r.stride, r.stride)}
			track(req)
			if e := r.pins.attach(req); e != nil && err == nil {
				err = e
			}
			r.add(req, j, peer)
			continue
		}
		if p.err != nil {
			if err == nil {
				err = fmt.Errorf("cluster: %s: rank %d: %w", r.name(), peer, p.err)
			}
			continue
		}
		h := readHeader(r.recvBuf[int64(j)*r.stride:])
		if h.seq != r.h.seq {
			// A part of an earlier collective with this tag: its sender's
			// part of this one is still to come.
			r.matched[j] = false
			matched--
			continue
		}
		if e := r.checkHeader(p.status.Source, h); e != nil && err == nil {
			err = e
		}
		r.got[j] = true
	}
	if res.extra != nil {
		unreceived.Add(1)
		m = &Message{impl: *res.extra, status: res.extraStatus}
	}
	if ferr != nil && err == nil {
		err = fmt.Errorf("cluster: %s: %w", r.name(), ferr)
	}
	return matched, m, err
}

// bytesAddr is the address of b's data (pinned by the caller), or 0.
func bytesAddr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}
