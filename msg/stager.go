package msg

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
)

// The staged route's pipeline. A device message larger than a chunk
// travels through a few pinned slots of one chunk each, reused chunk after
// chunk: the device-to-host copy of chunk i+depth into a slot is enqueued
// as soon as the send of chunk i from it completes, and a slot a chunk was
// received into goes back to the ring once the host-to-device copy out of
// it has run. So the copies out, the sends, the receives and the copies in
// of successive chunks overlap, each stage at its own pace, with a few
// slots in flight per message instead of the whole message in pinned
// memory; and since the slots are reused hot, the staging traffic stays in
// the host's caches rather than going through its memory twice more than
// MPI's own copy.
//
// The slots are the exchanger's (cudaHostAlloc'd, outside the allocator's
// ledger and budget), kept from one exchange to the next; the copies in
// and out of them are declared in the device buffers' ledgers like any
// copy on the exchanger's streams.

// stageDepth is how many chunks of one message are staged ahead of the
// oldest whose send has not completed.
const stageDepth = 4

// maxStageSlot bounds the chunk size the ring serves: a larger chunk (or
// none) stages through the allocator's pinned pool instead.
const maxStageSlot = 64 << 20

// stageSlot is one slot of a ring: a chunk of pinned host memory and the
// event recorded after the last device copy that used it.
type stageSlot struct {
	ptr  unsafe.Pointer
	n    int64
	ev   cudart.Event
	ring *stageRing
}

// Region makes a slot memory MPI may hold until its request completes.
func (s *stageSlot) Region() (uintptr, int64, bool, error) { return uintptr(s.ptr), s.n, false, nil }

func (s *stageSlot) bytes() []byte { return unsafe.Slice((*byte)(s.ptr), s.n) }

// Done reports whether the copy last recorded on the slot has run: when a
// staged chunk may be sent, or the slot reused.
func (s *stageSlot) Done() (bool, error) { return s.ring.dev.EventQuery(s.ev) }

// Wait waits until the copy last recorded on the slot has run.
func (s *stageSlot) Wait() error { return s.ring.dev.EventSynchronize(s.ev) }

// Release does nothing: a slot goes back to its ring with put.
func (s *stageSlot) Release() error { return nil }

// put gives the slot back to its ring.
func (s *stageSlot) put() { s.ring.free = append(s.ring.free, s) }

// stageRing is the free slots of one direction, the most recently freed
// last: taken first, still hot.
type stageRing struct {
	dev  *cudart.Device
	size int64
	free []*stageSlot
	all  []*stageSlot
}

// take returns a free slot whose last copy has run, or a new one.
func (r *stageRing) take() (*stageSlot, error) {
	for i := len(r.free) - 1; i >= 0; i-- {
		s := r.free[i]
		done, err := s.Done()
		if err != nil {
			return nil, err
		}
		if done {
			r.free = append(r.free[:i], r.free[i+1:]...)
			return s, nil
		}
	}
	p, err := r.dev.HostAlloc(r.size, cudart.HostAllocPortable)
	if err != nil {
		return nil, err
	}
	ev, err := r.dev.EventCreate()
	if err != nil {
		return nil, errors.Join(err, r.dev.FreeHost(p))
	}
	s := &stageSlot{ptr: p, n: r.size, ev: ev, ring: r}
	r.all = append(r.all, s)
	return s, nil
}

// close frees every slot once its last copy has run; the caller has
// waited for its sends and receives.
func (r *stageRing) close() error {
	var errs []error
	for _, s := range r.all {
		errs = append(errs, s.Wait(), r.dev.EventDestroy(s.ev), r.dev.FreeHost(s.ptr))
	}
	r.all, r.free = nil, nil
	return errors.Join(errs...)
}

// stager is the staged route's two rings, on the exchanger's device.
type stager struct {
	out, in stageRing
}

// newStager makes the rings for chunks of the given size, or nil when the
// size is beyond what the rings serve or the runtime cannot be had.
func newStager(a *devalloc.Allocator, chunk int64) *stager {
	if chunk > maxStageSlot {
		return nil
	}
	rt, err := cudart.Load()
	if err != nil {
		return nil
	}
	dev := rt.Device(a.Info().Device)
	return &stager{out: stageRing{dev: dev, size: chunk}, in: stageRing{dev: dev, size: chunk}}
}

func (g *stager) close() error {
	if err := errors.Join(g.out.close(), g.in.close()); err != nil {
		return fmt.Errorf("msg: staging memory: %w", err)
	}
	return nil
}

// stagedOut is what a message staged through the ring keeps: where its
// manifest is, and the next chunk to copy out.
type stagedOut struct {
	man  []byte
	next int
}

// stageOut enqueues the copy of the next chunk of m into a slot of the
// ring, on the send stream, and records the slot's event after it: the
// manifest's bytes from the host, the blocks' from the device.
func (r *mpiRoute) stageOut(e *exchange, m *outMsg) error {
	x, st := e.x, m.staged
	i := st.next
	ch := &m.chunks[i]
	if ch.posted {
		return nil // released: the message goes no further
	}
	slot, err := r.stage.out.take()
	if err != nil {
		return err
	}
	st.next++
	ch.mem, ch.ready, ch.slot = cluster.Sub(slot, 0, ch.n), slot, slot
	p := int64(len(st.man))
	mem := slot.bytes()
	if ch.off < p {
		copy(mem, st.man[ch.off:min(ch.off+ch.n, p)])
	}
	if end := ch.off + ch.n; end > p {
		from := max(ch.off, p)
		if err := declaredCopy(slot.ring.dev, x.sendS, m.c.Buffer(), m.c.Start()+from-p, uintptr(slot.ptr)+uintptr(from-ch.off), end-from, devalloc.Read); err != nil {
			return err
		}
		x.stats.BytesStaged += end - from
	}
	return slot.ring.dev.EventRecord(slot.ev, cudart.Stream(x.sendS.Handle()))
}

// declaredCopy enqueues on s the copy of n bytes between buf, from its
// byte off, and the raw memory at other: out of buf (mode Read) or into it
// (Write), declared in buf's ledger as that access.
func declaredCopy(dev *cudart.Device, s *devalloc.Stream, buf *devalloc.Buffer, off int64, other uintptr, n int64, mode devalloc.Mode) error {
	addr, acc, err := declared(buf, s, mode)
	if err != nil {
		return err
	}
	dst, src := other, addr+uintptr(off)
	if mode == devalloc.Write {
		dst, src = src, other
	}
	return errors.Join(dev.MemcpyAsync(dst, src, n, cudart.Stream(s.Handle())), acc.Done())
}

// declared is buf's address and an access of the given mode to it,
// declared on s, for a copy the caller enqueues there before Done.
func declared(buf *devalloc.Buffer, s *devalloc.Stream, mode devalloc.Mode) (uintptr, *devalloc.Access, error) {
	addr, _, _, err := buf.Region()
	if err != nil {
		return 0, nil, err
	}
	acc, err := buf.Read(s)
	if mode == devalloc.Write {
		acc, err = buf.Write(s)
	}
	return addr, acc, err
}

// sent gives the slot of a chunk of m whose send completed back to the
// ring, and stages m's next chunk into it.
func (r *mpiRoute) sent(e *exchange, m *outMsg, i int) {
	ch := &m.chunks[i]
	if ch.slot == nil {
		return
	}
	ch.slot.put()
	ch.slot = nil
	if st := m.staged; st != nil && st.next < len(m.chunks) {
		if err := r.stageOut(e, m); err != nil {
			e.fail(e.x.outErr(m.dest, "staging", err))
			m.release()
		}
	}
}
