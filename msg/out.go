package msg

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/ipcwin"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
)

// outMsg is one logical message this rank sends in an exchange.
type outMsg struct {
	dest  int
	step  int
	route route
	c     *packing.Coalesced // nil for an abort notice
	man   *outManifest
	size  int64 // bytes on the wire
	abort bool
	// manifestDone: the manifest of a message sent in place is written
	// (writeManifests), with manifestErr its failure.
	manifestDone bool
	manifestErr  error

	chunks []outChunk
	share  *sharedRelease // direct: the buffer's read hold, shared by the chunks
	shared sharedRelease  // what share points to
	staged *stagedOut     // staged through the route's ring (stager.go)
}

type outChunk struct {
	off, n int64
	mem    cluster.Memory
	region bufRegion            // direct: what mem points to
	ready  readiness            // staged: the copy into the pinned chunk is done
	buf    *devalloc.Buffer     // pinned memory, freed once posted
	slot   *stageSlot           // a slot of the staging ring, back to it once sent
	notice *ipcwin.Notice       // a window notice's buffer, kept for the peer's next once posted
	pin    *cluster.PinnedBytes // an abort notice, an empty message, a read notice
	posted bool
}

// readiness tells when a staged chunk's copy out of the device has run: a
// devalloc.Event, or a slot of the staging ring.
type readiness interface {
	Done() (bool, error)
	Wait() error
	Release() error
}

// shareWith makes r shared by the n requests of m.
func (m *outMsg) shareWith(r cluster.Releaser, n int) *sharedRelease {
	m.shared.init(r, n)
	return &m.shared
}

// sharedRelease releases what it wraps when the last of its n users has
// released it: one buffer hold shared by the requests of a chunked message.
type sharedRelease struct {
	r    cluster.Releaser
	left atomic.Int32
}

func (s *sharedRelease) init(r cluster.Releaser, n int) {
	s.r = r
	s.left.Store(int32(n))
}

func (s *sharedRelease) Release() error {
	if s.left.Add(-1) == 0 {
		return s.r.Release()
	}
	return nil
}

// resize returns s with n zeroed elements, reusing its array when it is
// large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// span is a chunk of a logical message: bytes [off, off+n).
type span struct{ off, n int64 }

// chunkCount is how many MPI messages a message of size bytes travels as
// (docs/WIRE.md, "Transport"): ceil(size/chunk), all but the last chunk
// bytes long.
func chunkCount(size, chunk int64) int { return int((size-1)/chunk + 1) }

// chunkAt is chunk i of a message of size bytes.
func chunkAt(size, chunk int64, i int) span {
	off := int64(i) * chunk
	return span{off, min(chunk, size-off)}
}

// bufRegion is bytes [off, off+n) of a buffer, as MPI is handed them. It
// is cluster.Sub, but lives in the message record the exchanger reuses
// from one exchange to the next, so posting a request allocates no new
// Memory value.
type bufRegion struct {
	buf    *devalloc.Buffer
	off, n int64
}

func (r *bufRegion) Region() (uintptr, int64, bool, error) {
	addr, size, dev, err := r.buf.Region()
	if err == nil && (r.off < 0 || r.n < 0 || r.off > size || r.n > size-r.off) {
		err = fmt.Errorf("msg: bytes [%d, +%d) outside a buffer of %d bytes: %w", r.off, r.n, size, distbuf.ErrInvalid)
	}
	return addr + uintptr(r.off), r.n, dev, err // no memory when err is set
}

// header is the header of a message from this rank to dest in this exchange.
func (e *exchange) header(dest int) wire.Header {
	return wire.Header{Source: int32(e.x.rank), Dest: int32(dest), Tag: int32(e.x.o.Tag), Epoch: e.epoch}
}

func (x *Exchanger) outErr(dest int, field string, err error) error {
	return fmt.Errorf("msg: message to rank %d tag %d: %s: %w", dest, x.o.Tag, field, err)
}

