package msg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/bytesize"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/gather"
	"github.com/distbuf/distbuf/internal/wire"
)

// Node-local device messages (docs/WIRE.md, "Node-local device messages").
// Between two ranks of one node that both exchange device memory and whose
// runtime shares memory between processes (CUDA IPC), a message does not
// travel through MPI: the sender copies it, device to device, into a window
// of its own memory that the receiver has opened, and sends through MPI a
// notice that says where it lies and carries its manifest; the receiver
// checks the manifest as it would a message's, then copies the message
// from the window into its receive buffer, device to device. Two copies at
// memory speed replace a transfer that shared-memory MPI, staging through
// host memory, moves at a few GB/s.
//
// Ordering, all on the device but for the MPI notice: the sender's window
// copies follow, on its send stream, the consumed event of every rank that
// read its window in the previous exchange; it records its ready event
// after them and only then sends the notices; the receiver's copy follows
// the sender's ready event on its receive stream, and it records its
// consumed event after its copies, before the agreement that ends the
// exchange (so that the record precedes the sender's wait for it, which
// comes in the next exchange). An event wait takes the last record made
// before it, so one ready and one consumed event per rank serve every
// exchange. The copies into the window go in one runtime call, one
// cudaMemcpyBatchAsync where the runtime has it, with one event ending the
// buffers' declared accesses; so do the copies from the windows of the
// notices that one wait of the data phase delivered.

const (
	// ipcMagic opens every notice: "distipc1", little-endian.
	ipcMagic = 0x3163706974736964
	// ipcHead is the notice's fixed part: magic, window generation, window
	// size, offset, length (8 bytes each), the window's IPC handle (64).
	ipcHead = 40 + 64
	// ipcAlign aligns each message in a window.
	ipcAlign = 256
	// ipcSetupWords is one rank's row of the setup Allgather: its rank,
	// its flags, its ready and consumed events' IPC handles (64 bytes each,
	// as 8 little-endian words).
	ipcSetupWords = 2 + 8 + 8
	// ipcWindowMin is the smallest window; a window grows by at least
	// doubling, so a run opens a peer's windows a few times at most (each
	// open costs about 100 ms).
	ipcWindowMin = 4 << 20
)

// ipcLink is an exchanger's node-local transport.
type ipcLink struct {
	dev   *cudart.Device
	peers []bool // by rank: messages to and from it go through windows
	n     int    // how many

	ready, consumed         cudart.Event // this rank's
	peerReady, peerConsumed []cudart.IpcEventHandle
	openReady, openConsumed map[int]cudart.Event
	win                     uintptr // this rank's window, generation gen
	winSize                 int64
	gen                     uint64
	winHandle               cudart.IpcMemHandle
	retired                 []uintptr // earlier windows: a peer may still have them open
	peerWin                 map[int]*peerWindow
	readBy                  []bool  // ranks this rank's window holds messages for since its last wait for them
	offsets                 []int64 // this exchange's messages in the window, by destination (-1: none)
	// notices keeps, by source, the pinned buffer its last notice arrived
	// in, for the next one: a notice is read on the host only, so reusing
	// its buffer waits for nothing, where a new one costs a pool query and
	// its free an event.
	notices map[int]*devalloc.Buffer
	// sent keeps, by destination, the pinned buffer its last notice went
	// out from, for the next one: rewriting it waits only for the copy of
	// its manifest into the window (a write hold), where a new one costs a
	// pool query and its free an event.
	sent map[int]*devalloc.Buffer
	// toWindow and fromWindows gather an exchange's window copies, made
	// in one call (flushToWindow) and, from the peers' windows, one per
	// wait that delivered notices, or under MPS (kernelCopies) one for
	// every peer at the end of the data phase (flushFromWindows), instead
	// of one or two runtime calls and an event per peer.
	toWindow, fromWindows copyBatch
	// kernelCopies sends batches to the gather kernel (internal/gather). Where the device
	// is shared through MPS the ranks' device operations queue behind one
	// another, and one launch per batch beats a copy per message (8 ranks
	// on an H200: 909-985 -> 738-823 us a solve); without MPS the
	// processes take the GPU in turns and cudaMemcpyBatchAsync measured
	// faster (2 ranks: 599-629 against 675-695 us).
	// Cleared when the kernel turns out unavailable.
	kernelCopies bool
}

