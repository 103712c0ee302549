package msg

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/wire"
)

// Node-local host messages (docs/WIRE.md, rule 12). Between two ranks of
// one node that both exchange host memory, the receiver copies a message
// straight out of the sender's send buffer with one process_vm_readv: the
// sender sends through MPI only a notice of where the message lies. Where
// MPI's shared-memory transport has no single-copy mechanism (Open MPI's
// vader with single_copy_mechanism none, as containers often configure
// it), a message otherwise crosses in fragments that both processes copy,
// at a few GB/s; the read is one copy at memory speed.
//
// The sender keeps its buffer under a read hold until the agreement that
// ends the exchange, and a receiver reads only before it joins the
// agreement: so every read is over before the sender may change or free
// the buffer.

const (
	// readsFlag is the flags bit of the node-local setup row (rule 10)
	// with which a rank offers node-local reads.
	readsFlag = 2
)

// readLink is an exchanger's node-local reads: the process of every peer
// whose host messages this rank reads, and which reads this rank's.
type readLink struct {
	pid []int // by rank; 0: not a read peer
}

func (x *Exchanger) readPeer(r int) bool { return x.reads != nil && x.reads.pid[r] != 0 }

// ReadPeers lists the ranks whose messages to this rank, and this rank's
// to them, are read from the sender's memory rather than carried by MPI
// (host memory on one node: docs/WIRE.md, rule 12); when there are none,
// why says why.
func (x *Exchanger) ReadPeers() (peers []int, why string) {
	if x.reads == nil {
		return nil, x.readsWhy
	}
	for r, pid := range x.reads.pid {
		if pid != 0 {
			peers = append(peers, r)
		}
	}
	return peers, ""
}

// readsOffer decides whether this rank offers node-local reads, and says
// why not.
func readsOffer(x *Exchanger, wantNCCL bool) (bool, string) {
	switch {
	case wantNCCL || x.o.Transport != TransportAuto:
		return false, fmt.Sprintf("transport %v", x.o.Transport)
	case x.a.Info().Backend == devalloc.BackendCUDA:
		return false, "the allocator is on a GPU"
	case x.comm.Local().Size() < 2:
		return false, "no other rank on this node"
	}
	if why := peerMemWhy(); why != "" {
		return false, why
	}
	return true, ""
}

// readsProbe is what a rank's setup row shows its peers: its process, and
// a word of its memory with a value only it knows, which a peer must read
// back before any message is read that way.
type readsProbe struct {
	word uint64
	got  uint64         // where this rank reads a peer's word
	pin  runtime.Pinner // word's address goes out as a number
}

func newReadsProbe(row []int64) *readsProbe {
	allowPeerReads()
	p := &readsProbe{word: rand.Uint64() | 1}
	p.pin.Pin(&p.word)
	row[1] |= readsFlag
	row[2], row[3], row[4] = int64(os.Getpid()), int64(uintptr(unsafe.Pointer(&p.word))), int64(p.word)
	return p
}

// setupReads ends the node-local setup for reads, from every rank's row of
// the setup Allgather: when two ranks or more offered reads, every rank of
// the node joins one MPI_Allreduce(MIN) of whether it read the probe word
// of every other rank that offered them (1 when it offered none), and reads
// are used between the offering ranks exactly when every one of them could.
// Every rank computes the same count from the same rows, so all join the
// Allreduce or none do.
func setupReads(x *Exchanger, local *cluster.Comm, rows []int64, probe *readsProbe, why string) error {
	n := x.size
	offering := 0
	for i := range local.Size() {
		if rows[i*ipcSetupWords+1]&readsFlag != 0 {
			offering++
		}
	}
	if offering < 2 {
		if why == "" {
			why = "no other rank on this node offers reads of its host memory"
		}
		x.readsWhy = why
		return nil
	}
	ok := int64(1)
	var pids []int
	if probe != nil {
		pids = make([]int, n)
		for i := range local.Size() {
			r := rows[i*ipcSetupWords : (i+1)*ipcSetupWords]
			rank, pid, addr, want := int(r[0]), int(r[2]), uintptr(r[3]), uint64(r[4])
			if r[1]&readsFlag == 0 || rank == x.rank {
				continue
			}
			probe.got = 0
			err := errors.New("its row names no process")
			if rank >= 0 && rank < n && pid > 0 {
				err = readProcess(pid, unsafe.Pointer(&probe.got), addr, 8)
			}
			if err == nil && probe.got != want {
				err = fmt.Errorf("process %d holds another value there: not rank %d's process (another PID namespace?)", pid, rank)
			}
			if err != nil {
				ok, why = 0, fmt.Sprintf("reading the memory of rank %d: %v", rank, err)
				continue
			}
			pids[rank] = pid
		}
	}
	all := []int64{0}
	err := cluster.Allreduce(local, []int64{ok}, all, cluster.Min)
	if err != nil {
		return fmt.Errorf("msg: new: node-local reads: %w", err)
	}
	switch {
	case all[0] == 0 && ok == 1:
		x.readsWhy = "a rank of this node could not read another's memory (its own exchanger says why)"
	case all[0] == 0 || probe == nil:
		x.readsWhy = why
	default:
		x.reads = &readLink{pid: pids}
	}
	return nil
}

