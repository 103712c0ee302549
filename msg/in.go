package msg

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/ipcwin"
	"github.com/distbuf/distbuf/internal/refbuf"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
)

// headerPeek is how much of a message a device receiver reads back first:
// the whole manifest of up to 2040 blocks, so that one copy usually does.
const headerPeek = 64 << 10

// inMsg is one logical message this rank receives in an exchange. Its
// pieces (the MPI messages it travels as) are matched by probe in the
// order the sender sent them, each received only once its length is known:
// a piece of the announced length into the memory its route gives it, a
// shorter one there too (and rejected), a longer one, or any piece of a
// message that already failed or that this rank has no buffer for, into
// scratch memory that is dropped.
type inMsg struct {
	src     int
	step    int
	route   route
	size    int64 // announced bytes
	pieces  int64 // MPI messages it travels as
	matched int64 // pieces matched so far
	// drain: this rank has no buffer for it, and every piece is discarded.
	drain bool
	// ended: the message became a result or its buffer was freed, and its
	// error, if any, was reported.
	ended bool

	buf      *devalloc.Buffer
	base     int64          // where the message starts in buf: 0 but in a joint buffer
	joint    *refbuf.Shared // buf is a joint buffer shared with other messages, not the message's own
	hold     *devalloc.Hold // a write hold on buf while MPI or a read writes it from outside the streams
	inFlight int            // receives posted into the message's memory and not yet complete
	chunks   []inChunk      // by piece; none while draining
	next     int            // the next piece to process, in order
	finished int64          // pieces done

	accepted
	failed error // the first thing wrong with the message, reported when it ends
	result *packing.Coalesced
}

// accepted is what a receiver learns of a message's manifest.
type accepted struct {
	header wire.Header
	p      uint64 // payload offset, once the header is read
	man    []byte // staged: the manifest gathered across chunks, when longer than the first
	plan   *packing.Plan
	crc    uint32 // staged: the payload's, so far
	// staged: the header announces a payload checksum, so crc is summed
	sumStaged bool
	learned   *learnedIn
}

type inChunk struct {
	off, n int64
	region bufRegion        // direct: the memory MPI receives into
	buf    *devalloc.Buffer // the pinned memory of a staged chunk
	slot   *stageSlot       // a staged chunk's slot of the staging ring
	win    *ipcwin.Notice   // a window notice's buffer
	notice []byte           // a read notice
	posted bool             // its receive (or discard) was posted, or it never will be
	// discarded: the piece went to scratch memory, not to this chunk.
	discarded bool
	done      bool
	got       int64
	err       error
}

// newRecv sets up the receive of size bytes from src: its memory, taken by
// its route, and a record per piece. When the memory cannot be had the
// message is drained (every piece discarded as it arrives) so the sender
// is not left waiting, and the failure is reported.
func (e *exchange) newRecv(src, step int, size int64) *inMsg {
	x := e.x
	in := e.newIn()
	in.src, in.step, in.size, in.route = src, step, size, x.routes[src]
	in.pieces = int64(x.pieceCount(src, size))
	e.expecting += in.pieces
	e.bySrc[src] = in
	if e.refuse[src] {
		in.drain, in.ended = true, true // its refusal was reported
		return in
	}
	if err := in.route.alloc(e, in); err != nil {
		e.fail(e.x.inErr(in, "receive buffer", err))
		in.drain, in.ended = true, true
	}
	return in
}

// allocHeld takes in's own buffer and a write hold on it, waited for:
// memory that MPI or a read writes from outside the streams, after
// whatever the pool's earlier use of the memory queued.
func (e *exchange) allocHeld(in *inMsg) error {
	x := e.x
	buf, err := x.a.Alloc(in.size, x.recvS)
	if err != nil {
		return err
	}
	h, err := buf.Hold(devalloc.Write)
	if err == nil {
		if err = h.Wait(); err != nil {
			_ = h.Release()
		}
	}
	if err != nil {
		return errors.Join(err, buf.Free())
	}
	in.buf, in.hold = buf, h
	return nil
}

// giveBack returns the chunk's memory that is not the allocator's: a ring
// slot, a window notice's buffer.
func (in *inMsg) giveBack(ch *inChunk) {
	if ch.slot != nil {
		ch.slot.put()
		ch.slot = nil
	}
	if ch.win != nil {
		_ = ch.win.Drop()
		ch.win = nil
	}
}