// copyBatch is device copies enqueued together on one stream, and the
// ledger accesses that end with them.
type copyBatch struct {
	dsts, srcs, sizes []uintptr
	accesses          []*devalloc.Access
	outs              []*outMsg // toWindow: the messages the copies carry
	ins               []*inMsg  // fromWindows: the messages they deliver
}

func (b *copyBatch) add(dst, src uintptr, n int64) {
	b.dsts, b.srcs, b.sizes = append(b.dsts, dst), append(b.srcs, src), append(b.sizes, uintptr(n))
}

// mark and undo drop what one message added after a failure of its own.
func (b *copyBatch) mark() [2]int { return [2]int{len(b.dsts), len(b.accesses)} }

func (b *copyBatch) undo(at [2]int) error {
	err := devalloc.DoneAll(b.accesses[at[1]:]...)
	clear(b.accesses[at[1]:])
	b.dsts, b.srcs, b.sizes, b.accesses = b.dsts[:at[0]], b.srcs[:at[0]], b.sizes[:at[0]], b.accesses[:at[1]]
	return err
}

// flush enqueues the copies on s and ends the accesses after them; only
// outs and ins stay, for the caller, who then empties the batch (reset).
// Several copies go in one cudaMemcpyBatchAsync, or under MPS in one
// launch of the gather kernel (internal/gather) (see kernelCopies); a lone copy is one
// cudaMemcpyAsync. A non-nil fail (a test's) stands for the copies' error.
func (b *copyBatch) flush(l *ipcLink, s *devalloc.Stream, fail error) error {
	dev, cs := l.dev, cudart.Stream(s.Handle())
	err := fail
	if err == nil && len(b.dsts) > 1 && l.kernelCopies {
		if err = gather.CopySpans(s, b.dsts, b.srcs, b.sizes); errors.Is(err, distbuf.ErrUnavailable) {
			l.kernelCopies, err = false, nil // nothing was enqueued: the runtime's copies instead
		} else {
			b.dsts = b.dsts[:0] // enqueued, or failed
		}
	}
	switch {
	case err != nil || len(b.dsts) == 0:
	case len(b.dsts) == 1:
		err = dev.MemcpyAsync(b.dsts[0], b.srcs[0], int64(b.sizes[0]), cs)
	case dev.Runtime().Capabilities().MemcpyBatch:
		err = dev.MemcpyBatch(cs, b.dsts, b.srcs, b.sizes)
	default:
		err = dev.MemcpyEach(cs, b.dsts, b.srcs, b.sizes)
	}
	err = errors.Join(err, devalloc.DoneAll(b.accesses...))
	clear(b.accesses)
	b.dsts, b.srcs, b.sizes, b.accesses = b.dsts[:0], b.srcs[:0], b.sizes[:0], b.accesses[:0]
	return err
}

func (b *copyBatch) reset() {
	clear(b.outs)
	clear(b.ins)
	b.outs, b.ins = b.outs[:0], b.ins[:0]
}

// takeNotice returns a pinned buffer of at least n bytes for a notice from
// src: the one its last notice arrived in when large enough, else a new one.
func (l *ipcLink) takeNotice(x *Exchanger, src int, n int64) (*devalloc.Buffer, error) {
	if b := l.notices[src]; b != nil {
		delete(l.notices, src)
		if b.Size() >= n {
			return b, nil
		}
		if err := b.Free(); err != nil {
			return nil, err
		}
	}
	return x.a.AllocPinned(n, x.recvS)
}

// takeSent returns a pinned buffer of at least n bytes for a notice to
// dest, ready for the host to write: the one its last notice went out
// from when large enough (once the device has read it), else a new one.
func (l *ipcLink) takeSent(x *Exchanger, dest int, n int64) (*devalloc.Buffer, error) {
	if b := l.sent[dest]; b != nil {
		delete(l.sent, dest)
		if b.Size() >= n {
			h, err := b.Hold(devalloc.Write)
			if err == nil {
				err = h.Wait()
				err = errors.Join(err, h.Release())
			}
			if err == nil {
				return b, nil
			}
		}
		if err := b.Free(); err != nil {
			return nil, err
		}
	}
	return x.a.AllocPinned(n, x.sendS)
}

// keepSent keeps b, from which a notice to dest was posted, for dest's
// next notice. Its send's hold keeps it from being rewritten until the
// send completes, which every exchange awaits before it returns.
func (l *ipcLink) keepSent(dest int, b *devalloc.Buffer) error { return keepFor(&l.sent, dest, b) }

