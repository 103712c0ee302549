package msg

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
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
// a piece of the announced length into its place, a shorter one there too
// (and rejected), a longer one, or any piece of a message that already
// failed or that this rank has no buffer for, into scratch memory that is
// dropped.
type inMsg struct {
	src     int
	step    int
	size    int64 // announced bytes
	pieces  int64 // MPI messages it travels as
	matched int64 // pieces matched so far
	// How it arrives: straight into buf (host memory, or device memory
	// with a CUDA-aware MPI), through pinned chunks copied into buf
	// (staged), or nowhere (drain: this rank has no buffer for it, and
	// every piece is discarded).
	staged, device, drain, local bool
	// ipc: it lies in the sender's window and its one piece is the notice.
	ipc bool
	// reads: it lies in the sender's memory, to be read once its one
	// piece, the read notice (in notice), has arrived.
	reads  bool
	notice []byte
	// ended: the message became a result or its buffer was freed, and its
	// error, if any, was reported.
	ended bool

	buf      *devalloc.Buffer
	base     int64          // where the message starts in buf: 0 but in canary tests and in joint
	joint    *refbuf.Shared // buf is the exchange's joint buffer (allocJoint), not the message's own
	share    *sharedRelease // direct: the buffer's write hold, one share per piece
	shared   sharedRelease  // what share points to
	chunks   []inChunk      // by piece; none while draining
	next     int            // staged: the next chunk to process, in order
	finished int64          // direct: pieces whose receive has completed

	p       uint64 // payload offset, once the header is read
	man     []byte // staged: the manifest gathered across chunks, when longer than the first
	plan    *packing.Plan
	crc     uint32
	header  wire.Header
	failed  error // the first thing wrong with the message, reported when it ends
	result  *packing.Coalesced
	learned *learnedIn
}

type inChunk struct {
	off, n int64
	mem    cluster.Memory
	region bufRegion        // direct: what mem points to
	buf    *devalloc.Buffer // staged: the pinned chunk
	hold   *devalloc.Hold   // staged: its write hold
	posted bool             // its receive (or discard) was posted, or it never will be
	// discarded: the piece went to scratch memory, not to this chunk.
	discarded bool
	done      bool
	got       int64
	err       error
}

// newRecv sets up the receive of size bytes from src: one pooled buffer,
// and a record per piece. When the buffer cannot be had the message is
// drained (every piece discarded as it arrives) so the sender is not left
// waiting, and the failure is reported.
func (e *exchange) newRecv(src, step int, size int64) *inMsg {
	x := e.x
	in := e.newIn()
	in.src, in.step, in.size = src, step, size
	in.pieces = int64(x.pieceCount(src, size))
	in.ipc, in.reads = x.ipcPeer(src), x.readPeer(src)
	e.expecting += in.pieces
	e.bySrc[src] = in
	if e.refuse[src] {
		in.drain, in.ended = true, true // its refusal was reported
		return in
	}
	if err := e.allocIn(in); err != nil {
		e.fail(e.inErr(in, "receive buffer", err))
		in.drain, in.ended = true, true
	}
	return in
}

// jointAlign places each message of a joint receive buffer (canaries
// included), so that the next begins on an aligned boundary.
const jointAlign = 256