// releaseHold gives back the write hold on the message's buffer, once no
// receive into the message's memory is in flight.
func (in *inMsg) releaseHold() {
	if in.hold != nil && in.inFlight == 0 {
		_ = in.hold.Release()
		in.hold = nil
	}
}

func (x *Exchanger) inErr(in *inMsg, field string, err error) error {
	return fmt.Errorf("msg: message from rank %d tag %d: %s: %w", in.src, x.o.Tag, field, err)
}

// pieceName names piece i of a message in errors.
func (in *inMsg) pieceName(i int) string {
	if in.pieces > 1 {
		return fmt.Sprintf("MPI message %d of %d", i, in.pieces)
	}
	return "message"
}

// arrived takes a message matched by probe: the next piece of the message
// its source owes, or a stray.
func (e *exchange) arrived(m *cluster.Message) {
	x := e.x
	st := m.Status()
	s := st.Source
	if s < 0 || s >= x.size {
		// MPI names a rank of the communicator; anything else cannot be
		// told apart from memory corruption.
		e.fail(fmt.Errorf("msg: MPI matched a message from rank %d in a communicator of %d: %w", s, x.size, distbuf.ErrInvalid))
		e.discard(m, nil, -1)
		return
	}
	e.matchedFrom[s]++
	in := e.bySrc[s]
	if in == nil || in.matched == in.pieces {
		e.discard(m, nil, -1)
		e.stray(s, st.Bytes)
		return
	}
	i := int(in.matched)
	in.matched++
	e.expecting--
	if st.Tag != x.o.Tag {
		// Taken as the piece it stands in place of, so that the exchange
		// does not wait for that piece in vain.
		w := wireErr(ErrUnexpectedPeer, s, x.o.Tag, "tag", "%s came with MPI tag %d, the exchange uses %d; it was drained", in.pieceName(i), st.Tag, x.o.Tag)
		if in.drain {
			e.fail(w)
		} else if in.failed == nil {
			in.failed = w
		}
	}
	if in.drain {
		e.discard(m, in, -1)
		return
	}
	ch := &in.chunks[i]
	if st.Bytes > ch.n && in.failed == nil {
		in.failed = wireErr(ErrSizeMismatch, s, x.o.Tag, "message_size", "%s has %d bytes, %d were announced (%d in all); it was drained, nothing was written",
			in.pieceName(i), st.Bytes, ch.n, in.size)
	}
	if in.failed != nil {
		e.discard(m, in, i)
		return
	}
	e.receive(m, in, i)
}

// stray reports a message from a rank that owes this one nothing more in
// this exchange, once per rank; messages from a rank whose announcement
// was refused, or whose message was given up, are that error's business.
func (e *exchange) stray(s int, n int64) {
	if e.silent[s] || e.strayed[s] {
		return
	}
	e.strayed[s] = true
	announced := fmt.Sprintf("announced %d bytes", e.recvSize[s])
	if in := e.bySrc[s]; in == nil {
		announced = "announced nothing for this rank"
	}
	e.fail(wireErr(ErrUnexpectedPeer, s, e.x.o.Tag, "count", "rank %d %s in this exchange but sent a further MPI message of %d bytes; it was drained", s, announced, n))
}

// receive posts the receive of piece i of in, whose length does not exceed
// the piece's, into the memory its route gives it.
func (e *exchange) receive(m *cluster.Message, in *inMsg, i int) {
	x := e.x
	mem, rel, err := in.route.recvMem(e, in, i, m.Status().Bytes)
	if err != nil {
		in.failed = e.x.inErr(in, "receive", err)
		e.discard(m, in, i)
		return
	}
	r, err := m.Recv(mem)
	if err != nil {
		if rel != nil {
			_ = rel.Release() // nothing was posted
		}
		in.failed = e.x.inErr(in, "receive", err)
		e.discard(m, in, i)
		return
	}
	in.chunks[i].posted = true
	in.inFlight++
	if rel != nil {
		if err := r.Attach(rel); err != nil {
			in.failed = e.x.inErr(in, "receive", err)
		}
	}
	x.stats.MPIRecvs++
	e.q.track(r, schedOp{in: in, chunk: i})
}

