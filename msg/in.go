package msg

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
)

// headerPeek is how much of a message a device receiver reads back first:
// the whole manifest of up to 2040 blocks, so that one copy usually does.
const headerPeek = 64 << 10

// inMsg is one logical message this rank receives in an exchange.
type inMsg struct {
	src  int
	step int
	size int64 // announced bytes
	// How it arrives: straight into buf (host memory, or device memory
	// with a CUDA-aware MPI), through pinned chunks copied into buf
	// (staged), or nowhere (drain: this rank could not take it).
	staged, device, drain, local bool

	buf    *devalloc.Buffer
	share  *sharedRelease // direct: the buffer's write hold, shared by the chunks
	shared sharedRelease  // what share points to
	chunks []inChunk
	next   int // staged: the next chunk to process, in order

	p       uint64 // payload offset, once the header is read
	man     []byte // staged: the manifest gathered across chunks, when longer than the first
	plan    *packing.Plan
	crc     uint32
	header  Header
	failed  error
	result  *packing.Coalesced
	learned *learnedIn
}

type inChunk struct {
	off, n int64
	mem    cluster.Memory
	region bufRegion        // direct, when the chunk is not the whole buffer: what mem points to
	buf    *devalloc.Buffer // staged: the pinned chunk
	hold   *devalloc.Hold   // staged: its write hold
	pin    *cluster.PinnedBytes
	posted bool
	done   bool
	got    int64
	err    error
}

// newRecv sets up the receive of size bytes from src: one pooled buffer, and
// for staging one pinned buffer per chunk. When memory cannot be had the
// message is drained (received into nothing) so the sender is not left
// waiting, and the failure is reported.
func (e *exchange) newRecv(src, step int, size int64) *inMsg {
	x := e.x
	in := e.newIn()
	in.src, in.step, in.size = src, step, size
	in.chunks = resize(in.chunks, chunkCount(size, x.chunk))
	for i := range in.chunks {
		sp := chunkAt(size, x.chunk, i)
		in.chunks[i].off, in.chunks[i].n = sp.off, sp.n
	}
	x.stats.MPIRecvs += int64(len(in.chunks))
	err := e.allocIn(in)
	if err != nil {
		// Receive the message anyway, into Go memory it is then dropped
		// with, so that the sender completes. (A receive shorter than the
		// message would do in MPI's terms, but some MPIs still copy the
		// whole message when it is large.)
		e.fail(e.inErr(in, "receive buffer", err))
		in.drain = true
		for i := range in.chunks {
			pin := cluster.PinBytes(make([]byte, in.chunks[i].n))
			in.chunks[i].mem, in.chunks[i].pin = pin, pin
		}
	}
	return in
}

func (e *exchange) allocIn(in *inMsg) (err error) {
	x := e.x
	if in.buf, err = x.a.Alloc(in.size, x.recvS); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			for i := range in.chunks {
				ch := &in.chunks[i]
				if ch.hold != nil {
					_ = ch.hold.Release()
				}
				if ch.buf != nil {
					_ = ch.buf.Free()
				}
				ch.hold, ch.buf = nil, nil
			}
			_ = in.buf.Free()
			in.buf = nil
		}
	}()
	loc := in.buf.Location()
	if loc.HostAccessible() || e.aware {
		in.device = !loc.HostAccessible()
		// MPI writes from outside the streams: wait for the allocation to
		// be usable (the pool may hand out memory whose earlier uses are
		// still queued on the stream).
		h, err := in.buf.Hold(devalloc.Write)
		if err != nil {
			return err
		}
		if err := h.Wait(); err != nil {
			_ = h.Release()
			return err
		}
		in.shared.init(h, len(in.chunks))
		in.share = &in.shared
		for i := range in.chunks {
			ch := &in.chunks[i]
			if ch.off == 0 && ch.n == in.buf.Size() {
				ch.mem = in.buf // the whole buffer: the usual single chunk
				continue
			}
			ch.region = bufRegion{in.buf, ch.off, ch.n}
			ch.mem = &ch.region
		}
		return nil
	}
	in.staged = true
	for i := range in.chunks {
		ch := &in.chunks[i]
		if ch.buf, err = x.a.AllocPinned(ch.n, x.recvS); err != nil {
			return err
		}
		// No Wait: a pinned block leaves the pool only once every earlier
		// use of it has completed, and the allocation enqueues no work.
		if ch.hold, err = ch.buf.Hold(devalloc.Write); err != nil {
			return err
		}
		ch.mem = ch.buf
	}
	return nil
}

