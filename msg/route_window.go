package msg

import (
	"errors"
	"fmt"
	"slices"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/ipcwin"
	"github.com/distbuf/distbuf/internal/refbuf"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
)

// windowRoute moves device messages between two ranks of one node through
// CUDA IPC windows (docs/WIRE.md, rule 9; the machinery is
// internal/ipcwin): the sender copies the message, device to device, into
// a window of its own memory that the receiver has opened, and sends
// through MPI a notice that says where it lies and carries its manifest;
// the receiver checks the notice and the manifest as it would a message,
// then copies the message from the window into its receive buffer, device
// to device. Two copies at device memory speed replace a transfer that
// shared-memory MPI stages through host memory.
//
// A rank's copies into its window, for every peer, go in one batch
// (ipcwin.Link.Flush) before its notices go out; its copies out of its
// peers' windows in one batch per wait of the data phase that delivered
// notices, or, where the GPU is shared through MPS, in one for every peer
// at the end of the data phase. The messages that come through windows,
// when there are several, share one receive buffer (one allocation an
// exchange), which each of their results owns with the others.
type windowRoute struct {
	x    *Exchanger
	link *ipcwin.Link // nil when this rank does not use windows
	why  string
	// This exchange's: each destination's message's place in the window
	// (-1: none), the joint receive buffer and each source's place in it
	// (-1: none), the messages whose copies into the window are batched,
	// and those whose copies out of the peers' windows are.
	peer     []bool // by rank: a peer of the route
	offsets  []int64
	joint    *refbuf.Shared
	jointOff []int64
	into     []*outMsg
	from     []*inMsg
}

// newWindowRoute makes the route of a rank that may use windows (auto: its
// transport allows them), or says why it cannot.
func newWindowRoute(x *Exchanger, auto bool) *windowRoute {
	r := &windowRoute{x: x}
	switch {
	case x.a.Info().Backend != devalloc.BackendCUDA:
		// Host memory: not this route's business.
	case !auto:
		r.why = fmt.Sprintf("windows: transport %v", x.o.Transport)
	case x.comm.Local().Size() < 2:
		r.why = "windows: no other rank on this node"
	default:
		rt, err := cudart.Load()
		if err != nil {
			r.why = "windows: " + err.Error()
			break
		}
		if caps := rt.Capabilities(); !caps.IPC || !caps.AddressRange {
			r.why = "windows: the CUDA runtime lacks the interprocess functions or cuMemGetAddressRange"
			break
		}
		if r.link, err = ipcwin.New(rt.Device(x.a.Info().Device)); err != nil {
			r.why = "windows: " + err.Error()
		}
	}
	return r
}

func (r *windowRoute) offer(row *wire.SetupRow) {
	if r.link == nil {
		return
	}
	ready, consumed, err := r.link.EventHandles()
	if err != nil {
		r.why = "windows: " + err.Error()
		_ = r.link.DestroyEvents()
		r.link = nil
		return
	}
	row.Flags |= wire.SetupWindows
	row.Ready, row.Consumed = ready, consumed
}

func (r *windowRoute) bit() uint64 { return wire.SetupWindows }

// check opens the interprocess events of every other rank that takes part
// in windows: a handle this rank's runtime cannot open fails it, before
// any exchange relies on it.
func (r *windowRoute) check(x *Exchanger, rows []wire.SetupRow) (bool, string) {
	if r.link == nil {
		return true, ""
	}
	ok := true
	for _, row := range rows {
		if row.Rank == x.rank || row.Flags&wire.SetupWindows == 0 {
			continue
		}
		r.link.AddPeer(row.Rank, row.Ready, row.Consumed)
		if err := r.link.OpenEvents(row.Rank); err != nil {
			ok, r.why = false, fmt.Sprintf("windows: rank %d's interprocess events: %v", row.Rank, err)
		}
	}
	return ok, r.why
}