// prepareRead readies m for a peer that reads it: the manifest in place
// before the blocks and a read hold on the buffer kept until the
// agreement, or, for a send buffer in device memory, the whole message
// copied to host memory kept as long; its one MPI message is the notice.
func (e *exchange) prepareRead(m *outMsg) error {
	c := m.c
	buf := c.Buffer()
	p, start := int64(m.man.PayloadOffset()), c.Start()
	var addr uintptr
	if c.Buffer().Location().HostAccessible() {
		if !m.manifestDone {
			m.manifestErr, m.manifestDone = e.writeManifest(m), true
		}
		if m.manifestErr != nil {
			return m.manifestErr
		}
		rh, err := buf.Hold(devalloc.Read)
		if err != nil {
			return e.outErr(m.dest, "payload", err)
		}
		base, _, _, err := buf.Region()
		if err == nil {
			err = rh.Wait()
		}
		if err != nil {
			_ = rh.Release()
			return e.outErr(m.dest, "payload", err)
		}
		e.readHolds = append(e.readHolds, rh)
		addr = base + uintptr(start-p)
	} else {
		if err := e.writeManifest(m); err != nil {
			return err
		}
		whole := make([]byte, m.size)
		a, s := e.copier(buf)
		if err := readDevice(a, s, buf, start-p, m.size, func(b []byte) error { copy(whole, b); return nil }); err != nil {
			return e.outErr(m.dest, "payload", err)
		}
		e.readCopies = append(e.readCopies, whole)
		e.readPin.Pin(unsafe.SliceData(whole)) // its address goes out as a number
		e.x.stats.BytesStaged += m.size
		addr = uintptr(unsafe.Pointer(unsafe.SliceData(whole)))
	}
	notice := make([]byte, wire.ReadNoticeSize)
	wire.EncodeReadNotice(notice, uint64(addr), m.size)
	pin := cluster.PinBytes(notice)
	m.chunks = resize(m.chunks, 1)
	m.chunks[0] = outChunk{n: wire.ReadNoticeSize, mem: pin, pin: pin}
	return nil
}

// replaceReadNotice lets the pieces test hook replace the MPI messages of
// a prepared read message: its notice.
func (e *exchange) replaceReadNotice(m *outMsg) *outMsg {
	ps := e.x.hooks.pieces(m.dest, append([]byte(nil), m.chunks[0].pin.Bytes()...))
	if ps == nil {
		return m
	}
	m.release()
	return e.newRaw(m.dest, m.step, ps)
}

// releaseReads ends, after the agreement, what this rank's messages kept
// for their readers.
func (e *exchange) releaseReads() {
	for _, h := range e.readHolds {
		if err := h.Release(); err != nil {
			e.fail(fmt.Errorf("msg: a send buffer read by a node-local peer: %w", err))
		}
	}
	e.readPin.Unpin()
	clear(e.readHolds)
	clear(e.readCopies)
	e.readHolds, e.readCopies = e.readHolds[:0], e.readCopies[:0]
}

// finishRead reads a message whose notice arrived, then decodes it as a
// message received in place.
func (e *exchange) finishRead(in *inMsg) {
	if in.failed == nil {
		in.failed = e.readMessage(in)
	}
	if in.share != nil && !in.chunks[0].discarded {
		_ = in.share.Release() // the read is over, or will not be (a discarded notice gave it back)
	}
	in.notice = nil
	if in.failed != nil {
		e.endIn(in)
		return
	}
	e.finishDirect(in)
}

// readMessage checks the notice of in (or the abort notice in its place)
// and reads the message it names into in's buffer.
func (e *exchange) readMessage(in *inMsg) error {
	x, tag := e.x, e.x.o.Tag
	ch := &in.chunks[0]
	if ch.err != nil {
		return e.inErr(in, "receive", ch.err)
	}
	if ch.got == wire.AbortSize {
		if err := e.sizeError(in, 0, in.notice); !errors.Is(err, ErrSizeMismatch) {
			return err // an abort notice in place of the read notice
		}
	}
	addr, err := wire.DecodeReadNotice(in.notice[:max(min(ch.got, int64(len(in.notice))), 0)], in.src, tag, in.size)
	if err != nil {
		return err
	}
	if e.agreeing {
		// Its sender may have changed the memory since: the exchange
		// already failed, or this notice would not come so late.
		return e.inErr(in, "node-local read", fmt.Errorf("the notice was matched only after the agreement; the message is not read: %w", ErrTimeout))
	}
	if x.hooks.beforeRead != nil {
		x.hooks.beforeRead(in.src)
	}
	mem, err := in.buf.Bytes()
	if err == nil && (in.base < 0 || in.size > int64(len(mem))-in.base) {
		err = fmt.Errorf("bytes [%d, +%d) outside a receive buffer of %d: %w", in.base, in.size, len(mem), distbuf.ErrInvalid)
	}
	if err != nil {
		return e.inErr(in, "node-local read", err)
	}
	if err := readProcess(x.reads.pid[in.src], unsafe.Pointer(unsafe.SliceData(mem[in.base:])), uintptr(addr), in.size); err != nil {
		if errors.Is(err, syscall.EFAULT) {
			return wireErr(ErrMalformed, in.src, tag, "read_address", "bytes [%#x, +%d) of rank %d's memory cannot be read: %v", addr, in.size, in.src, err)
		}
		return e.inErr(in, "node-local read", err)
	}
	x.stats.HostReads++
	x.stats.HostReadBytes += in.size
	return nil
}
