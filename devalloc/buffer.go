package devalloc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/bytesize"
)

// Mode is the kind of access work makes to a buffer.
type Mode int

const (
	Read  Mode = iota + 1 // reads the buffer: waits for its last writer (an MPI send holds it so)
	Write                 // writes it: waits for the last writer and every reader since (an MPI receive)
)

func (m Mode) String() string {
	switch m {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

type bufState uint8

const (
	stateLive    bufState = iota
	stateFreeing          // Free was called; waiting for outside holds to be released
	stateFreed            // the free is enqueued; memory goes back once its completions are done
)

// entry is one completion in a buffer's ledger, held by value: a stream's
// mark (s and epoch), an event recorded after a declared access, or an
// outside agent's hold (c). The zero entry stands for nothing.
type entry struct {
	s     *Stream // the mark's stream; nil for c
	epoch uint64
	c     *completion
}

func (e entry) isMark() bool { return e.s != nil }

// stream is the stream whose work the entry stands for, nil for a hold or nothing.
func (e entry) stream() *Stream {
	if e.c != nil {
		return e.c.stream
	}
	return e.s
}

// release drops the entry's reference.
func (e entry) release() {
	switch {
	case e.s != nil:
		e.s.dropMark(e.epoch)
	case e.c != nil:
		e.c.unref()
	}
}

// addRef takes one more reference on what the entry stands on.
func (e entry) addRef() {
	switch {
	case e.s != nil:
		e.s.addMarkRef(e.epoch)
	case e.c != nil:
		e.c.refs++
	}
}

// completion is the end of declared work (an event on a stream) or an
// outside agent's hold, shared by the ledger and the holds that wait for it.
// Guarded by the buffer's lock.
type completion struct {
	stream *Stream
	ev     eventImpl
	seq    uint64 // the event's number on stream (Stream.recordLedger)
	hold   *Hold
	refs   int // ledger entries and holds that point at it; the event is destroyed at 0
}

func (c *completion) unref() {
	c.refs--
	if c.refs == 0 && c.ev != nil {
		_ = c.ev.destroy()
		c.ev = nil
	}
}

// Buffer is one allocation. The Allocator owns its memory; the caller owns
// the Buffer until Free, after which every method returns distbuf.ErrFreed.
//
// The ledger orders access across streams and outside agents (the "token
// pins storage" rule): a read waits for the last writer, a write waits for the
// last writer and every reader since, and the memory is released only after
// all of them. Methods are safe for concurrent use.
type Buffer struct {
	allocStream *Stream // its allocator is the buffer's
	id          uint64
	size        int64
	addr        uintptr
	hostPtr     unsafe.Pointer
	slot        uint32 // in the allocator's live buffers, under its mu
	// Small fields, packed beside slot: a smaller Buffer is a cheaper
	// allocation and less for the collector to scan.
	loc         uint8 // a Location
	pinnedClass uint8

	mu     sync.Mutex
	state  bufState
	writer entry
	more   *bufferMore // nil until a reader, an open access, a hold or a label
}

// bufferMore is the part of a buffer's ledger that a buffer allocated,
// filled and freed on one stream never needs.
type bufferMore struct {
	readers []entry
	open    []*Access
	holds   []*Hold
}

// aligned is the size of device or host-backend memory the buffer holds; a
// pinned buffer holds its block instead.
func (b *Buffer) aligned() int64 { return alignUp(b.size, allocAlign) }

func (b *Buffer) ext() *bufferMore {
	if b.more == nil {
		b.more = &bufferMore{}
	}
	return b.more
}

func (b *Buffer) readers() []entry {
	if b.more == nil {
		return nil
	}
	return b.more.readers
}

func (b *Buffer) holdCount() int {
	if b.more == nil {
		return 0
	}
	return len(b.more.holds)
}

// ID is unique within the allocator; leak reports name buffers by it.
func (b *Buffer) ID() uint64 { return b.id }

// Size is the number of bytes requested.
func (b *Buffer) Size() int64 { return b.size }

// Location says where the memory lives.
func (b *Buffer) Location() Location { return Location(b.loc) }

// Allocator returns the allocator that owns the buffer.
func (b *Buffer) Allocator() *Allocator { return b.allocStream.a }

func (b *Buffer) checkLive() error {
	if b.state != stateLive {
		return fmt.Errorf("devalloc: buffer #%d (%s): %w", b.id, bytesize.Format(b.size), distbuf.ErrFreed)
	}
	return nil
}

// Bytes is a Go view of host-accessible memory (OnHost and Pinned). The
// slice must not be used after Free, and reading or writing it from the host
// must be ordered like any other access: inside Stream.Enqueue between Read
// or Write and Access.Done, or after a Hold's Wait. On device memory it
// returns an error matching distbuf.ErrNotHostAccessible.
func (b *Buffer) Bytes() ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return nil, err
	}
	if b.hostPtr == nil {
		return nil, fmt.Errorf("devalloc: buffer #%d is %s memory, not addressable from Go: %w", b.id, Location(b.loc), distbuf.ErrNotHostAccessible)
	}
	return unsafe.Slice((*byte)(b.hostPtr), b.size), nil
}