// join takes as peers the other ranks of the node that set the windows
// bit: two ranks use windows, both ways, exactly when both set it and
// every rank of the node could open the events of those that did (all).
func (r *windowRoute) join(x *Exchanger, rows []wire.SetupRow, all bool) ([]int, string) {
	if r.link == nil {
		return nil, r.why
	}
	if !all {
		_ = r.link.CloseImports()
		if r.why == "" {
			r.why = "windows: a rank of this node could not open another's interprocess events (its own exchanger says why)"
		}
		return nil, r.why
	}
	var peers []int
	for _, row := range rows {
		if row.Rank != x.rank && row.Flags&wire.SetupWindows != 0 {
			peers = append(peers, row.Rank)
		}
	}
	if len(peers) == 0 {
		return nil, "windows: no other rank on this node moves device memory through CUDA IPC"
	}
	r.peer, r.offsets, r.jointOff = make([]bool, x.size), make([]int64, x.size), make([]int64, x.size)
	for _, p := range peers {
		r.peer[p] = true
	}
	return peers, ""
}

func (r *windowRoute) kind() Route                     { return RouteWindow }
func (r *windowRoute) sent(*exchange, *outMsg, int)    {}
func (r *windowRoute) pieces(int64) int                { return 1 } // the notice, whatever the length
func (r *windowRoute) inPlace(*exchange, *outMsg) bool { return false }

// noticeLen bounds the notice of a message of size bytes: its manifest is
// no longer than the message.
func (r *windowRoute) noticeLen(size int64) int64 { return wire.WindowNoticeHead + size }

func (r *windowRoute) stream(s *devalloc.Stream) cudart.Stream { return cudart.Stream(s.Handle()) }

// sized lays this exchange's window messages out, grows the window if they
// do not fit, makes the send stream wait until the ranks that read the
// window last time are done with it, and takes the joint receive buffer.
// When the window cannot be had, an abort notice replaces each window
// message.
func (r *windowRoute) sized(e *exchange) {
	x, l := e.x, r.link
	var total int64
	for d := range r.offsets {
		r.offsets[d] = -1
		if m := e.byDest[d]; m != nil && r.peer[d] && !e.abortTo[d] {
			r.offsets[d] = total
			total += (m.size + ipcwin.Align - 1) &^ (ipcwin.Align - 1)
		}
	}
	if err := l.Reserve(r.stream(x.sendS), x.sendS.Synchronize, total); err != nil {
		e.fail(e.x.outErr(x.rank, "node-local window", err))
		for d, off := range r.offsets {
			if off >= 0 {
				e.abortTo[d] = true
			}
		}
	}
	r.allocJoint(e)
}

// jointAlign places each message of a joint receive buffer, so that the
// next begins on an aligned boundary.
const jointAlign = 256