// keepNotice keeps b, whose notice from src has been read and whose
// receive has completed, for src's next notice.
func (l *ipcLink) keepNotice(src int, b *devalloc.Buffer) error {
	return keepFor(&l.notices, src, b)
}

// keepFor keeps b as peer's buffer in kept, freeing the one it replaces.
func keepFor(kept *map[int]*devalloc.Buffer, peer int, b *devalloc.Buffer) error {
	if old := (*kept)[peer]; old != nil {
		if err := old.Free(); err != nil {
			return err
		}
	}
	if *kept == nil {
		*kept = map[int]*devalloc.Buffer{}
	}
	(*kept)[peer] = b
	return nil
}

// peerWindow is a peer's window as this rank opened it.
type peerWindow struct {
	gen  uint64
	ptr  uintptr
	size int64 // what cuMemGetAddressRange says, not what the peer does
}

// setupIPC decides, collectively over the node-local part of the
// exchanger's communicator, which pairs of ranks move device messages
// through windows: both must have device memory, the transport left at
// TransportAuto and a runtime that shares memory between processes. Every
// rank joins the Allgather, also one that takes no part. It returns nil
// when this rank has no such peer, and why.
func setupIPC(x *Exchanger, wantNCCL bool) (*ipcLink, string, error) {
	local := x.comm.Local()
	var why string
	l := &ipcLink{}
	capable := func() bool {
		switch {
		case wantNCCL || x.o.Transport != TransportAuto:
			why = fmt.Sprintf("transport %v", x.o.Transport)
		case x.a.Info().Backend != devalloc.BackendCUDA:
			why = "the allocator is not on a GPU"
		case local.Size() < 2:
			why = "no other rank on this node"
		default:
			rt, err := cudart.Load()
			if err != nil {
				why = err.Error()
				return false
			}
			caps := rt.Capabilities()
			if !caps.IPC || !caps.AddressRange {
				why = "the CUDA runtime lacks the interprocess functions or cuMemGetAddressRange"
				return false
			}
			l.dev = rt.Device(x.a.Info().Device)
			l.kernelCopies = l.dev.MPSEnabled()
			if err := l.makeEvents(); err != nil {
				why = err.Error()
				return false
			}
			return true
		}
		return false
	}()
	row := make([]int64, ipcSetupWords)
	row[0] = int64(x.rank)
	var probe *readsProbe
	offer, readsWhy := readsOffer(x, wantNCCL)
	if offer {
		probe = newReadsProbe(row) // host memory: never beside the device flag
		// The peers read its word until they have joined setupReads'
		// Allreduce, which returns before this does.
		defer probe.pin.Unpin()
	}
	if capable {
		row[1] = 1
		if err := l.handles(row); err != nil {
			why, capable, row[1] = err.Error(), false, 0
		}
	}
	all := make([]int64, ipcSetupWords*local.Size())
	if err := cluster.Allgather(local, row, all); err != nil {
		l.destroyEvents()
		return nil, "", fmt.Errorf("msg: new: node-local setup: %w", err)
	}
	if err := setupReads(x, local, all, probe, readsWhy); err != nil {
		l.destroyEvents()
		return nil, "", err
	}
	if !capable {
		l.destroyEvents()
		return nil, why, nil
	}
	n := x.size
	l.peers, l.readBy, l.offsets = make([]bool, n), make([]bool, n), make([]int64, n)
	l.peerReady, l.peerConsumed = make([]cudart.IpcEventHandle, n), make([]cudart.IpcEventHandle, n)
	for i := range local.Size() {
		r := all[i*ipcSetupWords : (i+1)*ipcSetupWords]
		rank := int(r[0])
		if rank < 0 || rank >= n {
			l.destroyEvents()
			return nil, "", fmt.Errorf("msg: new: node-local setup: a row names rank %d of %d: %w", rank, n, ErrMalformed)
		}
		if rank == x.rank || r[1]&1 == 0 {
			continue
		}
		l.peers[rank] = true
		l.n++
		l.peerReady[rank], l.peerConsumed[rank] = getHandle(r[2:10]), getHandle(r[10:18])
	}
	if l.n == 0 {
		l.destroyEvents()
		return nil, "no other rank on this node moves device memory through CUDA IPC", nil
	}
	l.openReady, l.openConsumed, l.peerWin = map[int]cudart.Event{}, map[int]cudart.Event{}, map[int]*peerWindow{}
	return l, "", nil
}

