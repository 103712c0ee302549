package msg

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/nccl"
	"github.com/distbuf/distbuf/packing"
)

// ncclLink is an exchanger's NCCL communicator: with TransportNCCL, every
// message between two ranks goes GPU to GPU through it, as ncclSend and
// ncclRecv pairs of one group on the exchanger's send stream.
//
// NCCL cannot cancel a posted receive, and a send waits on the stream until
// its receive is posted: so every rank must post exactly what its peers
// expect. The link keeps that true in three ways. Sends are prepared before
// the count exchange, so a rank that fails announces -1 and nobody expects
// its messages. A learned Pattern still exchanges counts, for the same
// reason. A receiver that cannot allocate a buffer receives into drain, a
// buffer of one chunk allocated with the link, chunk after chunk: device
// memory of the link's own (cudaMalloc), outside the allocator's ledger
// and budget.
type ncclLink struct {
	comm  *nccl.Comm
	chunk int64
	dev   *cudart.Device
	drain uintptr
}

// ncclChunk is the largest single NCCL transfer: the size of the drain
// buffer, and the unit messages are cut into.
const ncclChunk = 64 << 20

// openNCCL sets up the link, collectively over comm, each collective
// bounded by timeout. It returns nil and the reason when some rank cannot
// use NCCL: the allocator is not device memory, libnccl does not load, or
// ranks of one node share a GPU (NCCL wants one GPU per rank). Errors are
// failures of the collectives, a rank's row that breaks the format, or
// NCCL's own once every rank agreed to use it.
func openNCCL(comm *cluster.Comm, a *devalloc.Allocator, timeout time.Duration) (*ncclLink, string, error) {
	why := ""
	var lib *nccl.Lib
	var dev *cudart.Device
	var drain uintptr
	switch {
	case a.Info().Backend != devalloc.BackendCUDA:
		why = fmt.Sprintf("the allocator's memory is %s, not device memory", a.Info().Backend)
	default:
		var err error
		if lib, err = nccl.Load(); err != nil {
			why = err.Error()
		} else if dev, drain, err = drainBuffer(a.Info().Device); err != nil {
			why = fmt.Sprintf("no drain buffer: %v", err)
		}
	}
	ok := false
	defer func() {
		if !ok && drain != 0 {
			_ = dev.Free(drain)
		}
	}()
	// One row per rank, at its own place: whether it cannot use NCCL, its
	// GPU, and its node (the world rank of the node's first rank).
	row := []int64{0, int64(a.Info().Device), int64(comm.Local().WorldRanks()[0])}
	if why != "" {
		row[0], row[1] = 1, -1
	}
	all := make([]int64, 3*comm.Size())
	if err := cluster.AllgatherWithin(comm, row, all, timeout); err != nil {
		return nil, "", stepError("nccl setup", err)
	}
	if verdict, err := ncclVerdict(all, comm.Size()); verdict != "" || err != nil {
		if why == "" {
			why = verdict // else this rank's own reason says more
		}
		return nil, why, err
	}
	id := make([]byte, nccl.UniqueIDBytes)
	var idErr error
	if comm.Rank() == 0 {
		id, idErr = lib.UniqueID()
	}
	// Rank 0 failing to make an id must not leave the others in Bcast
	// alone: the flag travels with the id.
	msgBuf := append([]byte{0}, id...)
	if idErr != nil {
		msgBuf[0] = 1
	}
	if err := cluster.BcastWithin(comm, msgBuf, 0, timeout); err != nil {
		return nil, "", stepError("nccl setup: the unique id", err)
	}
	if msgBuf[0] != 0 {
		if idErr == nil {
			idErr = errors.New("rank 0 could not make the NCCL unique id")
		}
		return nil, "", fmt.Errorf("msg: nccl: %w", idErr)
	}
	c, err := lib.NewComm(msgBuf[1:], comm.Size(), comm.Rank(), a.Info().Device)
	if err != nil {
		return nil, "", fmt.Errorf("msg: nccl: %w", err)
	}
	ok = true
	return &ncclLink{comm: c, chunk: ncclChunk, dev: dev, drain: drain}, "", nil
}