// allocJoint takes one receive buffer for every message that comes through
// a window, when there are several: one allocation and, once every result
// is freed, one free for all those peers instead of one each. Each
// message's result shares the buffer (internal/refbuf). When the buffer
// cannot be had, each message gets its own.
func (r *windowRoute) allocJoint(e *exchange) {
	x := e.x
	r.joint = nil
	var total int64
	count := 0
	for s := range r.jointOff {
		r.jointOff[s] = -1
		n := e.recvSize[s]
		if !r.peer[s] || n <= 0 || e.refuse[s] {
			continue
		}
		room := (n + jointAlign - 1) / jointAlign * jointAlign
		if n > packing.MaxBytes || total > packing.MaxBytes-room {
			return
		}
		r.jointOff[s] = total
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
	r.joint, _ = refbuf.New(buf)
}

// alloc places in in the joint buffer, or takes a buffer of its own; the
// copy from the window writes it in the buffer's ledger order. MPI brings
// only the notice, into pinned memory of its own.
func (r *windowRoute) alloc(e *exchange, in *inMsg) error {
	if r.joint != nil && r.jointOff[in.src] >= 0 {
		in.buf, in.base, in.joint = r.joint.Buffer(), r.jointOff[in.src], r.joint
	} else {
		buf, err := e.x.a.Alloc(in.size, e.x.recvS)
		if err != nil {
			return err
		}
		in.buf = buf
	}
	in.chunks = resize(in.chunks, 1)
	in.chunks[0] = inChunk{n: r.noticeLen(in.size)}
	return nil
}

// recvMem is the kept pinned buffer of the source's notices, as long as
// MPI says (at least one byte).
func (r *windowRoute) recvMem(e *exchange, in *inMsg, i int, n int64) (cluster.Memory, cluster.Releaser, error) {
	nb, err := r.link.Notices.Received(in.src, max(n, 1))
	if err != nil {
		return nil, nil, err
	}
	in.chunks[i].win = nb
	return cluster.Sub(nb, 0, n), nil, nil
}

// prepare batches the copies of m into this rank's window and makes its
// one piece the notice: the fixed part, then the manifest.
func (r *windowRoute) prepare(e *exchange, m *outMsg) (err error) {
	x, l, c := e.x, r.link, m.c
	p, start, size := int64(m.man.PayloadOffset()), c.Start(), c.Size()
	off := r.offsets[m.dest]
	h := e.header(m.dest)
	if x.o.PayloadChecksum {
		a, s := e.x.copier(c.Buffer())
		err := readAt(a, s, c.Buffer(), start, size, func(b []byte) error {
			h.HasPayloadChecksum, h.PayloadChecksum = true, wire.Checksum(b)
			return nil
		})
		if err != nil {
			return e.x.outErr(m.dest, "payload_checksum", err)
		}
	}
	n := wire.WindowNoticeHead + p
	notice, err := l.Notices.Sent(m.dest, n)
	if err != nil {
		return e.x.outErr(m.dest, "notice", err)
	}
	defer func() {
		if err != nil {
			_ = notice.Drop()
		}
	}()
	mem := notice.Bytes()
	win, winSize, gen, handle := l.Window()
	head := wire.WindowNotice{Generation: gen, Window: uint64(winSize), Offset: uint64(off), Size: uint64(m.size), Handle: handle}
	head.Encode(mem)
	m.man.Encode(mem[wire.WindowNoticeHead:], h)
	// The blocks, from the send buffer, and the manifest, from the notice:
	// copies on the send stream, declared reads of both, batched.
	b := &l.Into
	at := b.Mark()
	copies := func() error {
		if size > 0 {
			src := c.Buffer()
			if src.Allocator() != x.a {
				return r.copyAcross(src, start, win+uintptr(off+p), size)
			}
			srcAddr, rd, err := declared(src, x.sendS, devalloc.Read)
			if err != nil {
				return err
			}
			b.Access(rd)
			b.Add(win+uintptr(off+p), srcAddr+uintptr(start), size)
		}
		// The notice is the link's: it stays unwritten until the next
		// exchange, after the ready event that follows this copy.
		b.Add(win+uintptr(off), notice.Addr()+wire.WindowNoticeHead, p)
		return nil
	}
	if err := copies(); err != nil {
		return e.x.outErr(m.dest, "window", errors.Join(err, b.Undo(at)))
	}
	r.into = append(r.into, m)
	m.chunks = resize(m.chunks, 1)
	m.chunks[0] = outChunk{n: n, notice: notice, mem: cluster.Sub(notice, 0, n)}
	return nil
}

// copyAcross copies n bytes of src, a buffer of another allocator, from
// off into the window at dst, on the send stream: src is read once its
// writers are done, and held until the copy has run.
func (r *windowRoute) copyAcross(src *devalloc.Buffer, off int64, dst uintptr, n int64) error {
	x := r.x
	addr, _, _, err := src.Region()
	if err != nil {
		return err
	}
	h, err := src.Hold(devalloc.Read)
	if err != nil {
		return err
	}
	if err = h.Wait(); err == nil {
		if err = r.link.Device().MemcpyAsync(dst, addr+uintptr(off), n, r.stream(x.sendS)); err == nil {
			err = x.sendS.Synchronize()
		}
	}
	return errors.Join(err, h.Release())
}

// prepared enqueues the exchange's copies into this rank's window, all on
// the send stream, and records the ready event after them, before any
// notice goes out (a receiver's copy waits for it). When the copies
// cannot be enqueued, none of their messages is in the window: an abort
// notice replaces each.
func (r *windowRoute) prepared(e *exchange) {
	x, l := e.x, r.link
	defer func() { clear(r.into); r.into = r.into[:0] }()
	if len(r.into) == 0 {
		return
	}
	r.intoDone(e, l.Flush(&l.Into, x.sendS))
}

// intoDone ends the copies into the window, with err their failure.
func (r *windowRoute) intoDone(e *exchange, err error) {
	x, l := e.x, r.link
	if err != nil {
		e.fail(e.x.outErr(x.rank, "node-local window", err))
		for _, m := range r.into {
			k := slices.Index(e.outs, m)
			_ = m.chunks[0].notice.Drop() // nothing enqueued reads it
			m.chunks[0] = outChunk{}
			e.outs[k] = e.newAbort(m.dest, m.step, m.size)
		}
		return
	}
	for _, m := range r.into {
		l.Placed(m.dest)
	}
	if err := l.Ready(r.stream(x.sendS)); err != nil {
		e.fail(e.x.outErr(x.rank, "node-local window", err))
	}
}

// done handles a notice once it has arrived: it checks it, opens the
// sender's window as needed, accepts the manifest, and batches the copy of
// the message from the window into the receive buffer (a payload checksum
// needs the copy at once). The notice's buffer serves the source's next
// notice.
func (r *windowRoute) done(e *exchange, in *inMsg, i int) {
	ch := &in.chunks[0]
	in.failed = r.fromWindow(e, in)
	if ch.win != nil {
		if in.failed == nil {
			if err := ch.win.KeepReceived(in.src); err != nil {
				in.failed = e.x.inErr(in, "notice", err)
			}
			ch.win = nil
		}
		in.giveBack(ch)
	}
	if in.failed != nil {
		e.endIn(in)
		return
	}
	// A batched copy is declared in the buffer's ledger: any access to the
	// result waits for it.
	e.wrapResult(in, in.plan, int64(in.p))
}

// fromWindow checks in's notice and places the copy of its message.
func (r *windowRoute) fromWindow(e *exchange, in *inMsg) error {
	x, l, tag := e.x, r.link, e.x.o.Tag
	ch := &in.chunks[0]
	if in.failed != nil {
		return in.failed
	}
	if ch.discarded {
		return e.x.inErr(in, "receive", fmt.Errorf("%s was drained: %w", in.pieceName(0), distbuf.ErrInvalid))
	}
	mem := ch.win.Bytes()
	mem = mem[:max(min(ch.got, int64(len(mem))), 0)]
	if ch.err != nil || ch.got == wire.AbortSize {
		return e.sizeError(in, 0, mem) // an abort notice is reported as one
	}
	n, man, err := wire.DecodeWindowNotice(mem, in.src, tag, in.size)
	if err != nil {
		return err
	}
	ptr, size, err := l.Open(in.src, n.Generation, n.Window, n.Handle, x.recvS.Synchronize)
	var pe *ipcwin.PeerError
	switch {
	case errors.As(err, &pe):
		return wireErr(ErrMalformed, in.src, tag, pe.Field, "%s", pe.Reason)
	case err != nil:
		return e.x.inErr(in, "window", err)
	case n.Offset+n.Size > uint64(size):
		return wireErr(ErrMalformed, in.src, tag, "ipc_window", "bytes [%d, +%d) lie outside the window of %d bytes it opened as", n.Offset, n.Size, size)
	}
	plan, p, err := e.accept(in, man, uint64(in.size))
	if err != nil {
		return err
	}
	s := r.stream(x.recvS)
	if err := l.WaitReady(in.src, s); err != nil {
		return e.x.inErr(in, "ipc_event", err)
	}
	dst, _, _, err := in.buf.Region()
	if err != nil {
		return e.x.inErr(in, "receive buffer", err)
	}
	wr, err := in.buf.Write(x.recvS)
	if err != nil {
		return e.x.inErr(in, "receive buffer", err)
	}
	in.plan, in.p = plan, p
	if !in.header.HasPayloadChecksum {
		b := &l.From
		b.Add(dst+uintptr(in.base), ptr+uintptr(n.Offset), in.size)
		b.Access(wr)
		r.from = append(r.from, in)
		return nil
	}
	// The checksum needs the copy now.
	err = l.Device().MemcpyAsync(dst+uintptr(in.base), ptr+uintptr(n.Offset), in.size, s)
	if err = errors.Join(err, wr.Done()); err != nil {
		return e.x.inErr(in, "copy from the window", err)
	}
	var sum uint32
	if err := readDevice(x.a, x.recvS, in.buf, in.base+int64(p), in.size-int64(p), func(b []byte) error { sum = wire.Checksum(b); return nil }); err != nil {
		return e.x.inErr(in, "payload_checksum", err)
	}
	if sum != in.header.PayloadChecksum {
		return wireErr(ErrChecksum, in.src, tag, "payload_checksum", "computed %#08x, header says %#08x", sum, in.header.PayloadChecksum)
	}
	return nil
}

// waited enqueues the copies out of the peers' windows gathered since the
// last wait, so that the copies of notices that arrive together go in one
// call while later ones are still awaited. Under MPS (the gather kernel)
// only received flushes, so that every peer's copy goes in one launch: one
// device operation instead of one per peer, queued behind the other ranks'.
func (r *windowRoute) waited(e *exchange) {
	if !r.link.Kernel {
		r.flushFrom(e)
	}
}

func (r *windowRoute) flushFrom(e *exchange) {
	if len(r.from) == 0 {
		return
	}
	r.fromDone(e, r.link.Flush(&r.link.From, e.x.recvS))
}

// fromDone ends the copies out of the windows, with err their failure:
// every message they carry then fails.
func (r *windowRoute) fromDone(e *exchange, err error) {
	if err != nil {
		for _, in := range r.from {
			e.fail(e.x.inErr(in, "copy from the window", err))
		}
	}
	clear(r.from)
	r.from = r.from[:0]
}

// received records the consumed event after this exchange's copies from
// peers' windows: before the agreement, so that it precedes the senders'
// waits for it in the next exchange.
func (r *windowRoute) received(e *exchange) {
	r.flushFrom(e)
	if err := r.link.Consumed(r.stream(e.x.recvS)); err != nil {
		e.fail(fmt.Errorf("msg: node-local windows: %w", err))
	}
}

// agreed gives back the exchange's reference to the joint buffer: the
// results hold their own, and it goes with the last of them, or now when
// there is none.
func (r *windowRoute) agreed(e *exchange) {
	if r.joint != nil {
		if err := r.joint.Release(); err != nil {
			e.fail(fmt.Errorf("msg: the receive buffer of the window messages: %w", err))
		}
		r.joint = nil
	}
}

// detach waits for the exchanger's copies and lets go of the peers'
// windows and events.
func (r *windowRoute) detach() error {
	x := r.x
	return errors.Join(x.recvS.Synchronize(), x.sendS.Synchronize(), r.link.CloseImports())
}

func (r *windowRoute) close() error {
	if r.link == nil {
		return nil
	}
	if err := r.link.Free(); err != nil {
		return fmt.Errorf("msg: close node-local windows: %w", err)
	}
	return nil
}