func (l *ipcLink) makeEvents() error {
	var err error
	if l.ready, err = l.dev.EventCreateInterprocess(); err != nil {
		return err
	}
	if l.consumed, err = l.dev.EventCreateInterprocess(); err != nil {
		_ = l.dev.EventDestroy(l.ready)
		l.ready = 0
		return err
	}
	return nil
}

// handles writes the events' IPC handles into the setup row.
func (l *ipcLink) handles(row []int64) error {
	for i, ev := range []cudart.Event{l.ready, l.consumed} {
		h, err := l.dev.IpcGetEventHandle(ev)
		if err != nil {
			return err
		}
		for w := range 8 {
			row[2+8*i+w] = int64(binary.LittleEndian.Uint64(h[8*w:]))
		}
	}
	return nil
}

func getHandle(words []int64) cudart.IpcEventHandle {
	var h cudart.IpcEventHandle
	for w := range 8 {
		binary.LittleEndian.PutUint64(h[8*w:], uint64(words[w]))
	}
	return h
}

func (l *ipcLink) destroyEvents() {
	for _, ev := range []cudart.Event{l.ready, l.consumed} {
		if ev != 0 {
			_ = l.dev.EventDestroy(ev)
		}
	}
	l.ready, l.consumed = 0, 0
}

// closeIPC releases the node-local transport, collectively over the node:
// every rank first lets go of what it opened of its peers', then, once all
// have (the barrier, which every rank of the node joins, also one without
// the transport), frees its own windows and events.
func (x *Exchanger) closeIPC() error {
	var errs []error
	l := x.ipc
	if l != nil {
		errs = append(errs, l.closeImports(x))
	}
	if err := x.comm.Local().Barrier(); err != nil {
		errs = append(errs, err)
	}
	if l != nil {
		errs = append(errs, l.freeOwn())
		for _, b := range l.notices {
			errs = append(errs, b.Free())
		}
		for _, b := range l.sent {
			errs = append(errs, b.Free())
		}
		x.ipc = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("msg: close node-local transport: %w", err)
	}
	return nil
}

func (l *ipcLink) closeImports(x *Exchanger) error {
	var errs []error
	if err := x.recvS.Synchronize(); err != nil {
		errs = append(errs, err)
	}
	if err := x.sendS.Synchronize(); err != nil {
		errs = append(errs, err)
	}
	for _, w := range l.peerWin {
		errs = append(errs, l.dev.IpcCloseMemHandle(w.ptr))
	}
	for _, m := range []map[int]cudart.Event{l.openReady, l.openConsumed} {
		for _, ev := range m {
			errs = append(errs, l.dev.EventDestroy(ev))
		}
	}
	return errors.Join(errs...)
}

func (l *ipcLink) freeOwn() error {
	var errs []error
	for _, w := range append(l.retired, l.win) {
		if w != 0 {
			errs = append(errs, l.dev.Free(w))
		}
	}
	l.destroyEvents()
	return errors.Join(errs...)
}

// peer reports whether messages between this rank and r go through windows.
func (x *Exchanger) ipcPeer(r int) bool { return x.ipc != nil && x.ipc.peers[r] }

// pieceCount is how many MPI messages a message of size bytes to or from
// peer travels as: one notice for a window or a read, else its chunks.
func (x *Exchanger) pieceCount(peer int, size int64) int {
	if x.ipcPeer(peer) || x.readPeer(peer) {
		return 1
	}
	return chunkCount(size, x.chunk)
}

// NodeLocalPeers lists the ranks this rank exchanges device messages with
// through CUDA IPC windows rather than MPI.
func (x *Exchanger) NodeLocalPeers() []int {
	var out []int
	if x.ipc != nil {
		for r, ok := range x.ipc.peers {
			if ok {
				out = append(out, r)
			}
		}
	}
	return out
}

