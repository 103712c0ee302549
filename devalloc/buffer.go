package devalloc

import (
	"fmt"
	"sync"
	"unsafe"
)

// Mode is the kind of access work makes to a buffer.
type Mode int

const (
	Read Mode = iota + 1
	Write
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

type bufState int

const (
	stateLive    bufState = iota
	stateFreeing          // Free was called; waiting for outside holds to be released
	stateFreed            // the free is enqueued; memory goes back once its completions are done
)

// completion is one entry of the ledger: the end of some work that touched
// the buffer. It is either an event on a stream, a stream's mark (ev is the
// mark's event once someone had to wait for it), or an outside agent's hold.
type completion struct {
	stream *Stream
	ev     eventImpl
	mark   *streamMark
	hold   *Hold
	refs   int // ledger slots and holds that point at it; the event is destroyed at 0
}

// markCompletion is a completion that stands on s's current mark.
func markCompletion(s *Stream) *completion {
	return &completion{stream: s, mark: s.lazyMark(), refs: 1}
}

// Buffer is one allocation. The Allocator owns its memory; the caller owns
// the Buffer until Free, after which every method returns ErrFreed.
//
// The ledger orders access across streams and outside agents (the "token
// pins storage" rule): a read waits for the last writer, a write waits for the
// last writer and every reader since, and the memory is released only after
// all of them. Methods are safe for concurrent use.
type Buffer struct {
	a           *Allocator
	id          uint64
	size        int64
	aligned     int64
	addr        uintptr
	hostPtr     unsafe.Pointer
	loc         Location
	allocStream *Stream
	pinnedClass int

	mu      sync.Mutex
	label   string
	state   bufState
	writer  *completion
	readers []*completion
	open    []*Access
	holds   []*Hold
}

// ID is unique within the allocator; leak reports name buffers by it.
func (b *Buffer) ID() uint64 { return b.id }

// Size is the number of bytes requested.
func (b *Buffer) Size() int64 { return b.size }

// Location says where the memory lives.
func (b *Buffer) Location() Location { return b.loc }

// Allocator returns the allocator that owns the buffer.
func (b *Buffer) Allocator() *Allocator { return b.a }

// SetLabel names the buffer in leak reports.
func (b *Buffer) SetLabel(label string) {
	b.mu.Lock()
	b.label = label
	b.mu.Unlock()
}

func (b *Buffer) checkLive() error {
	if b.state != stateLive {
		return fmt.Errorf("devalloc: buffer #%d (%s): %w", b.id, FormatBytes(b.size), ErrFreed)
	}
	return nil
}

// Addr is the address of the memory: a device pointer for OnDevice buffers,
// a host pointer otherwise. Its validity ends when the buffer is freed.
func (b *Buffer) Addr() (uintptr, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return 0, err
	}
	return b.addr, nil
}

// Bytes is a Go view of host-accessible memory (OnHost and Pinned). The
// slice must not be used after Free, and reading or writing it from the host
// must be ordered like any other access: inside Stream.Enqueue between Read
// or Write and Access.Done, or after a Hold's Wait.
func (b *Buffer) Bytes() ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return nil, err
	}
	if b.hostPtr == nil {
		return nil, fmt.Errorf("devalloc: buffer #%d is %s memory, not addressable from Go: %w", b.id, b.loc, ErrNotSupported)
	}
	return unsafe.Slice((*byte)(b.hostPtr), b.size), nil
}

// Region describes the memory for code that hands it to C or MPI: its
// address, length, and whether it is device memory. C may hold the address
// until the buffer is freed; use a Hold to stop the free from releasing it
// earlier.
func (b *Buffer) Region() (addr uintptr, size int64, device bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return 0, 0, false, err
	}
	return b.addr, b.size, b.loc == OnDevice, nil
}

// Access is an open declaration that work enqueued on a stream touches a
// buffer. Call Done once the work is enqueued.
type Access struct {
	b    *Buffer
	s    *Stream
	mode Mode
	done bool
	// own is devalloc's own device work (Memset, Copy), which completes by
	// itself: it ends in the stream's mark, not in an event of its own.
	own bool
}