// releaseChunks frees what chunks never posted hold (their pinned buffer,
// hold, pin, share of the buffer hold): called when the exchange stops
// before posting them.
func (in *inMsg) releaseChunks() {
	for i := range in.chunks {
		ch := &in.chunks[i]
		if ch.posted {
			continue
		}
		ch.posted = true
		if ch.hold != nil {
			_ = ch.hold.Release()
		}
		if ch.buf != nil {
			_ = ch.buf.Free()
		}
		if ch.pin != nil {
			_ = ch.pin.Release()
		}
		if in.share != nil {
			_ = in.share.Release()
		}
	}
}

func (e *exchange) inErr(in *inMsg, field string, err error) error {
	return fmt.Errorf("msg: message from rank %d tag %d: %s: %w", in.src, e.x.o.Tag, field, err)
}

// attach is what the request of chunk i releases when it completes.
func (in *inMsg) attach(i int) cluster.Releaser {
	ch := &in.chunks[i]
	switch {
	case ch.pin != nil:
		return ch.pin
	case ch.hold != nil:
		return ch.hold
	}
	return in.share
}

// chunkDone records the completion of chunk i and processes what it can.
func (e *exchange) chunkDone(in *inMsg, i int, st cluster.Status, err error) {
	ch := &in.chunks[i]
	ch.done, ch.got, ch.err = true, st.Bytes, err
	if in.drain {
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
	for i := range in.chunks {
		if !in.chunks[i].done {
			return
		}
	}
	e.finishDirect(in)
}

// sizeError explains a chunk that did not arrive as announced. An abort
// notice in the first chunk is reported as such.
func (e *exchange) sizeError(in *inMsg, i int, head []byte) error {
	ch := &in.chunks[i]
	tag := e.x.o.Tag
	if i == 0 && ch.err == nil && ch.got == AbortSize && len(head) >= AbortSize {
		if h, _, err := decodeHeader(head[:AbortSize], AbortSize, in.src, tag, nil); err == nil && h.Aborted {
			if err := e.checkPeer(in, h); err != nil {
				return err
			}
			return wireErr(ErrPeerAborted, in.src, tag, "flags", "rank %d sent an abort notice in place of its %d-byte message (its own error says why)", in.src, in.size)
		}
	}
	what := "message"
	if len(in.chunks) > 1 {
		what = fmt.Sprintf("chunk %d of %d", i, len(in.chunks))
	}
	if ch.err != nil {
		if errors.Is(ch.err, cluster.ErrTruncate) {
			return wireErr(ErrSizeMismatch, in.src, tag, "message_size", "%s longer than the %d bytes announced (%d in all): %v", what, ch.n, in.size, ch.err)
		}
		return e.inErr(in, "receive", ch.err)
	}
	return wireErr(ErrSizeMismatch, in.src, tag, "message_size", "%s has %d bytes, %d were announced (%d in all)", what, ch.got, ch.n, in.size)
}

// processStaged handles chunk i of a staged message, in order: the header
// and manifest, the payload checksum, and the copy into the device buffer;
// then the pinned chunk goes back to the pool.
func (e *exchange) processStaged(in *inMsg, i int) {
	x := e.x
	ch := &in.chunks[i]
	defer func() { _ = ch.buf.Free() }()
	if in.failed != nil {
		return
	}
	mem, err := ch.buf.Bytes()
	if err != nil {
		in.failed = e.inErr(in, "staging", err)
		return
	}
	if ch.err != nil || ch.got != ch.n {
		in.failed = e.sizeError(in, i, mem[:min(ch.got, ch.n)])
		return
	}
	if i == 0 {
		p, _ := ManifestSize(mem) // the first chunk holds at least the header
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
		in.crc = crcUpdate(in.crc, mem[max(p-ch.off, 0):])
	}
	if err := x.recvS.Copy(in.buf, ch.off, ch.buf, 0, ch.n); err != nil {
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
		e.fail(in.failed)
		_ = in.buf.Free()
		return
	}
	e.wrapResult(in, in.plan, int64(in.p))
}

// finishDirect decodes a message received straight into its buffer.
func (e *exchange) finishDirect(in *inMsg) {
	x := e.x
	err := func() error {
		head := func(n int64) ([]byte, error) {
			if !in.device {
				mem, err := in.buf.Bytes()
				if err != nil {
					return nil, err
				}
				return mem[:n], nil
			}
			var out []byte
			err := readDevice(x.a, x.recvS, in.buf, 0, n, func(b []byte) error { out = append(out, b...); return nil })
			return out, err
		}
		for i := range in.chunks {
			if ch := &in.chunks[i]; ch.err != nil || ch.got != ch.n {
				var b []byte
				if i == 0 && ch.err == nil {
					b, _ = head(min(ch.got, ch.n))
				}
				return e.sizeError(in, i, b)
			}
		}
		man, err := head(min(in.size, headerPeek))
		if err != nil {
			return e.inErr(in, "manifest", err)
		}
		if p, ok := ManifestSize(man); ok && p > uint64(len(man)) && p <= uint64(in.size) {
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
				sum = Checksum(mem[p:])
			} else if err := readDevice(x.a, x.recvS, in.buf, int64(p), in.size-int64(p), func(b []byte) error { sum = Checksum(b); return nil }); err != nil {
				return e.inErr(in, "payload_checksum", err)
			}
			if sum != h.PayloadChecksum {
				return wireErr(ErrChecksum, in.src, x.o.Tag, "payload_checksum", "computed %#08x, header says %#08x", sum, h.PayloadChecksum)
			}
		}
		in.plan = plan
		return nil
	}()
	if err != nil {
		e.fail(err)
		_ = in.buf.Free()
		return
	}
	e.wrapResult(in, in.plan, int64(in.p))
}

