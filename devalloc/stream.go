package devalloc

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/distbuf/distbuf"
)

// Stream is an in-order queue of work on one device: a cudaStream_t on the
// CUDA backend, a goroutine on the host backend. Work enqueued on one stream
// runs in order; work on different streams is ordered only through events
// and the buffer ledger. A Stream is owned by its Allocator and destroyed by
// Stream.Close or Allocator.Close. It is safe for concurrent use.
type Stream struct {
	a      *Allocator
	impl   streamImpl
	id     int
	closed atomic.Bool

	// The stream's marks (see mark.go). markMu guards recording and
	// recorded; the allocator's mu guards base and curRefs; epoch is
	// written under both.
	markMu   sync.Mutex
	epoch    atomic.Uint64  // the newest epoch, on the current mark
	base     uint64         // the oldest epoch on the current mark
	curRefs  int            // ledger entries and holds on the current mark
	recorded []recordedMark // recorded marks that entries still stand on

	// Ledger events recorded on the stream are numbered in stream order
	// (recMu makes the record and its number one step), so that a stream
	// that has waited for one of them needs no wait for an earlier one:
	// waited holds, by stream, the newest number this stream has waited
	// for, under waitMu, taken around the check, the wait and the update.
	recMu  sync.Mutex
	recSeq uint64
	waitMu sync.Mutex
	waited map[*Stream]uint64
	// ran is the newest of those numbers the host has seen complete: the
	// host need not wait for or query any earlier one.
	ran atomic.Uint64
}

// ranThrough reports whether the host has seen ledger event seq of s
// complete, or a later one (seq 0 names no event). It counts the wait or
// query this spares.
func (s *Stream) ranThrough(seq uint64) bool {
	if seq != 0 && s.ran.Load() >= seq {
		s.a.c.hostWaitsSkipped.Add(1)
		return true
	}
	return false
}

