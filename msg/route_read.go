package msg

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/peermem"
	"github.com/distbuf/distbuf/internal/wire"
)

// readRoute moves host messages between two ranks of one node by reads of
// the sender's memory (docs/WIRE.md, rule 10; the reads are
// internal/peermem's): the receiver copies a message straight out of the
// sender's send buffer with one process_vm_readv, and the sender sends
// through MPI only a notice of where it lies. Where MPI's shared-memory
// transport has no single-copy mechanism (Open MPI's vader with
// single_copy_mechanism none, as containers often configure it), a message
// otherwise crosses in fragments that both processes copy; the read is one
// copy.
//
// The sender keeps its buffer under a read hold until the agreement that
// ends the exchange, and a receiver reads only before it joins the
// agreement: so every read is over before the sender may change or free
// the buffer.
type readRoute struct {
	x     *Exchanger
	probe *peermem.Probe // nil when this rank offers no reads
	why   string
	pid   []int // by rank: the process this rank reads, 0 for none
	// This exchange's: the holds on this rank's send buffers and the host
	// copies of device ones, kept for their readers until the agreement.
	holds  []*devalloc.Hold
	copies [][]byte
	pin    runtime.Pinner
	noSteps
}

// newReadRoute makes the route of a rank that may offer reads (auto: its
// transport allows them), or says why it cannot.
func newReadRoute(x *Exchanger, auto bool) *readRoute {
	r := &readRoute{x: x}
	switch {
	case x.a.Info().Backend == devalloc.BackendCUDA:
		// Device memory: not this route's business.
	case !auto:
		r.why = fmt.Sprintf("reads: transport %v", x.o.Transport)
	case x.comm.Local().Size() < 2:
		r.why = "reads: no other rank on this node"
	default:
		if why := peermem.Unavailable(); why != "" {
			r.why = "reads: " + why
			break
		}
		peermem.AllowReaders()
		r.probe = peermem.NewProbe()
	}
	return r
}

func (r *readRoute) offer(row *wire.SetupRow) {
	if r.probe == nil {
		return
	}
	row.Flags |= wire.SetupReads
	row.PID, row.ProbeAddr, row.ProbeValue = int64(os.Getpid()), uint64(r.probe.Addr()), r.probe.Value()
}

func (r *readRoute) bit() uint64 { return wire.SetupReads }

// check reads the probe word of every other rank that offered reads: a
// process that is not the one that made the word, or one this rank may not
// read, fails it. The words of the ranks that offered reads are read only
// when two rows or more offer them; every rank keeps its own word until the
// checks are known (join).
func (r *readRoute) check(x *Exchanger, rows []wire.SetupRow) (bool, string) {
	if r.probe == nil || offeredBy(rows, wire.SetupReads) < 2 {
		return true, ""
	}
	r.pid = make([]int, x.size)
	ok := true
	for _, row := range rows {
		if row.Flags&wire.SetupReads == 0 || row.Rank == x.rank {
			continue
		}
		if err := peermem.CheckProbe(int(row.PID), uintptr(row.ProbeAddr), row.ProbeValue); err != nil {
			ok, r.why = false, fmt.Sprintf("reads: reading the memory of rank %d: %v", row.Rank, err)
			continue
		}
		r.pid[row.Rank] = int(row.PID)
	}
	return ok, r.why
}

// join ends the setup for reads: two ranks that offered reads read each
// other's messages, both ways, exactly when two rows or more offered them
// and every rank of the node passed its check (all). The rows' rank
// fields are their senders' and their processes distinct
// (wire.DecodeSetupRows), so a process id is read only as the rank that
// sent it.
func (r *readRoute) join(x *Exchanger, rows []wire.SetupRow, all bool) ([]int, string) {
	defer func() {
		if r.probe != nil {
			r.probe.Close()
			r.probe = nil
		}
	}()
	switch {
	case offeredBy(rows, wire.SetupReads) < 2:
		if r.why == "" && r.probe != nil {
			r.why = "reads: no other rank on this node offers reads of its host memory"
		}
		return nil, r.why
	case r.probe == nil:
		return nil, r.why
	case !all:
		r.pid = nil
		if r.why == "" {
			r.why = "reads: a rank of this node could not read another's memory (its own exchanger says why)"
		}
		return nil, r.why
	}
	var peers []int
	for p, pid := range r.pid {
		if pid != 0 {
			peers = append(peers, p)
		}
	}
	return peers, ""
}

func (r *readRoute) kind() Route      { return RouteRead }
func (r *readRoute) pieces(int64) int { return 1 } // the notice, whatever the length

func (r *readRoute) inPlace(e *exchange, m *outMsg) bool {
	return m.c.Buffer().Location().HostAccessible()
}