// allocJoint takes one receive buffer for every message that comes through
// a node-local window, when there are several: one allocation and, once
// every result is freed, one free for all those peers instead of one each.
// Each message's result shares the buffer (internal/refbuf). When the
// buffer cannot be had, each message gets its own. Canary tests' guards
// surround each message in it, as they surround a buffer of its own.
func (e *exchange) allocJoint(recvSize []int64) {
	x := e.x
	e.joint = nil
	for s := range e.jointOff {
		e.jointOff[s] = -1
	}
	if x.ipc == nil {
		return
	}
	c := x.hooks.canary // test guards around each message
	var total int64
	count := 0
	for s := range x.size {
		if s == x.rank || recvSize[s] <= 0 || e.refuse[s] || !x.ipcPeer(s) {
			continue
		}
		room := (recvSize[s] + 2*c + jointAlign - 1) / jointAlign * jointAlign
		if recvSize[s] > packing.MaxBytes || total > packing.MaxBytes-room {
			return
		}
		e.jointOff[s] = total + c
		total += room
		count++
	}
	if count < 2 {
		return
	}
	buf, err := x.a.Alloc(total, x.recvS)
	if err != nil {
		return // each message its own, and its own error
	}
	if c > 0 {
		for s, off := range e.jointOff {
			if off >= 0 {
				if err := e.fillGuard(buf, off, recvSize[s]); err != nil {
					_ = buf.Free()
					return
				}
			}
		}
	}
	e.joint, _ = refbuf.New(buf)
}

// allocIn takes the message's buffer (and, unless it is staged, a write
// hold on it for MPI) and sizes its piece records, in that order: the
// records are sized from the announced length only once that much memory
// was really had.
func (e *exchange) allocIn(in *inMsg) error {
	x := e.x
	if in.ipc && e.joint != nil && e.jointOff[in.src] >= 0 {
		// Its place in the joint buffer; the copy from the window writes
		// it in the buffer's ledger order, as for a buffer of its own.
		in.buf, in.base, in.joint = e.joint.Buffer(), e.jointOff[in.src], e.joint
		in.staged, in.device = false, true
		in.chunks = resize(in.chunks, 1)
		in.chunks[0] = inChunk{n: ipcHead + in.size}
		return nil
	}
	c := x.hooks.canary
	buf, err := x.a.Alloc(in.size+2*c, x.recvS)
	if err != nil {
		return err
	}
	if c > 0 {
		if err := e.fillGuard(buf, c, in.size); err != nil {
			return errors.Join(err, buf.Free())
		}
	}
	in.base = c
	loc := buf.Location()
	in.staged = !loc.HostAccessible() && !e.aware
	if in.ipc {
		// MPI brings only the notice, into pinned memory of its own; the
		// copy from the window writes the buffer in its ledger's order.
		in.staged, in.device = false, true
		in.buf = buf
		in.chunks = resize(in.chunks, 1)
		in.chunks[0] = inChunk{n: ipcHead + in.size}
		return nil
	}
	if !in.staged {
		in.device = !loc.HostAccessible()
		// MPI writes from outside the streams: wait for the allocation to
		// be usable (the pool may hand out memory whose earlier uses are
		// still queued on the stream).
		h, err := buf.Hold(devalloc.Write)
		if err == nil {
			if err = h.Wait(); err != nil {
				_ = h.Release()
			}
		}
		if err != nil {
			return errors.Join(err, buf.Free())
		}
		in.shared.init(h, int(in.pieces))
		in.share = &in.shared
	}
	in.buf = buf
	in.chunks = resize(in.chunks, int(in.pieces))
	if in.reads {
		// Its one MPI message is the notice, or an abort notice in its
		// place: nothing longer is received.
		in.chunks[0] = inChunk{n: wire.AbortSize}
		return nil
	}
	for i := range in.chunks {
		sp := chunkAt(in.size, x.chunk, i)
		in.chunks[i].off, in.chunks[i].n = sp.off, sp.n
	}
	return nil
}