// ncclVerdict reads the NCCL setup's rows (docs/WIRE.md, rule 8): why NCCL
// is not used, "" when every rank can use it on a GPU no other rank of its
// node has; an error naming the first rank whose row breaks the format.
func ncclVerdict(all []int64, size int) (string, error) {
	type gpu struct{ node, dev int64 }
	owner := map[gpu]int{}
	cannot := 0
	var shared string
	for r := range size {
		v := all[3*r : 3*r+3]
		switch {
		case v[0] != 0 && v[0] != 1, v[0] == 0 && (v[1] < 0 || v[1] > math.MaxInt32), v[0] == 1 && v[1] != -1, v[2] < 0 || v[2] > math.MaxInt32:
			return "", fmt.Errorf("msg: nccl setup: rank %d's row %v breaks the format: %w", r, v, ErrMalformed)
		case v[0] == 1:
			cannot++
			continue
		}
		g := gpu{v[2], v[1]}
		if other, ok := owner[g]; ok && shared == "" {
			shared = fmt.Sprintf("ranks %d and %d share GPU %d of their node, and NCCL needs one GPU per rank", other, r, v[1])
		}
		owner[g] = r
	}
	switch {
	case cannot > 0:
		return fmt.Sprintf("%d of %d ranks cannot use NCCL", cannot, size), nil
	case shared != "":
		return shared, nil
	}
	return "", nil
}

// drainBuffer allocates the drain buffer on device ord.
func drainBuffer(ord int) (*cudart.Device, uintptr, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, 0, err
	}
	dev := rt.Device(ord)
	p, err := dev.Malloc(ncclChunk)
	return dev, p, err
}

func (l *ncclLink) close() error {
	return errors.Join(l.comm.Close(), l.dev.Free(l.drain))
}

// ncclTransport runs exchanges over an NCCL link.
type ncclTransport struct {
	x    *Exchanger
	link *ncclLink
}

func (t *ncclTransport) close() error { return t.link.close() }