// ipcPlace lays this exchange's window messages out, grows the window if
// they do not fit, and makes the send stream wait until the ranks that read
// the window last time are done with it.
func (e *exchange) ipcPlace(byDest []*outMsg) error {
	x, l := e.x, e.x.ipc
	var total int64
	for d, m := range byDest {
		l.offsets[d] = -1
		if m == nil || !l.peers[d] || e.abortTo[d] {
			continue
		}
		l.offsets[d] = total
		total += (m.size + ipcAlign - 1) &^ (ipcAlign - 1)
	}
	if total == 0 {
		return nil
	}
	for r, read := range l.readBy {
		if !read {
			continue
		}
		ev, err := l.peerEvent(l.openConsumed, l.peerConsumed, r)
		if err == nil {
			err = l.dev.StreamWaitEvent(cudart.Stream(x.sendS.Handle()), ev)
		}
		if err != nil {
			return fmt.Errorf("msg: wait until rank %d has read this rank's window: %w", r, err)
		}
	}
	clear(l.readBy)
	if total <= l.winSize {
		return nil
	}
	// A larger window. The old one stays allocated until Close: a peer that
	// opened it keeps it open until it sees the new one.
	size := max(ipcWindowMin, 2*l.winSize, (total+(2<<20)-1)&^(2<<20-1))
	if err := x.sendS.Synchronize(); err != nil {
		return err
	}
	w, err := l.dev.Malloc(size)
	if err != nil {
		return fmt.Errorf("msg: node-local window of %s: %w", bytesize.Format(size), err)
	}
	h, err := l.dev.IpcGetMemHandle(w)
	if err != nil {
		_ = l.dev.Free(w)
		return fmt.Errorf("msg: node-local window: %w", err)
	}
	if l.win != 0 {
		l.retired = append(l.retired, l.win)
	}
	l.win, l.winSize, l.winHandle = w, size, h
	l.gen++
	return nil
}

// peerEvent opens peer r's event from its handle, once.
func (l *ipcLink) peerEvent(open map[int]cudart.Event, handles []cudart.IpcEventHandle, r int) (cudart.Event, error) {
	if ev, ok := open[r]; ok {
		return ev, nil
	}
	ev, err := l.dev.IpcOpenEventHandle(handles[r])
	if err != nil {
		return 0, err
	}
	open[r] = ev
	return ev, nil
}

// prepareIPC copies m into this rank's window and makes its one piece the
// notice: the fixed part, then the manifest.
func (e *exchange) prepareIPC(m *outMsg) (err error) {
	x, l, c := e.x, e.x.ipc, m.c
	p, start, size := int64(m.man.PayloadOffset()), c.Start(), c.Size()
	off := l.offsets[m.dest]
	h := e.header(m.dest)
	if x.o.PayloadChecksum {
		a, s := e.copier(c.Buffer())
		err := readAt(a, s, c.Buffer(), start, size, func(b []byte) error {
			h.HasPayloadChecksum, h.PayloadChecksum = true, wire.Checksum(b)
			return nil
		})
		if err != nil {
			return e.outErr(m.dest, "payload_checksum", err)
		}
	}
	notice, err := l.takeSent(x, m.dest, ipcHead+p)
	if err != nil {
		return e.outErr(m.dest, "notice", err)
	}
	defer func() {
		if err != nil {
			_ = notice.Free()
		}
	}()
	mem, err := notice.Bytes()
	if err != nil {
		return e.outErr(m.dest, "notice", err)
	}
	le := binary.LittleEndian
	le.PutUint64(mem[0:], ipcMagic)
	le.PutUint64(mem[8:], l.gen)
	le.PutUint64(mem[16:], uint64(l.winSize))
	le.PutUint64(mem[24:], uint64(off))
	le.PutUint64(mem[32:], uint64(m.size))
	copy(mem[40:ipcHead], l.winHandle[:])
	m.man.Encode(mem[ipcHead:], h)
	addr, _, _, err := notice.Region()
	if err != nil {
		return e.outErr(m.dest, "notice", err)
	}
	srcAddr, _, _, err := c.Buffer().Region()
	if err != nil {
		return e.outErr(m.dest, "window", err)
	}
	// The blocks, from the send buffer, and the manifest, from the notice:
	// copies on the send stream, declared reads of both, gathered for
	// flushToWindow.
	b := &l.toWindow
	at := b.mark()
	copies := func() error {
		if x.hooks.mangle != nil {
			if err := e.mangleIPC(m, mem[ipcHead:], off); err != nil {
				return err
			}
		} else if size > 0 {
			if src := c.Buffer(); src.Allocator() == x.a {
				rd, err := src.Read(x.sendS)
				if err != nil {
					return err
				}
				b.accesses = append(b.accesses, rd)
				b.add(l.win+uintptr(off+p), srcAddr+uintptr(start), size)
			} else if err := e.copyToWindow(src, start, l.win+uintptr(off+p), size); err != nil {
				return err
			}
		}
		rd, err := notice.Read(x.sendS)
		if err != nil {
			return err
		}
		b.accesses = append(b.accesses, rd)
		b.add(l.win+uintptr(off), addr+ipcHead, p)
		return nil
	}
	if err := copies(); err != nil {
		return e.outErr(m.dest, "window", errors.Join(err, b.undo(at)))
	}
	b.outs = append(b.outs, m)
	m.chunks = resize(m.chunks, 1)
	// The notice is its first ipcHead+p bytes: a kept buffer may be longer.
	m.chunks[0] = outChunk{n: ipcHead + p, buf: notice, keep: true, region: bufRegion{notice, 0, ipcHead + p}}
	m.chunks[0].mem = &m.chunks[0].region
	return nil
}