func (e *exchange) inErr(in *inMsg, field string, err error) error {
	return fmt.Errorf("msg: message from rank %d tag %d: %s: %w", in.src, e.x.o.Tag, field, err)
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
// the piece's: into its place in the buffer, or into a pinned chunk of its
// own when staged.
func (e *exchange) receive(m *cluster.Message, in *inMsg, i int) {
	x := e.x
	ch := &in.chunks[i]
	var rel cluster.Releaser
	if in.ipc {
		// The notice: as long as MPI says, at least one byte.
		cb, err := x.ipc.takeNotice(x, in.src, max(m.Status().Bytes, 1))
		if err == nil {
			if ch.hold, err = cb.Hold(devalloc.Write); err != nil {
				_ = cb.Free()
			}
		}
		if err != nil {
			in.failed = e.inErr(in, "notice", err)
			e.discard(m, in, i)
			return
		}
		ch.buf, ch.mem, rel = cb, cluster.Sub(cb, 0, m.Status().Bytes), ch.hold
	} else if in.reads {
		// The notice, in Go memory of its own: the buffer's write hold
		// stays with the message until it is read.
		in.notice = make([]byte, max(m.Status().Bytes, 1))
		pin := cluster.PinBytes(in.notice)
		ch.mem, rel = pin, pin
	} else if in.staged {
		c := x.hooks.canary
		cb, err := x.a.AllocPinned(ch.n+2*c, x.recvS)
		if err == nil && c > 0 {
			if err = e.fillGuard(cb, x.hooks.canary, ch.n); err != nil {
				_ = cb.Free()
			}
		}
		if err == nil {
			// No Wait: a pinned block leaves the pool only once every
			// earlier use of it has completed, and the allocation enqueues
			// no work.
			if ch.hold, err = cb.Hold(devalloc.Write); err != nil {
				_ = cb.Free()
			}
		}
		if err != nil {
			in.failed = e.inErr(in, "staging", err)
			e.discard(m, in, i)
			return
		}
		ch.buf, ch.mem, rel = cb, cb, ch.hold
		if c > 0 {
			ch.mem = cluster.Sub(cb, c, ch.n)
		}
	} else {
		ch.region = bufRegion{in.buf, in.base + ch.off, ch.n}
		ch.mem, rel = &ch.region, in.share
	}
	r, err := m.Recv(ch.mem)
	if err != nil {
		if in.staged || in.ipc {
			_ = ch.hold.Release()
			_ = ch.buf.Free()
			ch.hold, ch.buf, ch.mem = nil, nil, nil
		}
		if in.reads {
			_ = rel.Release() // the notice's pin
		}
		in.failed = e.inErr(in, "receive", err)
		e.discard(m, in, i) // gives the piece's share of a direct buffer's hold back
		return
	}
	ch.posted = true
	if err := r.Attach(rel); err != nil {
		in.failed = e.inErr(in, "receive", err)
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
		if in.share != nil {
			_ = in.share.Release() // this piece never touches the buffer
		}
	}
	r, err := m.Discard()
	x.stats.Drained++
	if err != nil {
		// The message stays matched and its sender's request pending: the
		// error says so, and the rank's exchange fails.
		e.fail(fmt.Errorf("msg: message from rank %d tag %d: drain: %w", src, x.o.Tag, err))
		if in != nil && i >= 0 {
			e.chunkDone(in, i, cluster.Status{}, err)
		}
		return
	}
	x.stats.MPIRecvs++
	e.q.track(r, schedOp{in: in, chunk: i, discard: true})
}

// chunkDone records the completion of piece i and processes what it can.
func (e *exchange) chunkDone(in *inMsg, i int, st cluster.Status, err error) {
	ch := &in.chunks[i]
	ch.done, ch.got, ch.err = true, st.Bytes, err
	if in.ipc {
		e.finishIPC(in) // the request released the notice's hold as it completed
		return
	}
	if in.reads {
		e.finishRead(in)
		return
	}
	if in.staged {
		for in.next < len(in.chunks) && in.chunks[in.next].done {
			e.processStaged(in, in.next)
			in.next++
		}
		if in.next == len(in.chunks) {
			e.finishStaged(in)
		}
		return
	}
	if in.finished++; in.finished == in.pieces {
		e.finishDirect(in)
	}
}

// sizeError explains a piece that did not arrive as announced. An abort
// notice in the first piece is reported as such.
func (e *exchange) sizeError(in *inMsg, i int, head []byte) error {
	ch := &in.chunks[i]
	tag := e.x.o.Tag
	if ch.err != nil {
		return e.inErr(in, "receive", ch.err)
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

// processStaged handles chunk i of a staged message, in order: the header
// and manifest, the payload checksum, and the copy into the device buffer;
// then the pinned chunk goes back to the pool.
func (e *exchange) processStaged(in *inMsg, i int) {
	x := e.x
	ch := &in.chunks[i]
	defer func() {
		if ch.buf != nil {
			_ = ch.buf.Free()
			ch.buf = nil
		}
	}()
	if ch.buf != nil && x.hooks.canary > 0 {
		e.checkGuard(ch.buf, e.x.hooks.canary, ch.n, fmt.Sprintf("pinned chunk %d of the message from rank %d", i, in.src))
	}
	if in.failed != nil {
		return
	}
	if ch.discarded {
		in.failed = e.inErr(in, "receive", fmt.Errorf("%s was drained: %w", in.pieceName(i), distbuf.ErrInvalid))
		return
	}
	mem, err := ch.buf.Bytes()
	if err != nil {
		in.failed = e.inErr(in, "staging", err)
		return
	}
	mem = mem[x.hooks.canary:][:ch.n]
	if ch.err != nil || ch.got != ch.n {
		in.failed = e.sizeError(in, i, mem[:max(min(ch.got, ch.n), 0)])
		return
	}
	if i == 0 {
		p, _ := wire.ManifestSize(mem) // the first chunk holds at least the header
		in.p = p
		if p > uint64(ch.n) && p <= uint64(in.size) {
			in.man = make([]byte, 0, p)
		}
	}
	p := int64(in.p)
	if ch.off < p && in.man != nil {
		in.man = append(in.man, mem[:min(ch.n, p-ch.off)]...)
	}
	if ch.off < p && in.plan == nil {
		man := mem
		if in.man != nil {
			man = in.man
		}
		if in.man == nil || int64(len(in.man)) == p {
			if in.plan, _, err = e.accept(in, man, uint64(in.size)); err != nil {
				in.failed = err
				return
			}
		}
	}
	if ch.off+ch.n > p {
		in.crc = wire.UpdateChecksum(in.crc, mem[max(p-ch.off, 0):])
	}
	if err := x.recvS.Copy(in.buf, in.base+ch.off, ch.buf, x.hooks.canary, ch.n); err != nil {
		in.failed = e.inErr(in, "staging", err)
		return
	}
	x.stats.BytesStaged += ch.n
}

func (e *exchange) finishStaged(in *inMsg) {
	if in.failed == nil && in.plan == nil {
		in.failed = wireErr(ErrMalformed, in.src, e.x.o.Tag, "block_count", "the manifest never completed")
	}
	if in.failed == nil && in.hdr().HasPayloadChecksum && in.crc != in.hdr().PayloadChecksum {
		in.failed = wireErr(ErrChecksum, in.src, e.x.o.Tag, "payload_checksum", "computed %#08x, header says %#08x", in.crc, in.hdr().PayloadChecksum)
	}
	if in.failed != nil {
		e.endIn(in)
		return
	}
	e.wrapResult(in, in.plan, int64(in.p))
}

// finishDirect decodes a message received straight into its buffer.
func (e *exchange) finishDirect(in *inMsg) {
	x := e.x
	if in.failed != nil {
		e.endIn(in)
		return
	}
	in.failed = func() error {
		head := func(n int64) ([]byte, error) {
			if !in.device {
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
		// A read message's one piece was its notice, checked before the read.
		for i := range in.chunks {
			if ch := &in.chunks[i]; !in.reads && (ch.err != nil || ch.got != ch.n) {
				var b []byte
				if i == 0 && ch.err == nil {
					b, _ = head(max(min(ch.got, ch.n), 0))
				}
				return e.sizeError(in, i, b)
			}
		}
		man, err := head(min(in.size, headerPeek))
		if err != nil {
			return e.inErr(in, "manifest", err)
		}
		if p, ok := wire.ManifestSize(man); ok && p > uint64(len(man)) && p <= uint64(in.size) {
			if man, err = head(int64(p)); err != nil {
				return e.inErr(in, "manifest", err)
			}
		}
		plan, p, err := e.accept(in, man, uint64(in.size))
		if err != nil {
			return err
		}
		if h := in.hdr(); h.HasPayloadChecksum {
			var sum uint32
			if !in.device {
				mem, _ := head(in.size)
				sum = wire.Checksum(mem[p:])
			} else if err := readDevice(x.a, x.recvS, in.buf, in.base+int64(p), in.size-int64(p), func(b []byte) error { sum = wire.Checksum(b); return nil }); err != nil {
				return e.inErr(in, "payload_checksum", err)
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
// for: its error is reported, the records of pieces never posted give back
// what they hold, and its buffer is freed (deferred by devalloc while a
// posted receive still holds it).
func (e *exchange) endIn(in *inMsg) {
	if in.ended {
		return
	}
	in.ended = true
	e.fail(in.failed)
	canary := e.x.hooks.canary > 0
	for i := range in.chunks {
		ch := &in.chunks[i]
		if canary && ch.buf != nil && ch.done {
			e.checkGuard(ch.buf, e.x.hooks.canary, ch.n, fmt.Sprintf("pinned chunk %d of the message from rank %d", i, in.src))
		}
		if !ch.posted {
			ch.posted = true
			if in.share != nil {
				_ = in.share.Release()
			}
		}
		if ch.buf != nil {
			// A pinned chunk never processed: freed now, or, while its
			// receive is pending, once the hold that request keeps is
			// released.
			_ = ch.buf.Free()
			ch.buf = nil
		}
	}
	if in.buf != nil {
		if canary && in.receivesDone() {
			e.checkGuard(in.buf, in.base, in.size, fmt.Sprintf("the receive buffer of the message from rank %d", in.src))
		}
		if in.joint == nil {
			_ = in.buf.Free() // a joint buffer goes with the exchange's reference
		}
	}
}

// receivesDone reports whether no receive into the message's memory is
// still in flight.
func (in *inMsg) receivesDone() bool {
	for i := range in.chunks {
		if ch := &in.chunks[i]; ch.posted && !ch.discarded && !ch.done {
			return false
		}
	}
	return true
}

// hdr is the accepted header of the message.
func (in *inMsg) hdr() wire.Header { return in.header }

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
	if e.x.hooks.canary > 0 && !in.local {
		e.checkGuard(in.buf, in.base, in.size, fmt.Sprintf("the receive buffer of the message from rank %d", in.src))
	}
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
		in.failed = e.inErr(in, "payload", err)
		e.endIn(in)
		return
	}
	in.ended = true
	in.result = c
}

// canaryByte fills the canaries of canary tests.
const canaryByte = 0xCA

// fillGuard fills the canary bytes on both sides of the n bytes that start
// at byte base of buf (base is at least the canary size).
func (e *exchange) fillGuard(buf *devalloc.Buffer, base, n int64) error {
	c := e.x.hooks.canary
	guard := make([]byte, c)
	for i := range guard {
		guard[i] = canaryByte
	}
	return errors.Join(e.writeAt(buf, base-c, guard), e.writeAt(buf, base+n, guard))
}

// checkGuard reports, to the canaryHit hook, canary bytes of buf (see
// fillGuard) that are no longer what was written there.
func (e *exchange) checkGuard(buf *devalloc.Buffer, base, n int64, what string) {
	x := e.x
	c := x.hooks.canary
	check := func(side string) func(b []byte) error {
		return func(b []byte) error {
			for i, v := range b {
				if v != canaryByte {
					x.hooks.canaryHit(fmt.Sprintf("%s: canary byte %d %s the region was overwritten", what, i, side))
					break
				}
			}
			return nil
		}
	}
	err := errors.Join(readAt(x.a, x.recvS, buf, base-c, c, check("before")), readAt(x.a, x.recvS, buf, base+n, c, check("after")))
	if err != nil {
		x.hooks.canaryHit(fmt.Sprintf("%s: canaries unreadable: %v", what, err))
	}
}
