package devalloc

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/stretchr/testify/require"
)

// hostWithTwoStreams opens a host allocator and returns it with its
// default stream, one more stream and n buffers allocated on the first,
// their allocations run.
func hostWithTwoStreams(t *testing.T, n int) (*Allocator, *Stream, *Stream, []*Buffer) {
	t.Helper()
	a, err := Open(Options{Backend: BackendHost, Warn: func(string) {}})
	require.NoError(t, err)
	s1 := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	bufs := make([]*Buffer, n)
	for i := range bufs {
		bufs[i], err = a.Alloc(64, s1)
		require.NoError(t, err)
	}
	require.NoError(t, s1.Synchronize())
	return a, s1, s2, bufs
}

// writeHeldBack declares a write of x on s whose work waits until release
// is called, then a write of y on s, so that s's ledger holds x's event
// before y's. xWritten reports whether x's work has run.
func writeHeldBack(t *testing.T, s *Stream, x, y *Buffer) (release func(), xWritten *atomic.Bool) {
	t.Helper()
	ch := make(chan struct{})
	xWritten = new(atomic.Bool)
	w, err := x.Write(s)
	require.NoError(t, err)
	require.NoError(t, s.Enqueue(func() error { <-ch; xWritten.Store(true); return nil }))
	require.NoError(t, w.Done())
	touch(t, y, s, Write)
	return func() { close(ch) }, xWritten
}

// touch declares an access of b on s and ends it at once, as a caller
// whose work on s is already enqueued would.
func touch(t *testing.T, b *Buffer, s *Stream, mode Mode) {
	t.Helper()
	x, err := b.begin(s, mode)
	require.NoError(t, err)
	require.NoError(t, x.Done())
}

// TestDoneAllOneEvent: accesses of three buffers ended together by DoneAll
// cost one ledger event, and later work on another stream still follows
// each of them as it would have followed three.
func TestDoneAllOneEvent(t *testing.T) {
	a, s1, s2, bufs := hostWithTwoStreams(t, 3)

	var xs []*Access
	for i, b := range bufs {
		mode := Read
		if i == 2 {
			mode = Write
		}
		x, err := b.begin(s1, mode)
		require.NoError(t, err)
		xs = append(xs, x)
	}
	release := make(chan struct{})
	var finished atomic.Bool
	require.NoError(t, s1.Enqueue(func() error { <-release; finished.Store(true); return nil }))
	events := a.Stats().LedgerEvents
	require.NoError(t, DoneAll(append(xs, nil)...))
	require.Equal(t, events+1, a.Stats().LedgerEvents, "one event for three accesses")
	for _, x := range xs {
		require.True(t, x.done)
	}

	// A read of the written buffer and a write of a read one, on s2: both
	// must wait for s1's work.
	var sawFinished [2]bool
	for i, b := range []*Buffer{bufs[2], bufs[0]} {
		x, err := b.begin(s2, [...]Mode{Read, Write}[i])
		require.NoError(t, err)
		require.NoError(t, s2.Enqueue(func() error { sawFinished[i] = finished.Load(); return nil }))
		require.NoError(t, x.Done())
	}
	close(release)
	require.NoError(t, s2.Synchronize())
	require.Equal(t, [2]bool{true, true}, sawFinished, "s2's work ran after s1's")
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
	require.NoError(t, a.Close())
}

// TestDoneAllMisuse: accesses on two streams, or one already done, are
// refused before anything is recorded, and stay open for Done.
func TestDoneAllMisuse(t *testing.T) {
	a, s1, s2, bufs := hostWithTwoStreams(t, 2)
	b1, b2 := bufs[0], bufs[1]
	require.NoError(t, DoneAll())
	require.NoError(t, DoneAll(nil, nil))

	x1, err := b1.Read(s1)
	require.NoError(t, err)
	x2, err := b2.Read(s2)
	require.NoError(t, err)
	events := a.Stats().LedgerEvents
	err = DoneAll(x1, x2)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "ended with work on stream")
	require.Equal(t, events, a.Stats().LedgerEvents, "nothing recorded")
	require.NoError(t, x1.Done())
	err = DoneAll(x2, x1)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "already done")
	require.Equal(t, events+1, a.Stats().LedgerEvents, "x1's own Done only")
	require.NoError(t, DoneAll(x2), "one access: its Done")
	require.ErrorIs(t, x2.Done(), distbuf.ErrInvalid)
	require.NoError(t, b1.Free())
	require.NoError(t, b2.Free())
	require.NoError(t, a.Close())
}

// countingBackend is the null backend whose events count their destroys,
// by event, and whose streams count their waits.
type countingBackend struct {
	nullBackend
	mu        sync.Mutex
	recorded  int
	destroyed map[int]int
	waits     int
	syncs     atomic.Int64 // host waits for an event
	queries   atomic.Int64
	pending   atomic.Bool // events report their work not run yet
}