// writeManifests writes, in schedule order, the manifest of every message
// its route sends from the send buffer itself, before any route takes a
// read hold for a send: send buffers that are parts of one joined buffer
// (packing.Plan.Joined) share its ledger, where a manifest's write would
// conflict with the read hold of a message prepared before it. A failure
// is kept for the message's prepare to report.
func (e *exchange) writeManifests() {
	x, n := e.x, e.x.size
	for k := range n {
		d := (x.rank + k) % n
		m := e.byDest[d]
		if m == nil || (d == x.rank && !x.o.SelfViaMPI) || e.abortTo[d] || !m.route.inPlace(e, m) {
			continue
		}
		m.manifestErr, m.manifestDone = e.writeManifest(m), true
	}
}

// writeManifest writes m's manifest into the room before its blocks: from
// this goroutine under a write hold for host memory, by a stream copy from
// pinned memory for device memory.
func (e *exchange) writeManifest(m *outMsg) error {
	x, c := e.x, m.c
	buf := c.Buffer()
	p, start, l := int64(m.man.PayloadOffset()), c.Start(), c.Size()
	if start < p {
		return e.x.outErr(m.dest, "manifest", fmt.Errorf("the send buffer has %d bytes before its blocks, the manifest needs %d (allocate it with msg.AllocSend or msg.JoinSend): %w", start, p, distbuf.ErrInvalid))
	}
	h := e.header(m.dest)
	if !c.Buffer().Location().HostAccessible() {
		a, s := e.x.copier(buf)
		if x.o.PayloadChecksum {
			err := readDevice(a, s, buf, start, l, func(b []byte) error {
				h.HasPayloadChecksum, h.PayloadChecksum = true, wire.Checksum(b)
				return nil
			})
			if err != nil {
				return e.x.outErr(m.dest, "payload_checksum", err)
			}
		}
		scratch, err := a.AllocPinned(p, s)
		if err != nil {
			return e.x.outErr(m.dest, "manifest", err)
		}
		mem, err := scratch.Bytes()
		if err == nil {
			m.man.Encode(mem, h)
			err = s.Copy(buf, start-p, scratch, 0, p)
		}
		if ferr := scratch.Free(); err == nil {
			err = ferr
		}
		if err != nil {
			return e.x.outErr(m.dest, "manifest", err)
		}
		return nil
	}
	// The manifest is written from this goroutine, after the work the
	// buffer's ledger says must come first.
	err := withHostBytes(buf, devalloc.Write, func(mem []byte) error {
		whole := mem[start-p : start+l]
		if x.o.PayloadChecksum {
			h.HasPayloadChecksum, h.PayloadChecksum = true, wire.Checksum(whole[p:])
		}
		at := writtenAt{buf, start - p}
		if x.layouts.prefixHolds(at, m.man) {
			m.man.Seal(whole, h) // same buffer, same layout: the header changes, the entries do not
		} else {
			m.man.Encode(whole, h)
		}
		x.layouts.wrote(at, m.man)
		return nil
	})
	if err != nil {
		return e.x.outErr(m.dest, "manifest", err)
	}
	return nil
}

// prepareInPlace readies m to be sent from its send buffer itself, in
// chunks: the manifest in the room before the blocks (writeManifests), and
// the read hold the requests keep until they complete.
func (e *exchange) prepareInPlace(m *outMsg) error {
	x, c := e.x, m.c
	if !m.manifestDone {
		m.manifestErr, m.manifestDone = e.writeManifest(m), true
	}
	if m.manifestErr != nil {
		return m.manifestErr
	}
	buf := c.Buffer()
	p, start := int64(m.man.PayloadOffset()), c.Start()
	rh, err := buf.Hold(devalloc.Read)
	if err != nil {
		return e.x.outErr(m.dest, "payload", err)
	}
	if err := rh.Wait(); err != nil {
		_ = rh.Release()
		return e.x.outErr(m.dest, "payload", err)
	}
	k := chunkCount(m.size, x.lim.chunk)
	m.share = m.shareWith(rh, k)
	m.chunks = resize(m.chunks, k)
	for i := range m.chunks {
		sp := chunkAt(m.size, x.lim.chunk, i)
		ch := &m.chunks[i]
		ch.off, ch.n, ch.region = sp.off, sp.n, bufRegion{buf, start - p + sp.off, sp.n}
		ch.mem = &ch.region
	}
	return nil
}