// sawRan notes that ledger event seq of s has completed, and with it every
// one recorded before it.
func (s *Stream) sawRan(seq uint64) {
	for {
		cur := s.ran.Load()
		if seq <= cur || s.ran.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// recordLedger records an event for the ledger and numbers it.
func (s *Stream) recordLedger() (eventImpl, uint64, error) {
	s.recMu.Lock()
	defer s.recMu.Unlock()
	ev, err := s.impl.record()
	if err != nil {
		return nil, 0, err
	}
	s.recSeq++
	return ev, s.recSeq, nil
}

// waitLedger makes s wait for ev, number seq of stream other, unless s has
// already waited for that one or a later one of other's.
func (s *Stream) waitLedger(other *Stream, ev eventImpl, seq uint64) error {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waited[other] >= seq {
		s.a.c.waitsSkipped.Add(1)
		return nil
	}
	if err := s.impl.wait(ev); err != nil {
		return err
	}
	if s.waited == nil {
		s.waited = map[*Stream]uint64{}
	}
	s.waited[other] = seq
	return nil
}

// Handle is the backend's native handle: the cudaStream_t on CUDA, 0 on host.
// It stays owned by the Stream.
func (s *Stream) Handle() uintptr { return s.impl.handle() }

// Allocator returns the allocator that owns the stream.
func (s *Stream) Allocator() *Allocator { return s.a }

func (s *Stream) enter() error {
	if err := s.a.enter(); err != nil {
		return err
	}
	if s.closed.Load() {
		s.a.exit()
		return fmt.Errorf("devalloc: stream %d: %w", s.id, distbuf.ErrClosed)
	}
	return nil
}

// Record marks the current end of the stream. The event completes once all
// work enqueued before it has run. Release it when done.
func (s *Stream) Record() (*Event, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.a.exit()
	impl, err := s.impl.record()
	if err != nil {
		return nil, fmt.Errorf("devalloc: record event on stream %d: %w", s.id, err)
	}
	return &Event{impl: impl, stream: s}, nil
}

// Wait makes work enqueued on s after this call wait for e. The host does not wait.
func (s *Stream) Wait(e *Event) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.a.exit()
	if err := e.check(); err != nil {
		return err
	}
	if e.stream.a != s.a {
		return fmt.Errorf("devalloc: stream %d: event from another allocator: %w", s.id, distbuf.ErrInvalid)
	}
	if err := s.impl.wait(e.impl); err != nil {
		return fmt.Errorf("devalloc: stream %d wait: %w", s.id, err)
	}
	return nil
}

// Enqueue runs fn on the host in stream order: after all work enqueued
// before it, before all work enqueued after it. fn must not call the CUDA
// API or block on other streams. An error or panic in fn is kept and
// returned by the next Synchronize.
func (s *Stream) Enqueue(fn func() error) error {
	if fn == nil {
		return fmt.Errorf("devalloc: stream %d: nil function: %w", s.id, distbuf.ErrInvalid)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.a.exit()
	if err := s.seal(); err != nil {
		return err
	}
	if err := s.impl.enqueue(fn); err != nil {
		return fmt.Errorf("devalloc: stream %d enqueue: %w", s.id, err)
	}
	return nil
}

// Synchronize blocks until all work enqueued on s has run and returns the
// first error of that work since the last Synchronize. It is a
// synchronisation point: under AggressiveFree the pool may release memory.
func (s *Stream) Synchronize() error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.a.exit()
	s.recMu.Lock()
	recorded := s.recSeq
	s.recMu.Unlock()
	err := s.impl.synchronize()
	s.a.be.syncPoint()
	if err != nil {
		return fmt.Errorf("devalloc: stream %d: %w", s.id, err)
	}
	s.sawRan(recorded)
	return nil
}

// Close waits for the stream's work and destroys it. The allocator's default
// stream cannot be closed except by Allocator.Close.
func (s *Stream) Close() error {
	if s == s.a.defaultS {
		return fmt.Errorf("devalloc: the default stream is closed by Allocator.Close: %w", distbuf.ErrInvalid)
	}
	if err := s.a.enter(); err != nil {
		return err
	}
	defer s.a.exit()
	if s.closed.Swap(true) {
		return fmt.Errorf("devalloc: stream %d: %w", s.id, distbuf.ErrClosed)
	}
	s.a.mu.Lock()
	delete(s.a.streams, s)
	s.a.mu.Unlock()
	return s.impl.destroy()
}

// Event marks a point in a stream. It is owned by whoever recorded it and
// must be released with Release.
type Event struct {
	impl     eventImpl
	stream   *Stream
	released atomic.Bool
}

func (e *Event) check() error {
	if e == nil {
		return fmt.Errorf("devalloc: nil event: %w", distbuf.ErrInvalid)
	}
	if e.released.Load() {
		return fmt.Errorf("devalloc: event used after Release: %w", distbuf.ErrInvalid)
	}
	return nil
}

// Done reports, without blocking, whether the work before the event has run.
func (e *Event) Done() (bool, error) {
	if err := e.check(); err != nil {
		return false, err
	}
	if err := e.stream.a.enter(); err != nil {
		return false, err
	}
	defer e.stream.a.exit()
	done, err := e.impl.query()
	if done && err == nil {
		e.stream.impl.hostFunctionsSeen()
	}
	return done, err
}

// Wait blocks the calling goroutine until the event completes.
func (e *Event) Wait() error {
	if err := e.check(); err != nil {
		return err
	}
	if err := e.stream.a.enter(); err != nil {
		return err
	}
	defer e.stream.a.exit()
	err := e.impl.synchronize()
	if err == nil {
		e.stream.impl.hostFunctionsSeen()
	}
	e.stream.a.be.syncPoint()
	return err
}

// Release destroys the event. Streams already waiting on it keep waiting.
func (e *Event) Release() error {
	if e == nil {
		return fmt.Errorf("devalloc: nil event: %w", distbuf.ErrInvalid)
	}
	if e.released.Swap(true) {
		return fmt.Errorf("devalloc: event released twice: %w", distbuf.ErrInvalid)
	}
	return e.impl.destroy()
}

func (b *Buffer) ref(off int64) memRef {
	r := memRef{addr: b.addr + uintptr(off)}
	if b.hostPtr != nil {
		r.host = unsafe.Add(b.hostPtr, off)
	}
	return r
}

func checkRange(what string, b *Buffer, off, n int64) error {
	if b == nil {
		return fmt.Errorf("devalloc: %s: nil buffer: %w", what, distbuf.ErrInvalid)
	}
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return fmt.Errorf("devalloc: %s: range [%d, %d+%d) outside buffer #%d of %d bytes: %w", what, off, off, n, b.id, b.size, distbuf.ErrInvalid)
	}
	return nil
}