// flushToWindow enqueues the exchange's copies into this rank's window, all
// on the send stream, before the ready event is recorded. When that fails,
// none of their messages is in the window: it returns them, for an abort
// notice to replace each (abortWindowed).
func (e *exchange) flushToWindow() (failed []*outMsg, err error) {
	x, l := e.x, e.x.ipc
	b := &l.toWindow
	defer b.reset()
	if err := b.flush(l, x.sendS, x.hooks.windowCopyError(true)); err != nil {
		return slices.Clone(b.outs), e.outErr(x.rank, "node-local window", err)
	}
	for _, m := range b.outs {
		l.readBy[m.dest] = true
		x.stats.IPCMessages++
		x.stats.IPCBytes += m.size
	}
	return nil, nil
}

// abortWindowed is the abort notice that replaces m, whose copies into the
// window failed; m's notice is freed (nothing enqueued reads it).
func (e *exchange) abortWindowed(m *outMsg) *outMsg {
	_ = m.chunks[0].buf.Free()
	m.chunks[0] = outChunk{}
	return e.newAbort(m.dest, m.step, m.size)
}

// mangleIPC lets the mangle test hook alter the whole message, as it does
// on the other paths: the manifest in man (the notice's) and the blocks,
// which it then copies into the window through pinned memory.
func (e *exchange) mangleIPC(m *outMsg, man []byte, off int64) error {
	x, l, c := e.x, e.x.ipc, m.c
	p, size := int64(len(man)), c.Size()
	whole := make([]byte, p+size)
	copy(whole, man)
	if size > 0 {
		a, s := e.copier(c.Buffer())
		if err := readAt(a, s, c.Buffer(), c.Start(), size, func(b []byte) error { copy(whole[p:], b); return nil }); err != nil {
			return err
		}
	}
	x.hooks.mangle(m.dest, whole)
	copy(man, whole[:p])
	if size == 0 {
		return nil
	}
	pin, err := x.a.AllocPinned(size, x.sendS)
	if err != nil {
		return err
	}
	mem, err := pin.Bytes()
	if err == nil {
		copy(mem, whole[p:])
		var src uintptr
		if src, _, _, err = pin.Region(); err == nil {
			s := cudart.Stream(x.sendS.Handle())
			err = e.rawCopy(pin, x.sendS, func() error { return l.dev.MemcpyAsync(l.win+uintptr(off+p), src, size, s) })
		}
	}
	return errors.Join(err, pin.Free())
}

// replaceNotice lets the pieces test hook replace the MPI messages of a
// prepared window message: its notice.
func (e *exchange) replaceNotice(m *outMsg) *outMsg {
	ch := &m.chunks[0]
	mem, err := ch.buf.Bytes()
	if err != nil {
		return m
	}
	ps := e.x.hooks.pieces(m.dest, append([]byte(nil), mem[:ch.n]...))
	if ps == nil {
		return m
	}
	m.release()
	return e.newRaw(m.dest, m.step, ps)
}

// rawCopy runs enqueue, which puts a copy reading buf on s, inside a
// declared read of buf, so that buf is not freed or reused before the copy
// has run.
func (e *exchange) rawCopy(buf *devalloc.Buffer, s *devalloc.Stream, enqueue func() error) error {
	rd, err := buf.Read(s)
	if err != nil {
		return err
	}
	return errors.Join(enqueue(), rd.Done())
}

// copyToWindow copies n bytes of src, a buffer of another allocator, from
// off into the window at dst, on the send stream: src is read once its
// writers are done, and held until the copy has run.
func (e *exchange) copyToWindow(src *devalloc.Buffer, off int64, dst uintptr, n int64) error {
	x, l := e.x, e.x.ipc
	s := cudart.Stream(x.sendS.Handle())
	addr, _, _, err := src.Region()
	if err != nil {
		return err
	}
	h, err := src.Hold(devalloc.Read)
	if err != nil {
		return err
	}
	if err = h.Wait(); err == nil {
		if err = l.dev.MemcpyAsync(dst, addr+uintptr(off), n, s); err == nil {
			err = x.sendS.Synchronize()
		}
	}
	return errors.Join(err, h.Release())
}