// Read declares that work about to be enqueued on s reads the buffer. It
// makes s wait for the last writer. Call Done on the result once the work is
// enqueued.
func (b *Buffer) Read(s *Stream) (*Access, error) { return b.begin(s, Read, false) }

// Write declares that work about to be enqueued on s writes the buffer. It
// makes s wait for the last writer and for every reader since. Call Done on
// the result once the work is enqueued.
func (b *Buffer) Write(s *Stream) (*Access, error) { return b.begin(s, Write, false) }

func (b *Buffer) begin(s *Stream, mode Mode, own bool) (*Access, error) {
	if err := b.a.enter(); err != nil {
		return nil, err
	}
	defer b.a.exit()
	if err := b.a.checkStream(s); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return nil, err
	}
	for _, o := range b.open {
		if o.s != s && (mode == Write || o.mode == Write) {
			return nil, fmt.Errorf("devalloc: buffer #%d: %s on stream %d while a %s on stream %d is open (call Done after enqueueing): %w",
				b.id, mode, s.id, o.mode, o.s.id, ErrConflict)
		}
	}
	if mode == Write {
		for _, h := range b.holds {
			if h.mode == Write {
				return nil, fmt.Errorf("devalloc: buffer #%d: write on stream %d while an outside writer holds it: %w", b.id, s.id, ErrConflict)
			}
		}
	}
	if err := b.orderAfter(s, mode); err != nil {
		return nil, err
	}
	if !own {
		// What the caller enqueues may wait for an agent outside the
		// stream: no mark recorded later may cover it.
		if err := s.seal(); err != nil {
			return nil, err
		}
	}
	x := &Access{b: b, s: s, mode: mode, own: own}
	b.open = append(b.open, x)
	return x, nil
}

