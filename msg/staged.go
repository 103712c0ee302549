package msg

import (
	"fmt"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/wire"
)

// Staging: device memory that MPI cannot take as it is travels through
// pinned host memory, a chunk at a time.

// prepareStaged readies a device message for sending through pinned
// memory: through the route's ring (stager.go), its first chunks copied
// out now and each further one once a send has freed a slot; or, for a
// buffer of another allocator, a chunk size the ring does not serve, or
// the payload checksum (whose manifest needs the whole payload first),
// through pinned chunks of the allocator's pool, all copied at once.
func (r *mpiRoute) prepareStaged(e *exchange, m *outMsg) error {
	if r.stage == nil || m.c.Buffer().Allocator() != e.x.a || e.x.o.PayloadChecksum {
		return r.prepareStagedAll(e, m)
	}
	x := e.x
	m.chunks = resize(m.chunks, chunkCount(m.size, x.lim.chunk))
	for i := range m.chunks {
		sp := chunkAt(m.size, x.lim.chunk, i)
		m.chunks[i].off, m.chunks[i].n = sp.off, sp.n
	}
	man := make([]byte, m.man.PayloadOffset())
	m.man.Encode(man, e.header(m.dest))
	m.staged = &stagedOut{man: man}
	for range min(stageDepth, len(m.chunks)) {
		if err := r.stageOut(e, m); err != nil {
			m.release()
			return e.x.outErr(m.dest, "staging", err)
		}
	}
	return nil
}

// prepareStagedAll copies the message into pinned chunks of the
// allocator's pool: the manifest from the host, the blocks by one
// device-to-host copy per chunk on the send stream, each followed by an
// event that tells when the chunk may be sent. With the payload checksum
// on, the manifest needs the whole payload first, so every copy completes
// before the first chunk is sent.
func (r *mpiRoute) prepareStagedAll(e *exchange, m *outMsg) (err error) {
	x, c := e.x, m.c
	p, start := int64(m.man.PayloadOffset()), c.Start()
	a, s := e.x.copier(c.Buffer())
	m.chunks = resize(m.chunks, chunkCount(m.size, x.lim.chunk))
	defer func() {
		if err != nil {
			m.release()
		}
	}()
	for i := range m.chunks {
		sp := chunkAt(m.size, x.lim.chunk, i)
		cb, err := a.AllocPinned(sp.n, s)
		if err != nil {
			return e.x.outErr(m.dest, "staging", err)
		}
		m.chunks[i] = outChunk{off: sp.off, n: sp.n, mem: cb, buf: cb}
	}
	man := make([]byte, p)
	h := e.header(m.dest)
	writeManifest := func() error {
		m.man.Encode(man, h)
		for i := range m.chunks {
			ch := &m.chunks[i]
			if ch.off >= p {
				break
			}
			mem, err := ch.buf.Bytes()
			if err != nil {
				return err
			}
			// A pinned block leaves the pool only once every earlier use of
			// it has completed, and the copies below write other bytes.
			copy(mem, man[ch.off:min(ch.off+ch.n, p)])
		}
		return nil
	}
	if !x.o.PayloadChecksum {
		if err := writeManifest(); err != nil {
			return e.x.outErr(m.dest, "manifest", err)
		}
	}
	for i := range m.chunks {
		ch := &m.chunks[i]
		if end := ch.off + ch.n; end > p {
			from := max(ch.off, p)
			if err := s.Copy(ch.buf, from-ch.off, c.Buffer(), start+from-p, end-from); err != nil {
				return e.x.outErr(m.dest, "staging", err)
			}
			x.stats.BytesStaged += end - from
		}
		if ch.ready, err = s.Record(); err != nil {
			return e.x.outErr(m.dest, "staging", err)
		}
	}
	if x.o.PayloadChecksum {
		if err := m.chunks[len(m.chunks)-1].ready.Wait(); err != nil {
			return e.x.outErr(m.dest, "staging", err)
		}
		var sum uint32
		for i := range m.chunks {
			ch := &m.chunks[i]
			if ch.off+ch.n <= p {
				continue
			}
			mem, err := ch.buf.Bytes()
			if err != nil {
				return e.x.outErr(m.dest, "payload_checksum", err)
			}
			sum = wire.UpdateChecksum(sum, mem[max(p-ch.off, 0):])
		}
		h.HasPayloadChecksum, h.PayloadChecksum = true, sum
		if err := writeManifest(); err != nil {
			return e.x.outErr(m.dest, "manifest", err)
		}
	}
	return nil
}