// ipcReady records the ready event once this exchange's window copies are
// enqueued, before any notice is sent.
func (e *exchange) ipcReady() error {
	l := e.x.ipc
	return l.dev.EventRecord(l.ready, cudart.Stream(e.x.sendS.Handle()))
}

// finishIPC handles a notice once it has arrived: it checks it, opens the
// sender's window and events as needed, accepts the manifest, and copies
// the message from the window into the receive buffer.
func (e *exchange) finishIPC(in *inMsg) {
	x, l, tag := e.x, e.x.ipc, e.x.o.Tag
	ch := &in.chunks[0]
	in.failed = func() error {
		if in.failed != nil {
			return in.failed
		}
		if ch.discarded {
			return e.inErr(in, "receive", fmt.Errorf("%s was drained: %w", in.pieceName(0), distbuf.ErrInvalid))
		}
		mem, err := ch.buf.Bytes()
		if err != nil {
			return e.inErr(in, "notice", err)
		}
		mem = mem[:max(min(ch.got, int64(len(mem))), 0)]
		switch {
		case ch.err != nil || ch.got == wire.AbortSize:
			return e.sizeError(in, 0, mem) // an abort notice is reported as one
		case ch.got < ipcHead+wire.HeaderSize:
			return wireErr(ErrSizeMismatch, in.src, tag, "message_size", "a node-local notice of %d bytes: at least %d expected", ch.got, ipcHead+wire.HeaderSize)
		}
		if p, _ := wire.ManifestSize(mem[ipcHead:]); p > uint64(in.size) || ipcHead+p != uint64(ch.got) {
			return wireErr(ErrSizeMismatch, in.src, tag, "message_size", "the node-local notice has %d bytes, its manifest says %d", ch.got, ipcHead+p)
		}
		le := binary.LittleEndian
		gen, winSize, off, length := le.Uint64(mem[8:]), le.Uint64(mem[16:]), le.Uint64(mem[24:]), le.Uint64(mem[32:])
		switch {
		case le.Uint64(mem[0:]) != ipcMagic:
			return wireErr(ErrMalformed, in.src, tag, "ipc_magic", "%#016x is not a node-local notice", le.Uint64(mem[0:]))
		case length != uint64(in.size):
			return wireErr(ErrSizeMismatch, in.src, tag, "message_size", "the notice places a %d-byte message, %d were announced", length, in.size)
		case off > winSize || length > winSize-off:
			return wireErr(ErrMalformed, in.src, tag, "ipc_offset", "bytes [%d, +%d) lie outside the %d-byte window", off, length, winSize)
		}
		w, err := e.openWindow(in.src, gen, winSize, mem[40:ipcHead])
		if err != nil {
			return err
		}
		if off+length > uint64(w.size) {
			return wireErr(ErrMalformed, in.src, tag, "ipc_window", "bytes [%d, +%d) lie outside the window of %d bytes it opened as", off, length, w.size)
		}
		plan, p, err := e.accept(in, mem[ipcHead:], uint64(in.size))
		if err != nil {
			return err
		}
		ready, err := l.peerEvent(l.openReady, l.peerReady, in.src)
		if err != nil {
			return e.inErr(in, "ipc_event", err)
		}
		dst, _, _, err := in.buf.Region()
		if err != nil {
			return e.inErr(in, "receive buffer", err)
		}
		s := cudart.Stream(x.recvS.Handle())
		wr, err := in.buf.Write(x.recvS)
		if err != nil {
			return e.inErr(in, "receive buffer", err)
		}
		if err := l.dev.StreamWaitEvent(s, ready); err != nil {
			return e.inErr(in, "copy from the window", errors.Join(err, wr.Done()))
		}
		h := in.hdr()
		if !h.HasPayloadChecksum {
			// The copy goes with the others (flushFromWindows).
			b := &l.fromWindows
			b.add(dst+uintptr(in.base), w.ptr+uintptr(off), in.size)
			b.accesses, b.ins = append(b.accesses, wr), append(b.ins, in)
			in.plan, in.p = plan, p
			return nil
		}
		err = l.dev.MemcpyAsync(dst+uintptr(in.base), w.ptr+uintptr(off), in.size, s)
		if err = errors.Join(err, wr.Done()); err != nil {
			return e.inErr(in, "copy from the window", err)
		}
		// The checksum needs the copy now.
		var sum uint32
		if err := readDevice(x.a, x.recvS, in.buf, in.base+int64(p), in.size-int64(p), func(b []byte) error { sum = wire.Checksum(b); return nil }); err != nil {
			return e.inErr(in, "payload_checksum", err)
		}
		if sum != h.PayloadChecksum {
			return wireErr(ErrChecksum, in.src, tag, "payload_checksum", "computed %#08x, header says %#08x", sum, h.PayloadChecksum)
		}
		in.plan, in.p = plan, p
		return nil
	}()
	// The notice was received into exactly its length: no canary to check.
	// Read and its receive done, its buffer serves the source's next one;
	// after a failure it is freed (devalloc defers that while held).
	if ch.buf != nil {
		if in.failed == nil && ch.done {
			if err := l.keepNotice(in.src, ch.buf); err != nil {
				in.failed = e.inErr(in, "notice", err)
			}
		} else {
			_ = ch.buf.Free()
		}
		ch.buf = nil
	}
	if in.failed != nil {
		e.endIn(in)
		return
	}
	e.wrapResult(in, in.plan, int64(in.p))
}