// Region describes the memory for code that hands it to C, CUDA or MPI:
// its address (a device pointer for OnDevice buffers, a host pointer
// otherwise), its length in bytes, and whether it is device memory. C may
// hold the address until the buffer is freed; use a Hold to stop the free
// from releasing it earlier. After Free it returns an error matching
// distbuf.ErrFreed.
func (b *Buffer) Region() (addr uintptr, size int64, device bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return 0, 0, false, err
	}
	return b.addr, b.size, Location(b.loc) == OnDevice, nil
}

// Access is an open declaration that work enqueued on a stream touches a
// buffer. Call Done once the work is enqueued.
type Access struct {
	b    *Buffer
	s    *Stream
	mode Mode
	done bool
}

// Read declares that work about to be enqueued on s reads the buffer. It
// makes s wait for the last writer. Call Done on the result once the work is
// enqueued.
func (b *Buffer) Read(s *Stream) (*Access, error) { return b.begin(s, Read) }

// Write declares that work about to be enqueued on s writes the buffer. It
// makes s wait for the last writer and for every reader since. Call Done on
// the result once the work is enqueued.
func (b *Buffer) Write(s *Stream) (*Access, error) { return b.begin(s, Write) }

func (b *Buffer) begin(s *Stream, mode Mode) (*Access, error) {
	if err := b.allocStream.a.enter(); err != nil {
		return nil, err
	}
	defer b.allocStream.a.exit()
	if err := b.allocStream.a.checkStream(s); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.prepare(s, mode); err != nil {
		return nil, err
	}
	// What the caller enqueues may wait for an agent outside the stream:
	// no mark recorded later may cover it.
	if err := s.seal(); err != nil {
		return nil, err
	}
	x := &Access{b: b, s: s, mode: mode}
	m := b.ext()
	m.open = append(m.open, x)
	return x, nil
}

// prepare checks that an access of the given mode on s may start and makes
// s wait for what it must follow. Called with b.mu held.
func (b *Buffer) prepare(s *Stream, mode Mode) error {
	if err := b.checkLive(); err != nil {
		return err
	}
	if b.more != nil {
		for _, o := range b.more.open {
			if o.s != s && (mode == Write || o.mode == Write) {
				return fmt.Errorf("devalloc: buffer #%d: %s on stream %d while a %s on stream %d is open (call Done after enqueueing): %w",
					b.id, mode, s.id, o.mode, o.s.id, distbuf.ErrConflict)
			}
		}
		if mode == Write {
			for _, h := range b.more.holds {
				if h.mode == Write {
					return fmt.Errorf("devalloc: buffer #%d: write on stream %d while an outside writer holds it: %w", b.id, s.id, distbuf.ErrConflict)
				}
			}
		}
	}
	return b.orderAfter(s, mode)
}