// Copy enqueues a copy of n bytes from src at srcOff to dst at dstOff on s,
// in any direction the backend supports (device, host-backend and pinned
// memory), declaring the read of src and the write of dst in their ledgers.
// Both buffers must belong to s's allocator (an error matching
// distbuf.ErrInvalid otherwise): a copy between two allocators goes through
// memory both reach, as msg's staging does.
func (s *Stream) Copy(dst *Buffer, dstOff int64, src *Buffer, srcOff, n int64) error {
	if err := checkRange("copy destination", dst, dstOff, n); err != nil {
		return err
	}
	if err := checkRange("copy source", src, srcOff, n); err != nil {
		return err
	}
	if dst == src && dstOff < srcOff+n && srcOff < dstOff+n {
		return fmt.Errorf("devalloc: copy within buffer #%d: overlapping ranges: %w", dst.id, distbuf.ErrInvalid)
	}
	// Both buffers must be the stream's allocator's: the ledger orders an
	// access by the events of its own allocator's streams, and a copy
	// between two allocators' memory (another device, or the host backend's
	// memory beside a GPU's) is a staged copy the caller makes through
	// memory both can reach.
	if err := s.checkOwn(dst); err != nil {
		return err
	}
	if err := s.checkOwn(src); err != nil {
		return err
	}
	// Both ledgers are held across the enqueue, so no access can begin in
	// between; two buffers are locked in the order of their IDs.
	first, second := dst, src
	if src.id < dst.id {
		first, second = src, dst
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	if second != first {
		second.mu.Lock()
		defer second.mu.Unlock()
	}
	if err := s.a.lockedEnter(); err != nil {
		return err
	}
	if err := dst.prepare(s, Write); err != nil {
		return err
	}
	if src != dst {
		if err := src.prepare(s, Read); err != nil {
			return err
		}
	}
	err := s.a.be.copyAsync(dst.ref(dstOff), src.ref(srcOff), n, s.impl)
	if src != dst {
		src.ownDone(s, Read)
	}
	dst.ownDone(s, Write)
	if err != nil {
		return fmt.Errorf("devalloc: stream %d copy: %w", s.id, err)
	}
	return nil
}

// Memset enqueues setting n bytes of b at off to val on s.
func (s *Stream) Memset(b *Buffer, off, n int64, val byte) error {
	if err := checkRange("memset", b, off, n); err != nil {
		return err
	}
	if err := s.checkOwn(b); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := s.a.lockedEnter(); err != nil {
		return err
	}
	if err := b.prepare(s, Write); err != nil {
		return err
	}
	err := s.a.be.memsetAsync(b.ref(off), val, n, s.impl)
	b.ownDone(s, Write)
	if err != nil {
		return fmt.Errorf("devalloc: stream %d memset: %w", s.id, err)
	}
	return nil
}

// checkOwn checks that devalloc's own work on b may go on s. The caller
// then enters the close guard with b's lock held (lockedEnter).
func (s *Stream) checkOwn(b *Buffer) error {
	if s == nil {
		return fmt.Errorf("devalloc: nil stream: %w", distbuf.ErrInvalid)
	}
	if err := s.a.checkStream(s); err != nil {
		return err
	}
	if b.allocStream.a != s.a {
		return fmt.Errorf("devalloc: buffer #%d belongs to another allocator than stream %d: %w", b.id, s.id, distbuf.ErrInvalid)
	}
	return nil
}