// newAbort makes the abort notice that replaces an announced message of
// size bytes to dest: the notice in the first chunk, empty messages for the
// others, so the receiver's requests all complete.
func (e *exchange) newAbort(dest, step int, size int64) *outMsg {
	notice := make([]byte, wire.AbortSize)
	_ = wire.EncodeAbort(notice, e.header(dest)) // cannot fail: no entries, and the buffer is large enough
	pieces := make([][]byte, e.x.pieceCount(dest, size))
	pieces[0] = notice
	m := e.newOut()
	m.dest, m.step, m.route = dest, step, e.x.routes[dest]
	m.setPieces(pieces)
	m.abort, m.size = true, size
	e.x.stats.Aborts++
	return m
}

// setPieces makes m's MPI messages the given bytes, sent from Go memory
// pinned until each completes.
func (m *outMsg) setPieces(pieces [][]byte) {
	m.chunks = resize(m.chunks, len(pieces))
	m.share = nil
	for i, b := range pieces {
		pin := cluster.PinBytes(b)
		m.chunks[i] = outChunk{n: int64(len(b)), mem: pin, pin: pin}
	}
}

// release frees what the chunks not yet posted hold: called when a message
// will not be (fully) sent.
func (m *outMsg) release() {
	for i := range m.chunks {
		ch := &m.chunks[i]
		if ch.posted {
			continue
		}
		ch.posted = true
		if ch.ready != nil {
			_ = ch.ready.Release()
		}
		if ch.buf != nil {
			_ = ch.buf.Free()
		}
		if ch.slot != nil {
			ch.slot.put() // reused only once its copy has run
			ch.slot = nil
		}
		if ch.notice != nil {
			_ = ch.notice.Drop()
			ch.notice = nil
		}
		if ch.pin != nil {
			_ = ch.pin.Release()
		}
		if m.share != nil {
			_ = m.share.Release()
		}
	}
}

// readDevice copies n bytes of buf from off to pinned memory on s and hands
// them to fn once the copy is done.
func readDevice(a *devalloc.Allocator, s *devalloc.Stream, buf *devalloc.Buffer, off, n int64, fn func([]byte) error) error {
	if n == 0 {
		return fn(nil)
	}
	pin, err := a.AllocPinned(n, s)
	if err != nil {
		return err
	}
	defer func() { _ = pin.Free() }()
	if err := s.Copy(pin, 0, buf, off, n); err != nil {
		return err
	}
	return withHostBytes(pin, devalloc.Read, fn)
}

// copier is the allocator and stream that copy out of send buffer buf: the
// exchanger's own for a buffer of its allocator; for a buffer of another
// allocator, that allocator's default stream and pinned memory, since a
// stream copies only between buffers of its own allocator.
func (x *Exchanger) copier(buf *devalloc.Buffer) (*devalloc.Allocator, *devalloc.Stream) {
	if a := buf.Allocator(); a != x.a {
		return a, a.DefaultStream()
	}
	return x.a, x.sendS
}

// copyAcross copies n bytes of src, a buffer of another allocator than the
// exchanger's, to dst at dstOff through host memory: src is read once its
// writers are done (through its own allocator's pinned memory when it is
// device memory), dst is written in its ledger's order.
func (x *Exchanger) copyAcross(dst *devalloc.Buffer, dstOff int64, src *devalloc.Buffer, srcOff, n int64) error {
	a := src.Allocator()
	return readAt(a, a.DefaultStream(), src, srcOff, n, func(b []byte) error { return x.writeAt(dst, dstOff, b) })
}

// writeAt writes b into buf, a buffer of the exchanger's allocator, at off:
// from this goroutine under a write hold for host-accessible memory, else
// by a copy from pinned memory on the receive stream.
func (x *Exchanger) writeAt(buf *devalloc.Buffer, off int64, b []byte) error {
	n := int64(len(b))
	if buf.Location().HostAccessible() {
		return withHostBytes(buf, devalloc.Write, func(mem []byte) error {
			copy(mem[off:off+n], b)
			return nil
		})
	}
	pin, err := x.a.AllocPinned(n, x.recvS)
	if err != nil {
		return err
	}
	mem, err := pin.Bytes()
	if err == nil {
		copy(mem, b)
		err = x.recvS.Copy(buf, off, pin, 0, n)
	}
	return errors.Join(err, pin.Free())
}