// prepare readies m for a peer that reads it: the manifest in place before
// the blocks and a read hold on the buffer kept until the agreement, or,
// for a send buffer in device memory, the whole message copied to host
// memory kept as long; its one MPI message is the notice.
func (r *readRoute) prepare(e *exchange, m *outMsg) error {
	c := m.c
	buf := c.Buffer()
	p, start := int64(m.man.PayloadOffset()), c.Start()
	var addr uintptr
	if r.inPlace(e, m) {
		if !m.manifestDone {
			m.manifestErr, m.manifestDone = e.writeManifest(m), true
		}
		if m.manifestErr != nil {
			return m.manifestErr
		}
		rh, err := buf.Hold(devalloc.Read)
		if err != nil {
			return e.x.outErr(m.dest, "payload", err)
		}
		base, _, _, err := buf.Region()
		if err == nil {
			err = rh.Wait()
		}
		if err != nil {
			_ = rh.Release()
			return e.x.outErr(m.dest, "payload", err)
		}
		r.holds = append(r.holds, rh)
		addr = base + uintptr(start-p)
	} else {
		if err := e.writeManifest(m); err != nil {
			return err
		}
		whole := make([]byte, m.size)
		a, s := e.x.copier(buf)
		if err := readDevice(a, s, buf, start-p, m.size, func(b []byte) error { copy(whole, b); return nil }); err != nil {
			return e.x.outErr(m.dest, "payload", err)
		}
		r.copies = append(r.copies, whole)
		r.pin.Pin(unsafe.SliceData(whole)) // its address goes out as a number
		e.x.stats.BytesStaged += m.size
		addr = uintptr(unsafe.Pointer(unsafe.SliceData(whole)))
	}
	notice := make([]byte, wire.ReadNoticeSize)
	wire.EncodeReadNotice(notice, uint64(addr), m.size)
	m.setPieces([][]byte{notice})
	return nil
}

// alloc takes in's buffer, which the read writes from outside the streams,
// under a write hold; its one MPI message is the notice, or an abort
// notice in its place: nothing longer is received.
func (r *readRoute) alloc(e *exchange, in *inMsg) error {
	if err := e.allocHeld(in); err != nil {
		return err
	}
	in.chunks = resize(in.chunks, 1)
	in.chunks[0] = inChunk{n: wire.AbortSize}
	return nil
}

// recvMem is the notice's own Go memory, pinned until it arrives: the
// buffer's write hold stays with the message until it is read.
func (r *readRoute) recvMem(e *exchange, in *inMsg, i int, n int64) (cluster.Memory, cluster.Releaser, error) {
	ch := &in.chunks[i]
	ch.notice = make([]byte, max(n, 1))
	pin := cluster.PinBytes(ch.notice)
	return pin, pin, nil
}

// done reads a message whose notice arrived, then decodes it as a message
// received in place.
func (r *readRoute) done(e *exchange, in *inMsg, i int) {
	if in.failed == nil {
		in.failed = r.read(e, in)
	}
	in.chunks[0].notice = nil
	in.releaseHold() // the read is over, or will not be
	if in.failed != nil {
		e.endIn(in)
		return
	}
	e.finishDirect(in, false)
}

// read checks the notice of in (or the abort notice in its place) and
// reads the message it names into in's buffer.
func (r *readRoute) read(e *exchange, in *inMsg) error {
	tag := e.x.o.Tag
	ch := &in.chunks[0]
	if ch.discarded {
		return e.x.inErr(in, "receive", fmt.Errorf("%s was drained: %w", in.pieceName(0), distbuf.ErrInvalid))
	}
	if ch.err != nil {
		return e.x.inErr(in, "receive", ch.err)
	}
	notice := ch.notice[:max(min(ch.got, int64(len(ch.notice))), 0)]
	if ch.got == wire.AbortSize {
		if err := e.sizeError(in, 0, notice); !errors.Is(err, ErrSizeMismatch) {
			return err // an abort notice in place of the read notice
		}
	}
	addr, err := wire.DecodeReadNotice(notice, in.src, tag, in.size)
	if err != nil {
		return err
	}
	if e.agreeing {
		// Its sender may have changed the memory since: the exchange
		// already failed, or this notice would not come so late.
		return e.x.inErr(in, "node-local read", fmt.Errorf("the notice was matched only after the agreement; the message is not read: %w", ErrTimeout))
	}
	mem, err := in.buf.Bytes()
	if err == nil && (in.base < 0 || in.size > int64(len(mem))-in.base) {
		err = fmt.Errorf("bytes [%d, +%d) outside a receive buffer of %d: %w", in.base, in.size, len(mem), distbuf.ErrInvalid)
	}
	if err != nil {
		return e.x.inErr(in, "node-local read", err)
	}
	if err := peermem.Read(r.pid[in.src], unsafe.Pointer(unsafe.SliceData(mem[in.base:])), uintptr(addr), in.size); err != nil {
		if peermem.IsFault(err) {
			return wireErr(ErrMalformed, in.src, tag, "read_address", "bytes [%#x, +%d) of rank %d's memory cannot be read: %v", addr, in.size, in.src, err)
		}
		return e.x.inErr(in, "node-local read", err)
	}
	return nil
}

// agreed ends what this rank's messages kept for their readers.
func (r *readRoute) agreed(e *exchange) {
	for _, h := range r.holds {
		if err := h.Release(); err != nil {
			e.fail(fmt.Errorf("msg: a send buffer read by a node-local peer: %w", err))
		}
	}
	r.pin.Unpin()
	clear(r.holds)
	clear(r.copies)
	r.holds, r.copies = r.holds[:0], r.copies[:0]
}

func (r *readRoute) close() error {
	if r.probe != nil {
		r.probe.Close()
		r.probe = nil
	}
	return nil
}