// exchange runs e over the link. The protocol differs from the
// MPI one only where NCCL requires: every send is prepared (manifest
// written, host buffers copied to the device) before the count exchange,
// the counts are exchanged even with a learned pattern, and everything
// moves in one NCCL group, after which the stream is synchronised. The
// messages are byte for byte those of docs/WIRE.md; received buffers are
// checked and wrapped exactly as device buffers received through a
// CUDA-aware MPI.
func (t *ncclTransport) exchange(e *exchange, send []*packing.Coalesced) (*Received, error) {
	x, pat, link := t.x, e.pat, t.link
	n := x.size
	localErr := e.collect(send)
	byDest := e.byDest
	if localErr == nil && pat != nil && pat.learned {
		localErr = t.departures(e)
	}
	// Prepared sends, released (holds, device copies) once the group has
	// completed or the exchange ends early.
	var staged []*devalloc.Buffer
	var holds []cluster.Releaser
	release := func() error {
		var errs []error
		for _, h := range holds {
			errs = append(errs, h.Release())
		}
		for _, b := range staged {
			errs = append(errs, b.Free())
		}
		holds, staged = nil, nil
		return errors.Join(errs...)
	}
	type transfer struct {
		addr uintptr
		size int64
		peer int
	}
	var sends []transfer
	if localErr == nil {
		// Every manifest before any read hold: send buffers may be parts
		// of one joined buffer (see writeManifests).
		for d, m := range byDest {
			if m != nil && (d != x.rank || x.o.SelfViaMPI) {
				m.manifestErr, m.manifestDone = e.writeManifest(m), true
			}
		}
		for d, m := range byDest {
			if m == nil || (d == x.rank && !x.o.SelfViaMPI) {
				continue
			}
			addr, h, tmp, err := t.prepare(e, m)
			if err != nil {
				localErr = err
				break
			}
			holds = append(holds, h)
			if tmp != nil {
				staged = append(staged, tmp)
			}
			sends = append(sends, transfer{addr, m.size, d})
		}
	}
	recvSize := e.recvSize
	e.announce(localErr != nil)
	if err := x.coll.counts(e.sendSize, recvSize, x.lim.timeout); err != nil {
		return nil, errors.Join(localErr, release(), stepError("count exchange", err))
	}
	x.stats.CountExchanges++
	e.fail(localErr)
	if localErr != nil {
		clear(recvSize)
	}
	e.checkCounts()
	// NCCL cannot cancel a posted transfer, so the ranks decide together
	// whether the group runs at all: not if any rank failed or refused a
	// length (docs/WIRE.md, rule 8). Each rank's vote sits at its own
	// place: a rank can name no other.
	vote, votes := []int64{0}, make([]int64, n)
	if e.errs.own() {
		vote[0] = 1
	}
	if err := cluster.AllgatherWithin(x.comm, vote, votes, x.lim.timeout); err != nil {
		e.fail(stepError("nccl vote", err))
		e.fail(release())
		return e.deliver()
	}
	if f := slices.IndexFunc(votes, func(v int64) bool { return v != 0 }); f >= 0 {
		switch {
		case votes[f] != 1:
			e.fail(wireErr(ErrMalformed, f, x.o.Tag, "vote", "rank %d voted %d (0 or 1) before the NCCL transfer, which no rank runs", f, votes[f]))
		case f != x.rank && !e.errs.names(f):
			e.fail(wireErr(ErrPeerAborted, f, x.o.Tag, "count", "rank %d failed or refused a length before the NCCL transfer, which no rank runs (its own error says why)", f))
		}
		e.fail(release())
		return e.deliver()
	}

	// Receives: a pooled device buffer per source under a write hold, or
	// the drain buffer when none can be had.
	var recvs []transfer
	for k := range n {
		s := (x.rank - k + n) % n
		if recvSize[s] <= 0 || (s == x.rank && !x.o.SelfViaMPI) {
			continue
		}
		in := e.newIn()
		in.src, in.step, in.size, in.route = s, k, recvSize[s], x.routes[s]
		in.chunks = append(in.chunks[:0], inChunk{n: recvSize[s], got: recvSize[s]})
		x.stats.MPIRecvs++ // one logical receive, counted as MPI's are
		addr, h, err := t.alloc(e, in)
		if err != nil {
			// Received piece by piece into the drain buffer and dropped:
			// the message ends here, its failure reported, and its pieces
			// count as drained.
			e.fail(e.x.inErr(in, "receive buffer", err))
			in.drain, in.ended = true, true
			for off := int64(0); off < in.size; off += link.chunk {
				recvs = append(recvs, transfer{link.drain, min(link.chunk, in.size-off), s})
				x.stats.Drained++
			}
			continue
		}
		holds = append(holds, h)
		e.ins = append(e.ins, in)
		recvs = append(recvs, transfer{addr, in.size, s})
	}
	var ns, nr []nccl.Transfer
	cut := func(ts []transfer, out []nccl.Transfer) []nccl.Transfer {
		for _, t := range ts {
			for off := int64(0); off < t.size; off += link.chunk {
				out = append(out, nccl.Transfer{Addr: t.addr + uintptr(off), Bytes: min(link.chunk, t.size-off), Peer: t.peer})
			}
		}
		return out
	}
	ns, nr = cut(sends, ns), cut(recvs, nr)
	err := link.comm.SendRecv(x.sendS.Handle(), ns, nr)
	if err == nil {
		err = x.sendS.Synchronize()
	}
	if err != nil {
		// NCCL failed: the communicator cannot be trusted with another group.
		e.fail(fmt.Errorf("msg: nccl transfer: %w", err))
	}
	e.fail(release())
	x.stats.NCCLTransfers += int64(len(ns))
	if m := byDest[x.rank]; m != nil && !x.o.SelfViaMPI {
		e.copyToSelf(m)
	}
	for _, in := range e.ins {
		if err == nil {
			e.finishDirect(in, true)
		} else {
			_ = in.buf.Free()
			in.ended = true
		}
	}
	e.agree()
	return e.deliver()
}