// openWindow returns src's window of generation gen, opening it from the
// handle the first time. The size is the allocation's, as this rank's
// runtime sees it.
func (e *exchange) openWindow(src int, gen, size uint64, handle []byte) (*peerWindow, error) {
	x, l, tag := e.x, e.x.ipc, e.x.o.Tag
	w := l.peerWin[src]
	switch {
	case w != nil && w.gen == gen:
		return w, nil
	case w != nil && gen < w.gen:
		return nil, wireErr(ErrMalformed, src, tag, "ipc_generation", "window generation %d after %d", gen, w.gen)
	case size > math.MaxInt64:
		return nil, wireErr(ErrMalformed, src, tag, "ipc_window", "a window of %d bytes", size)
	}
	if w != nil {
		// This rank's copies from the old window must be over before it
		// lets the mapping go.
		if err := x.recvS.Synchronize(); err != nil {
			return nil, err
		}
		if err := l.dev.IpcCloseMemHandle(w.ptr); err != nil {
			return nil, fmt.Errorf("msg: close rank %d's old window: %w", src, err)
		}
		delete(l.peerWin, src)
	}
	var h cudart.IpcMemHandle
	copy(h[:], handle)
	ptr, err := l.dev.IpcOpenMemHandle(h)
	if err != nil {
		return nil, wireErr(ErrMalformed, src, tag, "ipc_handle", "cannot open rank %d's window: %v", src, err)
	}
	base, real, err := l.dev.AddressRange(ptr)
	if err == nil && base != ptr {
		err = fmt.Errorf("the handle names memory starting %d bytes into an allocation", ptr-base)
	}
	if err != nil {
		_ = l.dev.IpcCloseMemHandle(ptr)
		return nil, wireErr(ErrMalformed, src, tag, "ipc_handle", "rank %d's window: %v", src, err)
	}
	w = &peerWindow{gen: gen, ptr: ptr, size: min(real, int64(size))}
	l.peerWin[src] = w
	return w, nil
}

// flushFromWindows enqueues the copies from peers' windows gathered since
// the last flush, on the receive stream: the data phase flushes after each
// wait that delivered notices, so that the copies of notices that arrive
// together go in one call while later ones are still awaited; under MPS
// only ipcConsumed flushes, so that every peer's copy goes in one launch.
// When the copies cannot be enqueued, every message they carry fails.
func (e *exchange) flushFromWindows() {
	l := e.x.ipc
	b := &l.fromWindows
	if len(b.ins) == 0 {
		return
	}
	defer b.reset()
	if err := b.flush(l, e.x.recvS, e.x.hooks.windowCopyError(false)); err != nil {
		for _, in := range b.ins {
			e.fail(e.inErr(in, "copy from the window", err))
		}
	}
	if e.x.hooks.canary > 0 {
		// The copies have now been enqueued: check around them again.
		for _, in := range b.ins {
			e.checkGuard(in.buf, in.base, in.size, fmt.Sprintf("the receive buffer of the message from rank %d", in.src))
		}
	}
}

// ipcConsumed records the consumed event after this exchange's copies from
// peers' windows: before the agreement, so that it precedes the senders'
// waits for it in the next exchange.
func (e *exchange) ipcConsumed() error {
	l := e.x.ipc
	e.flushFromWindows()
	return l.dev.EventRecord(l.consumed, cudart.Stream(e.x.recvS.Handle()))
}