// discard posts the receive of a matched message into scratch memory that
// is dropped. in and i name the piece it was, if it was one (i is -1 for a
// piece of a drained message, which has no records).
func (e *exchange) discard(m *cluster.Message, in *inMsg, i int) {
	x := e.x
	src := m.Status().Source
	if in != nil && i >= 0 {
		ch := &in.chunks[i]
		ch.posted, ch.discarded = true, true
	}
	r, err := m.Discard()
	x.stats.Drained++
	if err != nil {
		// The message stays matched and its sender's request pending: the
		// error says so, and the rank's exchange fails.
		e.fail(fmt.Errorf("msg: message from rank %d tag %d: drain: %w", src, x.o.Tag, err))
		if in != nil && i >= 0 {
			e.chunkDone(in, i, cluster.Status{}, err, true)
		}
		return
	}
	x.stats.MPIRecvs++
	e.q.track(r, schedOp{in: in, chunk: i, discard: true})
}

// chunkDone records the completion of piece i (discarded: a discard, not a
// receive into the message's memory) and lets the message's route process
// what it can.
func (e *exchange) chunkDone(in *inMsg, i int, st cluster.Status, err error, discarded bool) {
	ch := &in.chunks[i]
	ch.done, ch.got, ch.err = true, st.Bytes, err
	if !discarded {
		in.inFlight--
	}
	if in.ended {
		// Failed or given up: what it holds goes once nothing writes it.
		in.releaseHold()
		in.giveBack(ch)
		return
	}
	in.route.done(e, in, i)
}

// sizeError explains a piece that did not arrive as announced. An abort
// notice in the first piece is reported as such.
func (e *exchange) sizeError(in *inMsg, i int, head []byte) error {
	ch := &in.chunks[i]
	tag := e.x.o.Tag
	if ch.err != nil {
		return e.x.inErr(in, "receive", ch.err)
	}
	if i == 0 && ch.got == wire.AbortSize && len(head) >= wire.AbortSize {
		if h, _, err := wire.DecodeHeader(head[:wire.AbortSize], wire.AbortSize, in.src, tag, nil); err == nil && h.Aborted {
			if err := e.checkPeer(in, h); err != nil {
				return err
			}
			return wireErr(ErrPeerAborted, in.src, tag, "flags", "rank %d sent an abort notice in place of its %d-byte message (its own error says why)", in.src, in.size)
		}
	}
	return wireErr(ErrSizeMismatch, in.src, tag, "message_size", "%s has %d bytes, %d were announced (%d in all)", in.pieceName(i), ch.got, ch.n, in.size)
}

// finishDirect decodes a message that lies in its buffer, every piece
// received straight into it (or read there: checkPieces false, its one
// piece was a notice, checked before the read).
func (e *exchange) finishDirect(in *inMsg, checkPieces bool) {
	x := e.x
	if in.failed != nil {
		e.endIn(in)
		return
	}
	device := !in.buf.Location().HostAccessible()
	in.failed = func() error {
		head := func(n int64) ([]byte, error) {
			if !device {
				mem, err := in.buf.Bytes()
				if err != nil {
					return nil, err
				}
				return mem[in.base:][:n], nil
			}
			var out []byte
			err := readDevice(x.a, x.recvS, in.buf, in.base, n, func(b []byte) error { out = append(out, b...); return nil })
			return out, err
		}
		for i := range in.chunks {
			if ch := &in.chunks[i]; checkPieces && (ch.err != nil || ch.got != ch.n) {
				var b []byte
				if i == 0 && ch.err == nil {
					b, _ = head(max(min(ch.got, ch.n), 0))
				}
				return e.sizeError(in, i, b)
			}
		}
		man, err := head(min(in.size, headerPeek))
		if err != nil {
			return e.x.inErr(in, "manifest", err)
		}
		if p, ok := wire.ManifestSize(man); ok && p > uint64(len(man)) && p <= uint64(in.size) {
			if man, err = head(int64(p)); err != nil {
				return e.x.inErr(in, "manifest", err)
			}
		}
		plan, p, err := e.accept(in, man, uint64(in.size))
		if err != nil {
			return err
		}
		if h := in.header; h.HasPayloadChecksum {
			var sum uint32
			if !device {
				mem, _ := head(in.size)
				sum = wire.Checksum(mem[p:])
			} else if err := readDevice(x.a, x.recvS, in.buf, in.base+int64(p), in.size-int64(p), func(b []byte) error { sum = wire.Checksum(b); return nil }); err != nil {
				return e.x.inErr(in, "payload_checksum", err)
			}
			if sum != h.PayloadChecksum {
				return wireErr(ErrChecksum, in.src, x.o.Tag, "payload_checksum", "computed %#08x, header says %#08x", sum, h.PayloadChecksum)
			}
		}
		in.plan = plan
		return nil
	}()
	if in.failed != nil {
		e.endIn(in)
		return
	}
	e.wrapResult(in, in.plan, int64(in.p))
}