// orderAfter makes s wait for what an access of the given mode must follow.
func (b *Buffer) orderAfter(s *Stream, mode Mode) error {
	if err := b.waitIn(s, b.writer); err != nil {
		return err
	}
	if mode == Write {
		for _, r := range b.readers() {
			if err := b.waitIn(s, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// event is the event to wait on for e and its number on its stream,
// recording a mark if needed; nil when there is nothing to wait for (a
// closed stream's work has all run).
func (e entry) event() (eventImpl, uint64, error) {
	if e.s != nil {
		if e.s.closed.Load() {
			return nil, 0, nil
		}
		return e.s.markEvent(e.epoch)
	}
	return e.c.ev, e.c.seq, nil
}

func (b *Buffer) waitIn(s *Stream, e entry) error {
	switch {
	case e.s == nil && e.c == nil:
		return nil
	case e.c != nil && e.c.hold != nil:
		h := e.c.hold
		if h.released() {
			return nil
		}
		if err := s.seal(); err != nil {
			return err
		}
		if err := s.impl.waitHost(h.done); err != nil {
			return fmt.Errorf("devalloc: buffer #%d: stream %d cannot wait for an outside hold: %w", b.id, s.id, err)
		}
		return nil
	case e.stream() == s:
		return nil // same stream: already in order
	case e.c != nil && e.c.stream.closed.Load():
		return nil // a closed stream's work has all run
	}
	ev, seq, err := e.event()
	if err != nil || ev == nil {
		return err
	}
	if err := s.waitLedger(e.stream(), ev, seq); err != nil {
		return fmt.Errorf("devalloc: buffer #%d: stream %d wait: %w", b.id, s.id, err)
	}
	return nil
}

// isDone reports, for an entry that is not a mark, whether it has completed.
func (e entry) isDone() bool {
	switch {
	case e.c == nil:
		return false
	case e.c.hold != nil:
		return e.c.hold.released()
	case e.c.ev != nil:
		st := e.c.stream
		if st != nil && st.ranThrough(e.c.seq) {
			return true
		}
		done, err := e.c.ev.query()
		if err == nil && done && st != nil {
			st.sawRan(e.c.seq)
		}
		return err == nil && done
	}
	return false
}

// Done records the end of the declared work. It is an error to call it twice.
func (x *Access) Done() error {
	b := x.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if x.done {
		return fmt.Errorf("devalloc: buffer #%d: %s access on stream %d already done: %w", b.id, x.mode, x.s.id, distbuf.ErrInvalid)
	}
	if err := b.checkLive(); err != nil {
		return err
	}
	return b.close(x)
}

// DoneAll records the end of the declared work of several accesses on one
// stream, enqueued together: what Done does for each of them, with one
// event recorded for all (Done records one each, and each record is a
// driver call). Every access must be open and on the stream of the first;
// otherwise nothing is recorded, and the error names the first that is not.
// Nil accesses are skipped.
func DoneAll(xs ...*Access) error {
	var s *Stream
	n := 0
	for _, x := range xs {
		if x == nil {
			continue
		}
		if s == nil {
			s = x.s
		}
		if err := x.checkOpen(s); err != nil {
			return err
		}
		n++
	}
	switch n {
	case 0:
		return nil
	case 1:
		for _, x := range xs {
			if x != nil {
				return x.Done()
			}
		}
	}
	impl, seq, err := s.recordLedger()
	if err != nil {
		return fmt.Errorf("devalloc: record the end of %d accesses on stream %d: %w", n, s.id, err)
	}
	s.a.c.ledgerEvents.Add(1)
	ev := &sharedEvent{eventImpl: impl}
	ev.refs.Store(int32(n))
	var errs []error
	for _, x := range xs {
		if x == nil {
			continue
		}
		b := x.b
		b.mu.Lock()
		err := x.checkOpenLocked(s)
		if err == nil {
			b.closeWith(x, ev, seq)
		}
		b.mu.Unlock()
		if err != nil { // ended meanwhile by another caller: drop its share
			errs = append(errs, err)
			_ = ev.destroy()
		}
	}
	return errors.Join(errs...)
}

// checkOpen reports whether x may be ended as part of work on s.
func (x *Access) checkOpen(s *Stream) error {
	x.b.mu.Lock()
	defer x.b.mu.Unlock()
	return x.checkOpenLocked(s)
}

// checkOpenLocked is checkOpen with the buffer's lock held.
func (x *Access) checkOpenLocked(s *Stream) error {
	b := x.b
	if x.done {
		return fmt.Errorf("devalloc: buffer #%d: %s access on stream %d already done: %w", b.id, x.mode, x.s.id, distbuf.ErrInvalid)
	}
	if x.s != s {
		return fmt.Errorf("devalloc: buffer #%d: %s access on stream %d ended with work on stream %d: %w", b.id, x.mode, x.s.id, s.id, distbuf.ErrInvalid)
	}
	return b.checkLive()
}

// sharedEvent is one recorded event standing for the ends of several
// accesses, in several buffers' ledgers: each holds a share, and the last
// share's destroy destroys the event.
type sharedEvent struct {
	eventImpl
	refs atomic.Int32
}

func (e *sharedEvent) destroy() error {
	if e.refs.Add(-1) == 0 {
		return e.eventImpl.destroy()
	}
	return nil
}

// baseEvent is the backend's event behind e.
func baseEvent(e eventImpl) eventImpl {
	if sh, ok := e.(*sharedEvent); ok {
		return sh.eventImpl
	}
	return e
}

// close turns an open access into a ledger entry: an event recorded now on
// its stream.
func (b *Buffer) close(x *Access) error {
	ev, seq, err := x.s.recordLedger()
	if err != nil {
		return fmt.Errorf("devalloc: buffer #%d: record %s on stream %d: %w", b.id, x.mode, x.s.id, err)
	}
	b.allocStream.a.c.ledgerEvents.Add(1)
	b.closeWith(x, ev, seq)
	return nil
}

// closeWith turns an open access into a ledger entry on ev, recorded on its
// stream as number seq. Called with b.mu held.
func (b *Buffer) closeWith(x *Access, ev eventImpl, seq uint64) {
	x.done = true
	open := b.more.open
	for i, o := range open {
		if o == x {
			b.more.open = append(open[:i], open[i+1:]...)
			break
		}
	}
	b.record(x.s, x.mode, entry{c: &completion{stream: x.s, ev: ev, seq: seq, refs: 1}})
}

// record puts e, the end of an access of the given mode on s (nil for an
// outside agent's hold), into the ledger. Called with b.mu held.
func (b *Buffer) record(s *Stream, mode Mode, e entry) {
	if mode == Write {
		// The write waited for all of these, so waiting for it covers them.
		b.writer.release()
		b.writer = e
		if b.more != nil {
			for _, r := range b.more.readers {
				r.release()
			}
			b.more.readers = b.more.readers[:0]
		}
		return
	}
	m := b.ext()
	if s == nil { // an outside reader: nothing on a stream to supersede
		m.readers = append(m.readers, e)
		return
	}
	kept := m.readers[:0]
	for _, r := range m.readers {
		if (r.stream() == s && (r.c == nil || r.c.hold == nil)) || (!r.isMark() && r.isDone()) {
			r.release() // superseded by the later completion on the same stream, or finished
			continue
		}
		kept = append(kept, r)
	}
	m.readers = append(kept, e)
}

// ownDone records devalloc's own work of the given mode on s (a memset or a
// copy), just enqueued: it ends in s's current mark. Called with b.mu held.
func (b *Buffer) ownDone(s *Stream, mode Mode) {
	if mode == Write && b.writer.s == s && len(b.readers()) == 0 {
		// The usual case, a buffer filled on the stream that allocated it:
		// move the writer's entry to the current mark, in one step.
		b.writer = s.moveToCurrent(b.writer.epoch)
		return
	}
	b.record(s, mode, s.takeMark())
}

// Hold lets an agent outside the streams (an MPI request) use the buffer
// until it calls Release: as a reader (a send) or a writer (a receive). Call
// Wait before touching the memory: it blocks until the work the hold must
// follow has completed. Until Release, Free defers the release of the memory
// and stream accesses that conflict with the hold wait for it.
type Hold struct {
	b       *Buffer
	mode    Mode
	deps    []holdDep
	depsBuf [2]holdDep // deps' array for the usual one or two
	c       completion // the hold's own place in the ledger
	done    chan struct{}
	mu      sync.Mutex
	rel     bool
}

// holdDep is a completion a hold waits for, with the event to wait on and
// its number on its stream; the hold keeps a reference on it until Release.
type holdDep struct {
	e   entry
	ev  eventImpl
	seq uint64
}

func (h *Hold) released() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// Hold registers an outside agent as a reader or writer of the buffer. It
// does not block.
func (b *Buffer) Hold(mode Mode) (*Hold, error) {
	if mode != Read && mode != Write {
		return nil, fmt.Errorf("devalloc: buffer #%d: hold mode %v: %w", b.id, mode, distbuf.ErrInvalid)
	}
	if err := b.allocStream.a.enter(); err != nil {
		return nil, err
	}
	defer b.allocStream.a.exit()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return nil, err
	}
	m := b.ext()
	for _, o := range m.open {
		if mode == Write || o.mode == Write {
			return nil, fmt.Errorf("devalloc: buffer #%d: %s hold while a %s on stream %d is open (call Done after enqueueing): %w",
				b.id, mode, o.mode, o.s.id, distbuf.ErrConflict)
		}
	}
	for _, o := range m.holds {
		if mode == Write || o.mode == Write {
			return nil, fmt.Errorf("devalloc: buffer #%d: %s hold while an outside %s hold is unreleased: %w", b.id, mode, o.mode, distbuf.ErrConflict)
		}
	}
	h := &Hold{b: b, mode: mode, done: make(chan struct{})}
	h.deps = h.depsBuf[:0]
	if err := h.addDep(b.writer); err != nil {
		return nil, err
	}
	if mode == Write {
		for _, r := range m.readers {
			if err := h.addDep(r); err != nil {
				return nil, err
			}
		}
	}
	h.c = completion{hold: h, refs: 1}
	b.record(nil, mode, entry{c: &h.c})
	m.holds = append(m.holds, h)
	return h, nil
}

// addDep makes the hold wait for e, unless e is a hold (outside agents order
// themselves) or has nothing left to wait for. On failure it drops the
// dependencies taken so far.
func (h *Hold) addDep(e entry) error {
	if (e.s == nil && e.c == nil) || (e.c != nil && e.c.hold != nil) {
		return nil
	}
	ev, seq, err := e.event()
	if err != nil {
		h.dropDeps()
		return err
	}
	if ev == nil {
		return nil // on a stream closed since: its work has run
	}
	e.addRef()
	h.deps = append(h.deps, holdDep{e: e, ev: ev, seq: seq})
	return nil
}

func (h *Hold) dropDeps() {
	for _, d := range h.deps {
		d.e.release()
	}
	h.deps = nil
}

// Wait blocks until the work this hold must follow has completed: the last
// writer for a read hold, and every reader too for a write hold.
func (h *Hold) Wait() error {
	h.mu.Lock()
	if h.rel {
		h.mu.Unlock()
		return fmt.Errorf("devalloc: buffer #%d: wait on a released hold: %w", h.b.id, distbuf.ErrInvalid)
	}
	deps := h.deps
	h.mu.Unlock()
	for _, d := range deps {
		st := d.e.stream()
		if st == nil || !st.ranThrough(d.seq) {
			if err := d.ev.synchronize(); err != nil {
				return fmt.Errorf("devalloc: buffer #%d: hold wait: %w", h.b.id, err)
			}
			if st != nil {
				st.sawRan(d.seq)
			}
		}
		if st != nil {
			st.impl.hostFunctionsSeen()
		}
	}
	return nil
}

// Release signals that the outside agent is finished with the buffer. If the
// buffer was freed meanwhile and this was its last hold, the memory is
// released (in stream order, without blocking). After Close, Release only
// lets streams waiting for the hold go on, and returns distbuf.ErrClosed: the
// buffer is reported as leaked and its memory is not released.
func (h *Hold) Release() error {
	h.mu.Lock()
	if h.rel {
		h.mu.Unlock()
		return fmt.Errorf("devalloc: buffer #%d: hold released twice: %w", h.b.id, distbuf.ErrInvalid)
	}
	h.rel = true
	h.mu.Unlock()
	b := h.b
	entered := b.allocStream.a.enter() == nil
	if entered {
		defer b.allocStream.a.exit()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	close(h.done)
	h.dropDeps()
	m := b.more
	for i, o := range m.holds {
		if o == h {
			m.holds = append(m.holds[:i], m.holds[i+1:]...)
			break
		}
	}
	if !entered {
		return fmt.Errorf("devalloc: buffer #%d: hold released after Close: %w", b.id, distbuf.ErrClosed)
	}
	if b.state == stateFreeing && len(m.holds) == 0 {
		b.allocStream.a.c.heldFrees.Add(-1)
		return b.enqueueFree(false)
	}
	return nil
}

// Free releases the buffer. It never blocks: the memory goes back to the
// pool in stream order, after every completion the ledger recorded, after
// all work enqueued so far on the allocating stream, and after every hold is
// released. Access still open is closed now. A second Free, like any use
// after Free, returns distbuf.ErrFreed.
func (b *Buffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.allocStream.a.lockedEnter(); err != nil {
		return err
	}
	if b.state != stateLive {
		return fmt.Errorf("devalloc: double free of buffer #%d (%s): %w", b.id, bytesize.Format(b.size), distbuf.ErrFreed)
	}
	if b.more != nil {
		for len(b.more.open) > 0 {
			if err := b.close(b.more.open[0]); err != nil {
				return err
			}
		}
	}
	b.state = stateFreeing
	if b.holdCount() > 0 {
		b.allocStream.a.noteFree(b)
		b.allocStream.a.c.heldFrees.Add(1)
		return nil
	}
	return b.enqueueFree(true)
}

// enqueueFree releases the memory in stream order, after every completion
// and after the work enqueued so far on the allocating stream (undeclared
// work there is ordered before the free, as with cudaFreeAsync on that
// stream). When they all lie on one stream (the common case: one solve
// stream), or those on other streams have already run, the free goes on
// that stream, like cudaFreeAsync on it: no events, no cross-stream waits,
// and the pool can hand the memory straight back to the next allocation on
// that stream. Otherwise the reclamation stream waits for each completion
// and frees. freeing says that Free is the caller, whose counts are taken
// here too. Called with b.mu held and no holds left.
func (b *Buffer) enqueueFree(freeing bool) error {
	a := b.allocStream.a
	b.state = stateFreed
	on := b.freeStream()
	var err error
	if on == nil {
		on = a.reclaim
		err = b.orderAfter(on, Write)
		if err == nil && !b.allocStream.closed.Load() {
			cur := b.allocStream.takeMark()
			err = b.waitIn(on, cur)
			cur.release()
		}
	}
	if err == nil {
		if Location(b.loc) == Pinned {
			err = a.pinned.release(b, on.impl)
		} else {
			err = a.be.freeAsync(b.addr, b.aligned(), on.impl)
		}
	}
	if b.more != nil {
		for _, r := range b.more.readers {
			r.release()
		}
		b.more.readers = nil
	}
	a.noteReleased(b, freeing) // drops the writer
	if err != nil {
		return fmt.Errorf("devalloc: free of buffer #%d: %w", b.id, err)
	}
	return nil
}

// freeStream returns the allocating stream when every pending completion
// lies on it or has already run, and it is open, else nil.
func (b *Buffer) freeStream() *Stream {
	on := b.allocStream
	if on.closed.Load() {
		return nil
	}
	onOne := func(e entry) bool {
		switch {
		case e.s == nil && e.c == nil:
			return true
		case e.c != nil && e.c.hold != nil:
			return e.c.hold.released()
		case e.stream() == on:
			return true
		case e.s != nil:
			return e.s.markRan(e.epoch)
		}
		// Another stream's work that has run needs no wait: asking is one
		// query, where the reclamation stream would wait for it, and for
		// a new mark of the allocating stream.
		return e.isDone()
	}
	if !onOne(b.writer) {
		return nil
	}
	for _, r := range b.readers() {
		if !onOne(r) {
			return nil
		}
	}
	return on
}
