package devalloc

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDoneAllOneEvent: accesses of three buffers ended together by DoneAll
// cost one ledger event, and later work on another stream still follows
// each of them as it would have followed three.
func TestDoneAllOneEvent(t *testing.T) {
	a, err := Open(Options{Backend: BackendHost, Warn: func(string) {}})
	require.NoError(t, err)
	s1 := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	bufs := make([]*Buffer, 3)
	for i := range bufs {
		bufs[i], err = a.Alloc(64, s1)
		require.NoError(t, err)
	}
	require.NoError(t, s1.Synchronize())

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
	a, err := Open(Options{Backend: BackendHost, Warn: func(string) {}})
	require.NoError(t, err)
	s1 := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	b1, err := a.Alloc(64, s1)
	require.NoError(t, err)
	b2, err := a.Alloc(64, s1)
	require.NoError(t, err)
	require.NoError(t, DoneAll())
	require.NoError(t, DoneAll(nil, nil))

	x1, err := b1.Read(s1)
	require.NoError(t, err)
	x2, err := b2.Read(s2)
	require.NoError(t, err)
	events := a.Stats().LedgerEvents
	err = DoneAll(x1, x2)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "ended with work on stream")
	require.Equal(t, events, a.Stats().LedgerEvents, "nothing recorded")
	require.NoError(t, x1.Done())
	err = DoneAll(x2, x1)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "already done")
	require.Equal(t, events+1, a.Stats().LedgerEvents, "x1's own Done only")
	require.NoError(t, DoneAll(x2), "one access: its Done")
	require.ErrorIs(t, x2.Done(), ErrInvalid)
	require.NoError(t, b1.Free())
	require.NoError(t, b2.Free())
	require.NoError(t, a.Close())
}

// countingBackend is the null backend whose events count their destroys,
// by event.
type countingBackend struct {
	nullBackend
	mu        sync.Mutex
	recorded  int
	destroyed map[int]int
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

func (countingEvent) query() (bool, error) { return true, nil }
func (countingEvent) synchronize() error   { return nil }

func (e countingEvent) destroy() error {
	e.be.mu.Lock()
	defer e.be.mu.Unlock()
	e.be.destroyed[e.id]++
	return nil
}

func (b *countingBackend) destroys(id int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.destroyed[id]
}

// TestDoneAllEventLifetime: the shared event lives while any buffer's
// ledger holds it and is destroyed once, with the last.
func TestDoneAllEventLifetime(t *testing.T) {
	be := &countingBackend{destroyed: map[int]int{}}
	a := &Allocator{be: be, warn: func(string) {}, streams: map[*Stream]struct{}{}, drained: make(chan struct{}, 1)}
	require.NoError(t, a.init("test"))
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