// endIn ends a message that failed, or that the exchange stops waiting
// for: its error is reported, and what it holds goes: pinned chunks and
// the buffer are freed now (devalloc defers a free while a posted
// receive's hold is on the memory), the write hold once no receive into
// the message is in flight.
func (e *exchange) endIn(in *inMsg) {
	if in.ended {
		return
	}
	in.ended = true
	e.fail(in.failed)
	for i := range in.chunks {
		ch := &in.chunks[i]
		if !ch.posted || ch.done || ch.discarded {
			in.giveBack(ch) // what a receive still writes goes back once it completes
		}
		ch.posted = true // a piece not posted yet never will be
		if ch.buf != nil {
			_ = ch.buf.Free()
			ch.buf = nil
		}
	}
	in.releaseHold()
	if in.buf != nil && in.joint == nil {
		_ = in.buf.Free() // a joint buffer goes with the exchange's reference
	}
}

// checkPeer compares the header's addressing with what the receiver expects.
func (e *exchange) checkPeer(in *inMsg, h wire.Header) error {
	x, tag := e.x, e.x.o.Tag
	switch {
	case int(h.Source) != in.src:
		return wireErr(ErrUnexpectedPeer, in.src, tag, "source", "header names rank %d as the sender", h.Source)
	case int(h.Dest) != x.rank:
		return wireErr(ErrUnexpectedPeer, in.src, tag, "dest", "header names rank %d as the receiver, this is rank %d", h.Dest, x.rank)
	case int(h.Tag) != tag:
		return wireErr(ErrUnexpectedPeer, in.src, tag, "tag", "header says tag %d", h.Tag)
	case h.Epoch != e.epoch:
		return wireErr(ErrUnexpectedPeer, in.src, tag, "epoch", "header says exchange %d, this is exchange %d", h.Epoch, e.epoch)
	}
	return nil
}

// accept validates a received manifest (the first bytes of a message of
// msgLen bytes) and returns the plan of its payload and where the payload
// starts. With a learned pattern the entries are compared with the learned
// ones instead of being decoded again.
func (e *exchange) accept(in *inMsg, man []byte, msgLen uint64) (*packing.Plan, uint64, error) {
	tag := e.x.o.Tag
	known, learned := e.x.layouts.expected(in.src, e.pat)
	h, matched, err := wire.DecodeHeader(man, msgLen, in.src, tag, known.wireLayout())
	if err != nil {
		return nil, 0, err
	}
	if err := e.checkPeer(in, h); err != nil {
		return nil, 0, err
	}
	if h.Aborted {
		return nil, 0, wireErr(ErrPeerAborted, in.src, tag, "flags", "rank %d sent an abort notice (its own error says why)", in.src)
	}
	in.header, in.p = h, h.PayloadOffset
	switch {
	case matched:
		// The same layout (byte-equal entries) as the pattern's or as the
		// last message from this source, a sweep repeating itself: its
		// plan, checked when it was built, serves again.
		in.learned = known
		return known.plan, h.PayloadOffset, nil
	case learned:
		return nil, 0, wireErr(ErrPatternMismatch, in.src, tag, "manifest", "the blocks differ from those the pattern learned")
	}
	if in.learned, err = e.x.layouts.decode(h, man, in.src, tag); err != nil {
		return nil, 0, err
	}
	return in.learned.plan, h.PayloadOffset, nil
}

// wrapResult turns the received buffer into the coalesced buffer of its
// blocks, in place.
func (e *exchange) wrapResult(in *inMsg, plan *packing.Plan, p int64) {
	var c *packing.Coalesced
	var err error
	if in.joint != nil {
		if err = in.joint.Acquire(); err == nil {
			if c, err = packing.Wrap(in.joint.Buffer(), in.base+p, plan, 0, in.joint.Release); err != nil {
				_ = in.joint.Release()
			}
		}
	} else {
		c, err = packing.Wrap(in.buf, in.base+p, plan, 0, nil)
	}
	if err != nil {
		in.failed = e.x.inErr(in, "payload", err)
		e.endIn(in)
		return
	}
	in.ended = true
	in.result = c
}