// hdr is the accepted header of the message.
func (in *inMsg) hdr() Header { return in.header }

// checkPeer compares the header's addressing with what the receiver expects.
func (e *exchange) checkPeer(in *inMsg, h Header) error {
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
	// The layout this message should, or likely does, have: the pattern's,
	// else the last one from this source.
	known := e.x.lastIn[in.src]
	learned := e.pat != nil && e.pat.learned
	if learned {
		known = e.pat.recv[in.src]
	}
	h, matched, err := decodeHeader(man, msgLen, in.src, tag, known)
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
	encoded := man[HeaderSize : HeaderSize+int(h.Count)*EntrySize]
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
	// Decode and check the entries straight into packing's form, in a
	// scratch slice the exchanger keeps (FromManifest keeps none of it).
	c := newEntryCheck(h, in.src, tag)
	if err := c.header(); err != nil {
		return nil, 0, err
	}
	pe := e.x.scratch[:0]
	for i := range int(h.Count) {
		en, err := entryAt(man, i, in.src, tag)
		if err == nil {
			err = c.check(i, en)
		}
		if err != nil {
			return nil, 0, err
		}
		pe = append(pe, packing.Entry{ID: en.ID, DType: packing.DType(en.DType), Rows: int(en.Rows), Cols: int(en.Cols), Offset: int64(en.Offset)})
	}
	e.x.scratch = pe[:0]
	if !c.increasing {
		if i := firstDuplicate(len(pe), func(i int) uint64 { return pe[i].ID }); i >= 0 {
			return nil, 0, c.duplicate(i, pe[i].ID)
		}
	}
	plan, err := packing.FromManifest(pe, int64(h.PayloadLen))
	if err != nil {
		return nil, 0, wireErr(ErrMalformed, in.src, tag, "entries", "%v", err)
	}
	in.learned = newLearnedIn(h, encoded, plan)
	e.x.lastIn[in.src] = in.learned
	return plan, h.PayloadOffset, nil
}

// wrapResult turns the received buffer into the coalesced buffer of its
// blocks, in place.
func (e *exchange) wrapResult(in *inMsg, plan *packing.Plan, p int64) {
	c, err := packing.WrapAt(in.buf, p, plan, 0)
	if err != nil {
		e.fail(e.inErr(in, "payload", err))
		_ = in.buf.Free()
		return
	}
	in.result = c
}