// stagingChunk is the pinned memory piece i of a staged message is
// received into: a slot of the ring for a whole chunk, else a chunk of the
// allocator's pool under a write hold its request releases.
func (r *mpiRoute) stagingChunk(e *exchange, in *inMsg, i int) (cluster.Memory, cluster.Releaser, error) {
	x := e.x
	ch := &in.chunks[i]
	if r.stage != nil && ch.n == r.stage.in.size {
		slot, err := r.stage.in.take()
		if err != nil {
			return nil, nil, err
		}
		ch.slot = slot
		return slot, nil, nil
	}
	cb, err := x.a.AllocPinned(ch.n, x.recvS)
	if err != nil {
		return nil, nil, err
	}
	// No Wait: a pinned block leaves the pool only once every earlier use
	// of it has completed, and the allocation enqueues no work.
	h, err := cb.Hold(devalloc.Write)
	if err != nil {
		_ = cb.Free()
		return nil, nil, err
	}
	ch.buf = cb
	return cb, h, nil
}

// stagedDone processes the chunks of a staged message that have arrived,
// in order, and finishes it once the last one has.
func (r *mpiRoute) stagedDone(e *exchange, in *inMsg) {
	for in.next < len(in.chunks) && in.chunks[in.next].done {
		r.processStaged(e, in, in.next)
		in.next++
	}
	if in.next == len(in.chunks) {
		r.finishStaged(e, in)
	}
}

// processStaged handles chunk i of a staged message, in order: the header
// and manifest, the payload checksum, and the copy into the device buffer;
// then the pinned chunk goes back to the pool.
func (r *mpiRoute) processStaged(e *exchange, in *inMsg, i int) {
	x := e.x
	ch := &in.chunks[i]
	defer func() {
		if ch.buf != nil {
			_ = ch.buf.Free()
			ch.buf = nil
		}
		if ch.slot != nil {
			ch.slot.put() // reused only once the copy out of it has run
			ch.slot = nil
		}
	}()
	if in.failed != nil {
		return
	}
	if ch.discarded {
		in.failed = e.x.inErr(in, "receive", fmt.Errorf("%s was drained: %w", in.pieceName(i), distbuf.ErrInvalid))
		return
	}
	var mem []byte
	var err error
	if ch.slot != nil {
		mem = ch.slot.bytes()
	} else if mem, err = ch.buf.Bytes(); err != nil {
		in.failed = e.x.inErr(in, "staging", err)
		return
	}
	mem = mem[:ch.n]
	if ch.err != nil || ch.got != ch.n {
		in.failed = e.sizeError(in, i, mem[:max(min(ch.got, ch.n), 0)])
		return
	}
	if i == 0 {
		p, _ := wire.ManifestSize(mem) // the first chunk holds at least the header
		in.p = p
		// Summing a payload that announces no checksum would cost a pass
		// over every byte on the thread that keeps the pipeline going.
		in.sumStaged, _ = wire.PayloadChecksumAnnounced(mem)
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
	if in.sumStaged && ch.off+ch.n > p {
		in.crc = wire.UpdateChecksum(in.crc, mem[max(p-ch.off, 0):])
	}
	if ch.slot != nil {
		err = r.unstage(e, in, ch)
	} else {
		err = x.recvS.Copy(in.buf, in.base+ch.off, ch.buf, 0, ch.n)
	}
	if err != nil {
		in.failed = e.x.inErr(in, "staging", err)
		return
	}
	x.stats.BytesStaged += ch.n
}

// unstage enqueues the copy of a chunk from its ring slot into the device
// buffer on the receive stream, declared in the buffer's ledger, and
// records the slot's event after it.
func (r *mpiRoute) unstage(e *exchange, in *inMsg, ch *inChunk) error {
	x, slot := e.x, ch.slot
	if err := declaredCopy(slot.ring.dev, x.recvS, in.buf, in.base+ch.off, uintptr(slot.ptr), ch.n, devalloc.Write); err != nil {
		return err
	}
	return slot.ring.dev.EventRecord(slot.ev, cudart.Stream(x.recvS.Handle()))
}

func (r *mpiRoute) finishStaged(e *exchange, in *inMsg) {
	if in.failed == nil && in.plan == nil {
		in.failed = wireErr(ErrMalformed, in.src, e.x.o.Tag, "block_count", "the manifest never completed")
	}
	if in.failed == nil && in.header.HasPayloadChecksum && in.crc != in.header.PayloadChecksum {
		in.failed = wireErr(ErrChecksum, in.src, e.x.o.Tag, "payload_checksum", "computed %#08x, header says %#08x", in.crc, in.header.PayloadChecksum)
	}
	if in.failed != nil {
		e.endIn(in)
		return
	}
	e.wrapResult(in, in.plan, int64(in.p))
}