type countingStream struct {
	nullStream
	be *countingBackend
}

type countingEvent struct {
	be *countingBackend
	id int
}

func (b *countingBackend) newStream() (streamImpl, error) { return countingStream{be: b}, nil }

func (s countingStream) record() (eventImpl, error) {
	s.be.mu.Lock()
	defer s.be.mu.Unlock()
	s.be.recorded++
	return countingEvent{s.be, s.be.recorded}, nil
}

func (s countingStream) wait(eventImpl) error {
	s.be.mu.Lock()
	defer s.be.mu.Unlock()
	s.be.waits++
	return nil
}

func (e countingEvent) query() (bool, error) {
	e.be.queries.Add(1)
	return !e.be.pending.Load(), nil
}

func (e countingEvent) synchronize() error {
	e.be.syncs.Add(1)
	return nil
}

func (e countingEvent) destroy() error {
	e.be.mu.Lock()
	defer e.be.mu.Unlock()
	e.be.destroyed[e.id]++
	return nil
}

// openCounting opens an allocator on a fresh countingBackend.
func openCounting(t *testing.T) (*countingBackend, *Allocator) {
	t.Helper()
	be := &countingBackend{destroyed: map[int]int{}}
	return be, openOn(t, be)
}

func (b *countingBackend) waitCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waits
}

func (b *countingBackend) destroys(id int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.destroyed[id]
}

// TestDoneAllEventLifetime: the shared event lives while any buffer's
// ledger holds it and is destroyed once, with the last.
func TestDoneAllEventLifetime(t *testing.T) {
	be, a := openCounting(t)
	s := a.DefaultStream()
	var bufs []*Buffer
	var xs []*Access
	for range 3 {
		b, err := a.Alloc(64, s)
		require.NoError(t, err)
		x, err := b.Write(s)
		require.NoError(t, err)
		bufs, xs = append(bufs, b), append(xs, x)
	}
	require.NoError(t, DoneAll(xs...))
	be.mu.Lock()
	shared := be.recorded
	be.mu.Unlock()
	for i, b := range bufs {
		require.Zero(t, be.destroys(shared), "buffer %d's ledger still holds the event", i)
		require.NoError(t, b.Free())
	}
	require.NoError(t, a.Close())
	require.Equal(t, 1, be.destroys(shared), "destroyed once, after the last buffer")
}

// TestWaitsSkipped: a stream that has waited for one of another stream's
// ledger events does not wait again for an earlier one, and waits for a
// later one.
func TestWaitsSkipped(t *testing.T) {
	be, a := openCounting(t)
	s1 := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	s3, err := a.NewStream()
	require.NoError(t, err)
	x, err := a.Alloc(64, s1)
	require.NoError(t, err)
	y, err := a.Alloc(64, s1)
	require.NoError(t, err)
	for _, b := range []*Buffer{x, y} { // x's write, then y's: events 1 and 2 of s1's ledger
		touch(t, b, s1, Write)
	}
	touch(t, y, s2, Read) // waits for y's write
	require.Equal(t, 1, be.waitCount())
	touch(t, x, s2, Read) // x's write came before y's: covered
	require.Equal(t, 1, be.waitCount())
	require.EqualValues(t, 1, a.Stats().WaitsSkipped)
	touch(t, x, s3, Read) // the other order: both waits needed
	touch(t, y, s3, Read)
	require.Equal(t, 3, be.waitCount())
	require.EqualValues(t, 1, a.Stats().WaitsSkipped)
	require.NoError(t, x.Free())
	require.NoError(t, y.Free())
	require.NoError(t, a.Close())
}

// TestHostWaitsSkipped: once the host has seen one of a stream's ledger
// events complete, it neither waits for nor queries an earlier one; a later
// one it still waits for. A stream's Synchronize covers every event
// recorded before it.
func TestHostWaitsSkipped(t *testing.T) {
	be, a := openCounting(t)
	s := a.DefaultStream()
	bufs := make([]*Buffer, 4)
	for i := range bufs {
		var err error
		bufs[i], err = a.Alloc(64, s)
		require.NoError(t, err)
	}
	wait := func(b *Buffer) {
		t.Helper()
		h, err := b.Hold(Read)
		require.NoError(t, err)
		require.NoError(t, h.Wait())
		require.NoError(t, h.Release())
	}
	x, y, z, w := bufs[0], bufs[1], bufs[2], bufs[3]
	touch(t, x, s, Write) // the stream's ledger events in this order: x, y
	touch(t, y, s, Write)
	wait(y)
	require.EqualValues(t, 1, be.syncs.Load())
	wait(x) // recorded before y's: complete
	require.EqualValues(t, 1, be.syncs.Load())
	require.EqualValues(t, 1, a.Stats().HostWaitsSkipped)
	touch(t, z, s, Write) // after y's: waited for
	wait(z)
	require.EqualValues(t, 2, be.syncs.Load())
	require.EqualValues(t, 1, a.Stats().HostWaitsSkipped)

	touch(t, w, s, Write)
	require.NoError(t, s.Synchronize())
	wait(w)
	require.EqualValues(t, 2, be.syncs.Load(), "the stream's synchronisation covers w's write")
	require.EqualValues(t, 2, a.Stats().HostWaitsSkipped)
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
	require.NoError(t, a.Close())
}