// orderAfter makes s wait for what an access of the given mode must follow.
func (b *Buffer) orderAfter(s *Stream, mode Mode) error {
	if err := b.waitIn(s, b.writer); err != nil {
		return err
	}
	if mode == Write {
		for _, r := range b.readers {
			if err := b.waitIn(s, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// materialize gives a mark completion its event, recording the mark if no
// one has yet. It leaves ev nil when the stream was closed first, and then
// there is nothing to wait for.
func (c *completion) materialize() error {
	if c.ev != nil || c.mark == nil {
		return nil
	}
	ev, err := c.mark.event()
	c.ev = ev
	return err
}

func (b *Buffer) waitIn(s *Stream, c *completion) error {
	switch {
	case c == nil:
		return nil
	case c.hold != nil:
		if c.hold.released() {
			return nil
		}
		if err := s.seal(); err != nil {
			return err
		}
		if err := s.impl.waitHost(c.hold.done); err != nil {
			return fmt.Errorf("devalloc: buffer #%d: stream %d cannot wait for an outside hold: %w", b.id, s.id, err)
		}
		return nil
	case c.stream == s:
		return nil // same stream: already in order
	case c.ev == nil && c.stream.closed.Load():
		return nil // a closed stream's work has all run
	}
	if err := c.materialize(); err != nil {
		return err
	}
	if c.ev == nil {
		return nil
	}
	if err := s.impl.wait(c.ev); err != nil {
		return fmt.Errorf("devalloc: buffer #%d: stream %d wait: %w", b.id, s.id, err)
	}
	return nil
}

func (c *completion) unref() {
	c.refs--
	switch {
	case c.refs > 0:
	case c.mark != nil:
		c.mark.release()
		c.mark, c.ev = nil, nil
	case c.ev != nil:
		_ = c.ev.destroy()
		c.ev = nil
	}
}

func (c *completion) isDone() bool {
	switch {
	case c.hold != nil:
		return c.hold.released()
	case c.ev != nil:
		done, err := c.ev.query()
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
		return fmt.Errorf("devalloc: buffer #%d: %s access on stream %d already done: %w", b.id, x.mode, x.s.id, ErrInvalid)
	}
	if err := b.checkLive(); err != nil {
		return err
	}
	return b.close(x)
}

// close turns an open access into a ledger entry: an event recorded now on
// its stream, or the stream's mark for devalloc's own work.
func (b *Buffer) close(x *Access) error {
	var c *completion
	if x.own {
		c = markCompletion(x.s)
	} else {
		ev, err := x.s.impl.record()
		if err != nil {
			return fmt.Errorf("devalloc: buffer #%d: record %s on stream %d: %w", b.id, x.mode, x.s.id, err)
		}
		b.a.c.ledgerEvents.Add(1)
		c = &completion{stream: x.s, ev: ev, refs: 1}
	}
	x.done = true
	for i, o := range b.open {
		if o == x {
			b.open = append(b.open[:i], b.open[i+1:]...)
			break
		}
	}
	if x.mode == Write {
		// The write waited for all of these, so waiting for it covers them.
		b.writer.unref()
		for _, r := range b.readers {
			r.unref()
		}
		b.writer, b.readers = c, b.readers[:0]
		return nil
	}
	kept := b.readers[:0]
	for _, r := range b.readers {
		if (r.stream == x.s && r.hold == nil) || r.isDone() {
			r.unref() // superseded by the later event on the same stream, or finished
			continue
		}
		kept = append(kept, r)
	}
	b.readers = append(kept, c)
	return nil
}

// Hold lets an agent outside the streams (an MPI request) use the buffer
// until it calls Release: as a reader (a send) or a writer (a receive). Call
// Wait before touching the memory: it blocks until the work the hold must
// follow has completed. Until Release, Free defers the release of the memory
// and stream accesses that conflict with the hold wait for it.
type Hold struct {
	b       *Buffer
	mode    Mode
	deps    []*completion
	depsBuf [2]*completion // deps' array for the usual one or two
	c       completion     // the hold's own place in the ledger
	done    chan struct{}
	mu      sync.Mutex
	rel     bool
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
		return nil, fmt.Errorf("devalloc: buffer #%d: hold mode %v: %w", b.id, mode, ErrInvalid)
	}
	if err := b.a.enter(); err != nil {
		return nil, err
	}
	defer b.a.exit()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLive(); err != nil {
		return nil, err
	}
	for _, o := range b.open {
		if mode == Write || o.mode == Write {
			return nil, fmt.Errorf("devalloc: buffer #%d: %s hold while a %s on stream %d is open (call Done after enqueueing): %w",
				b.id, mode, o.mode, o.s.id, ErrConflict)
		}
	}
	for _, o := range b.holds {
		if mode == Write || o.mode == Write {
			return nil, fmt.Errorf("devalloc: buffer #%d: %s hold while an outside %s hold is unreleased: %w", b.id, mode, o.mode, ErrConflict)
		}
	}
	h := &Hold{b: b, mode: mode, done: make(chan struct{})}
	h.deps = h.depsBuf[:0]
	deps := []*completion{b.writer}
	if mode == Write {
		deps = append(deps, b.readers...)
	}
	for _, c := range deps {
		if c == nil || c.hold != nil {
			continue
		}
		if err := c.materialize(); err != nil {
			for _, d := range h.deps {
				d.unref()
			}
			return nil, err
		}
		if c.ev == nil {
			continue // on a stream closed since: its work has run
		}
		c.refs++
		h.deps = append(h.deps, c)
	}
	hc := &h.c
	*hc = completion{hold: h, refs: 1}
	if mode == Write {
		b.writer.unref()
		for _, r := range b.readers {
			r.unref()
		}
		b.writer, b.readers = hc, b.readers[:0]
	} else {
		b.readers = append(b.readers, hc)
	}
	b.holds = append(b.holds, h)
	return h, nil
}

// Mode reports whether the hold is a reader or a writer.
func (h *Hold) Mode() Mode { return h.mode }

// Wait blocks until the work this hold must follow has completed: the last
// writer for a read hold, and every reader too for a write hold.
func (h *Hold) Wait() error {
	h.mu.Lock()
	if h.rel {
		h.mu.Unlock()
		return fmt.Errorf("devalloc: buffer #%d: wait on a released hold: %w", h.b.id, ErrInvalid)
	}
	deps := h.deps
	h.mu.Unlock()
	for _, c := range deps {
		if err := c.ev.synchronize(); err != nil {
			return fmt.Errorf("devalloc: buffer #%d: hold wait: %w", h.b.id, err)
		}
	}
	return nil
}

// Release signals that the outside agent is finished with the buffer. If the
// buffer was freed meanwhile and this was its last hold, the memory is
// released (in stream order, without blocking).
func (h *Hold) Release() error {
	h.mu.Lock()
	if h.rel {
		h.mu.Unlock()
		return fmt.Errorf("devalloc: buffer #%d: hold released twice: %w", h.b.id, ErrInvalid)
	}
	h.rel = true
	h.mu.Unlock()
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	close(h.done)
	for _, d := range h.deps {
		d.unref()
	}
	h.deps = nil
	for i, o := range b.holds {
		if o == h {
			b.holds = append(b.holds[:i], b.holds[i+1:]...)
			break
		}
	}
	if b.state == stateFreeing && len(b.holds) == 0 {
		b.a.c.heldFrees.Add(-1)
		return b.enqueueFree()
	}
	return nil
}

// Free releases the buffer. It never blocks: the memory goes back to the
// pool in stream order, after every completion the ledger recorded, after
// all work enqueued so far on the allocating stream, and after every hold is
// released. Access still open is closed now. A second Free, like any use
// after Free, returns ErrFreed.
func (b *Buffer) Free() error {
	if err := b.a.enter(); err != nil {
		return err
	}
	defer b.a.exit()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != stateLive {
		return fmt.Errorf("devalloc: double free of buffer #%d (%s): %w", b.id, FormatBytes(b.size), ErrFreed)
	}
	for len(b.open) > 0 {
		if err := b.close(b.open[0]); err != nil {
			return err
		}
	}
	// Undeclared work on the allocating stream is ordered before the free,
	// as with cudaFreeAsync on that stream: cover it with a lazy entry.
	b.readers = append(b.readers, markCompletion(b.allocStream))
	b.state = stateFreeing
	if b.loc != Pinned {
		b.a.c.frees.Add(1)
		b.a.c.requestedCur.Add(-b.size)
	}
	if len(b.holds) > 0 {
		b.a.c.heldFrees.Add(1)
		return nil
	}
	return b.enqueueFree()
}

// enqueueFree releases the memory in stream order, after every completion.
// When they all lie on one stream (the common case: one solve stream), the
// free goes on that stream, like cudaFreeAsync on it: no events, no
// cross-stream waits, and the pool can hand the memory straight back to the
// next allocation on that stream. Otherwise the reclamation stream waits for
// each completion and frees. Called with b.mu held and no holds left.
func (b *Buffer) enqueueFree() error {
	a := b.a
	b.state = stateFreed
	deps := append([]*completion{b.writer}, b.readers...)
	b.writer, b.readers = nil, nil
	on := freeStream(deps)
	var err error
	if on == nil {
		on = a.reclaim
		for _, c := range deps {
			if c != nil && err == nil {
				err = b.waitIn(on, c)
			}
		}
	}
	if err == nil {
		if b.loc == Pinned {
			err = a.pinned.release(b, on.impl)
		} else {
			err = a.be.freeAsync(b.addr, b.aligned, on.impl)
		}
	}
	for _, c := range deps {
		if c != nil {
			c.unref()
		}
	}
	if b.loc != Pinned {
		a.budget.Add(-b.aligned)
	}
	a.mu.Lock()
	delete(a.live, b)
	a.mu.Unlock()
	a.c.liveBuffers.Add(-1)
	if err != nil {
		return fmt.Errorf("devalloc: free of buffer #%d: %w", b.id, err)
	}
	return nil
}

// freeStream returns the one open stream every pending completion lies on,
// or nil when they span several streams (or none is usable).
func freeStream(deps []*completion) *Stream {
	var on *Stream
	for _, c := range deps {
		switch {
		case c == nil:
		case c.hold != nil:
			if !c.hold.released() {
				return nil
			}
		case c.stream == nil || c.stream.closed.Load():
			return nil
		case on == nil:
			on = c.stream
		case on != c.stream:
			return nil
		}
	}
	return on
}