// departures checks this rank's messages against a learned pattern before
// anything is announced: under NCCL a departure must stop the exchange
// before the count exchange, as no posted receive can be cancelled.
func (t *ncclTransport) departures(e *exchange) error {
	var errs []error
	for d, m := range e.byDest {
		if w := e.pat.departure(d, m, e.x.o.Tag); w != nil {
			errs = append(errs, w)
		}
	}
	return errors.Join(errs...)
}

// prepareNCCL writes m's manifest in front of its blocks and returns the
// device address of the whole message and the hold that keeps the memory
// NCCL reads from being freed or written before the group completes. A
// host-accessible buffer is copied into a pooled device buffer first
// (returned as tmp, for the caller to free).
func (t *ncclTransport) prepare(e *exchange, m *outMsg) (addr uintptr, h cluster.Releaser, tmp *devalloc.Buffer, err error) {
	x, c := e.x, m.c
	device := !c.Buffer().Location().HostAccessible()
	if err := e.prepareInPlace(m); err != nil {
		return 0, nil, nil, err
	}
	// prepareInPlace left one read hold for the message's chunks: the
	// group is one user of it.
	hold := m.share.r
	p := int64(m.man.PayloadOffset())
	src := c.Buffer()
	off := c.Start() - p
	if !device {
		if tmp, err = x.a.Alloc(m.size, x.sendS); err == nil {
			if src.Allocator() == x.a {
				err = x.sendS.Copy(tmp, 0, src, off, m.size)
			} else {
				err = e.x.copyAcross(tmp, 0, src, off, m.size)
			}
			if err == nil {
				var wh *devalloc.Hold
				if wh, err = tmp.Hold(devalloc.Read); err == nil {
					if err = wh.Wait(); err != nil {
						_ = wh.Release()
					}
				}
				if err == nil {
					err = hold.Release() // the copy reads the host buffer now, in its ledger
					hold, src, off = wh, tmp, 0
				}
			}
			if err != nil {
				_ = tmp.Free()
				tmp = nil
			}
		}
		if err != nil {
			return 0, nil, nil, errors.Join(e.x.outErr(m.dest, "staging", err), hold.Release())
		}
	}
	base, _, _, err := src.Region()
	if err != nil {
		if tmp != nil {
			_ = tmp.Free()
		}
		return 0, nil, nil, errors.Join(e.x.outErr(m.dest, "payload", err), hold.Release())
	}
	return base + uintptr(off), hold, tmp, nil
}

// allocNCCL takes in's device buffer and a write hold on it, waited for, so
// that NCCL writes after whatever the pool's earlier use of the memory
// queued.
func (t *ncclTransport) alloc(e *exchange, in *inMsg) (uintptr, cluster.Releaser, error) {
	x := e.x
	buf, err := x.a.Alloc(in.size, x.recvS)
	if err != nil {
		return 0, nil, err
	}
	h, err := buf.Hold(devalloc.Write)
	if err == nil {
		if err = h.Wait(); err != nil {
			_ = h.Release()
		}
	}
	var addr uintptr
	if err == nil {
		if addr, _, _, err = buf.Region(); err != nil {
			_ = h.Release()
		}
	}
	if err != nil {
		return 0, nil, errors.Join(err, buf.Free())
	}
	in.buf = buf
	return addr, h, nil
}