// TestSkippedHostWaitStillOrders: on the host backend, a hold whose wait is
// left out because a later event of the stream was seen complete finds
// the work it follows done.
func TestSkippedHostWaitStillOrders(t *testing.T) {
	a, s1, _, bufs := hostWithTwoStreams(t, 2)
	x, y := bufs[0], bufs[1]
	release, xWritten := writeHeldBack(t, s1, x, y)
	hy, err := y.Hold(Read)
	require.NoError(t, err)
	hx, err := x.Hold(Read)
	require.NoError(t, err)
	release()
	require.NoError(t, hy.Wait())
	skipped := a.Stats().HostWaitsSkipped
	require.NoError(t, hx.Wait())
	require.Equal(t, skipped+1, a.Stats().HostWaitsSkipped, "x's wait is covered by y's")
	require.True(t, xWritten.Load(), "x's write ran before y's")
	require.NoError(t, errors.Join(hx.Release(), hy.Release(), x.Free(), y.Free(), a.Close()))
}

// TestSkippedWaitStillOrders: the work of a stream whose wait for an
// earlier event was left out still runs after that event's work.
func TestSkippedWaitStillOrders(t *testing.T) {
	a, s1, s2, bufs := hostWithTwoStreams(t, 2)
	x, y := bufs[0], bufs[1]
	release, xWritten := writeHeldBack(t, s1, x, y)

	skipped := a.Stats().WaitsSkipped
	var sawX bool
	ry, err := y.Read(s2)
	require.NoError(t, err)
	rx, err := x.Read(s2)
	require.NoError(t, err)
	require.Equal(t, skipped+1, a.Stats().WaitsSkipped, "x's wait is covered by y's")
	require.NoError(t, s2.Enqueue(func() error { sawX = xWritten.Load(); return nil }))
	require.NoError(t, DoneAll(ry, rx))
	release()
	require.NoError(t, s2.Synchronize())
	require.True(t, sawX, "s2 read x after s1 wrote it")
	require.NoError(t, x.Free())
	require.NoError(t, y.Free())
	require.NoError(t, a.Close())
}

// TestPinnedUsableAtOnce: a pinned buffer has no first writer to wait for
// (the pool hands out only blocks whose last use has completed), so a hold
// on it waits for nothing and records no event, even on a stream whose
// work has not run; a device allocation there must wait for that work.
func TestPinnedUsableAtOnce(t *testing.T) {
	a, err := Open(Options{Backend: BackendHost, Warn: func(string) {}})
	require.NoError(t, err)
	s := a.DefaultStream()
	release := make(chan struct{})
	require.NoError(t, s.Enqueue(func() error { <-release; return nil }))
	p, err := a.AllocPinned(256, s)
	require.NoError(t, err)
	events := a.Stats().LedgerEvents
	h, err := p.Hold(Write)
	require.NoError(t, err)
	require.Empty(t, h.deps, "nothing to wait for")
	require.Equal(t, events, a.Stats().LedgerEvents, "no mark recorded")
	require.NoError(t, h.Wait())
	require.NoError(t, h.Release())

	b, err := a.Alloc(256, s)
	require.NoError(t, err)
	hb, err := b.Hold(Write)
	require.NoError(t, err)
	require.Len(t, hb.deps, 1, "a device allocation waits for its stream")
	close(release)
	require.NoError(t, hb.Wait())
	require.NoError(t, hb.Release())
	require.NoError(t, p.Free())
	require.NoError(t, b.Free())
	require.NoError(t, a.Close())
}

// TestFreeAfterOtherStreamRan: a buffer last read on another stream is
// freed on its allocating stream, with no wait and no event, once that
// read has run; before, the reclamation stream waits for it.
func TestFreeAfterOtherStreamRan(t *testing.T) {
	be, a := openCounting(t)
	s1 := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	for _, ran := range []bool{true, false} {
		be.pending.Store(!ran)
		x, err := a.Alloc(64, s1)
		require.NoError(t, err)
		r, err := x.Read(s2)
		require.NoError(t, err)
		require.NoError(t, r.Done())
		w0, ev0 := be.waitCount(), a.Stats().LedgerEvents
		require.NoError(t, x.Free())
		if ran {
			require.Equal(t, w0, be.waitCount(), "no wait for work that has run")
			require.Equal(t, ev0, a.Stats().LedgerEvents, "no mark recorded")
		} else {
			require.Greater(t, be.waitCount(), w0, "the reclamation stream waits for the read")
		}
	}
	be.pending.Store(false)
	require.NoError(t, a.Close())
}