// readAt hands n bytes of buf from off to fn once the work buf's ledger
// says comes first has run: in place for host-accessible memory, through
// a's pinned memory and stream s otherwise.
func readAt(a *devalloc.Allocator, s *devalloc.Stream, buf *devalloc.Buffer, off, n int64, fn func([]byte) error) error {
	if !buf.Location().HostAccessible() {
		return readDevice(a, s, buf, off, n, fn)
	}
	return withHostBytes(buf, devalloc.Read, func(mem []byte) error { return fn(mem[off : off+n]) })
}

// withHostBytes runs fn on the bytes of host-accessible buf under a hold
// of the given mode, once what the hold must follow has run.
func withHostBytes(buf *devalloc.Buffer, mode devalloc.Mode, fn func(mem []byte) error) error {
	h, err := buf.Hold(mode)
	if err != nil {
		return err
	}
	err = h.Wait()
	var mem []byte
	if err == nil {
		if mem, err = buf.Bytes(); err == nil {
			err = fn(mem)
		}
	}
	return errors.Join(err, h.Release())
}

// copyToSelf delivers this rank's message to itself without MPI: one
// stream-ordered copy of the blocks into a pooled buffer laid out like a
// received message. Nothing crosses a wire, so no manifest is written or
// read: the receive layout is made from the send buffer's layout, once
// per layout. The buffer is allocated and the copy made on the allocator's
// default stream, where a solver's own work usually runs: behind the work
// that filled the send buffer there, without an event between streams.
func (e *exchange) copyToSelf(m *outMsg) {
	x, c := e.x, m.c
	p := int64(wire.PayloadOffset(c.Len()))
	in := e.newIn()
	in.src, in.size = x.rank, m.size
	e.selfIn = in
	known, err := e.selfLayout(c)
	if err != nil {
		e.fail(err)
		return
	}
	in.learned = known
	s := x.a.DefaultStream()
	buf, err := x.a.Alloc(m.size, s)
	if err != nil {
		e.fail(e.x.outErr(x.rank, "receive buffer", err))
		return
	}
	if src := c.Buffer(); src.Allocator() == x.a {
		err = s.Copy(buf, p, src, c.Start(), c.Size())
	} else {
		err = e.x.copyAcross(buf, p, src, c.Start(), c.Size())
	}
	if err != nil {
		_ = buf.Free()
		e.fail(e.x.outErr(x.rank, "self copy", err))
		return
	}
	in.buf = buf
	e.wrapResult(in, known.plan, p)
}

// selfLayout is the receive layout of the message to self with send buffer
// c: the pattern's or the last one made, while c has the layout it was
// made from, else made anew (and, for a learned pattern, checked against
// the pattern's).
func (e *exchange) selfLayout(c *packing.Coalesced) (*learnedIn, error) {
	x := e.x
	known, learned := x.layouts.expected(x.rank, e.pat)
	if known != nil && known.from == c.Plan() && known.fromGroup == c.Group() {
		return known, nil
	}
	plan, err := c.Plan().Detached(c.Group())
	if err != nil {
		return nil, e.x.outErr(x.rank, "manifest", err)
	}
	x.stats.ManifestsBuilt++
	if known != nil && sameLayout(known.plan, plan) {
		// The same blocks from another plan: the known layout serves (as
		// a peer's byte-equal manifest reuses its plan), and is recognised
		// by this plan from now on.
		known.from, known.fromGroup = c.Plan(), c.Group()
		return known, nil
	}
	if learned {
		return nil, wireErr(ErrPatternMismatch, x.rank, x.o.Tag, "manifest", "the blocks differ from those the pattern learned")
	}
	l := &learnedIn{plan: plan, from: c.Plan(), fromGroup: c.Group()}
	x.layouts.received[x.rank] = l
	return l, nil
}
