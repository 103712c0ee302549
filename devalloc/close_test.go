package devalloc

import (
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/stretchr/testify/require"
)

// TestCloseAbandonedWaitNamesItself: a synchronisation in flight behind a
// wait for a hold never released ends, once Close abandons the wait, with
// an error that says so.
func TestCloseAbandonedWaitNamesItself(t *testing.T) {
	a, err := Open(Options{Backend: BackendHost, Config: &Config{}})
	require.NoError(t, err)
	s := a.DefaultStream()
	b, err := a.Alloc(4096, s)
	require.NoError(t, err)
	_, err = b.Hold(Read)
	require.NoError(t, err)
	require.NoError(t, s.Memset(b, 0, 4096, 1)) // waits for the hold
	synced := make(chan error, 1)
	go func() { synced <- s.Synchronize() }()
	for a.inFlight() == 0 {
		time.Sleep(time.Millisecond)
	}
	require.ErrorIs(t, a.Close(), distbuf.ErrLeak)
	select {
	case err := <-synced:
		require.ErrorIs(t, err, distbuf.ErrClosed)
		require.ErrorContains(t, err, "abandoned")
		require.ErrorContains(t, err, "never released")
	case <-time.After(10 * time.Second):
		t.Fatal("Synchronize did not return")
	}
}

// TestCloseRacesFree: Frees and Memsets race with Close. Each Free either
// releases its buffer, which the leak report then leaves out, or returns
// distbuf.ErrClosed, and the report names the buffer; a Memset either runs before
// Close destroys the streams or returns distbuf.ErrClosed.
func TestCloseRacesFree(t *testing.T) {
	for round := range 20 {
		a, err := Open(Options{Backend: BackendHost, Config: &Config{}})
		require.NoError(t, err)
		const n = 64
		bufs := make([]*Buffer, n)
		for i := range bufs {
			s := a.DefaultStream()
			bufs[i], err = a.Alloc(256, s)
			require.NoError(t, err)
		}
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Go(func() {
				<-start
				for i := g; i < n; i += 2 {
					if err := a.DefaultStream().Memset(bufs[i], 0, 256, 1); err != nil {
						require.ErrorIs(t, err, distbuf.ErrClosed)
					}
					errs[i] = bufs[i].Free()
				}
			})
		}
		close(start)
		if round%2 == 1 {
			time.Sleep(time.Duration(round) * time.Microsecond)
		}
		cerr := a.Close()
		wg.Wait()
		var kept []uint64
		for i, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, distbuf.ErrClosed)
				kept = append(kept, bufs[i].ID())
			}
		}
		if len(kept) == 0 {
			require.NoError(t, cerr)
			continue
		}
		var leak *LeakError
		require.ErrorAs(t, cerr, &leak)
		require.Equal(t, len(kept), leak.Count)
		for i, l := range leak.Buffers {
			require.Equal(t, kept[i], l.ID)
			require.False(t, l.Held)
		}
	}
}

// gatedBackend is the null backend whose allocations wait for gate.
type gatedBackend struct {
	nullBackend
	gate chan struct{}
}

func (b *gatedBackend) alloc(size int64, s streamImpl) (uintptr, unsafe.Pointer, error) {
	<-b.gate
	return b.nullBackend.alloc(size, s)
}

// TestCloseWaitsForAlloc: an Alloc in flight when Close begins finishes
// with its buffer, which Close, having waited for it, reports as leaked.
func TestCloseWaitsForAlloc(t *testing.T) {
	be := &gatedBackend{gate: make(chan struct{})}
	a := openOn(t, be)
	allocated := make(chan *Buffer, 1)
	go func() {
		b, err := a.Alloc(256, a.DefaultStream())
		require.NoError(t, err)
		allocated <- b
	}()
	for a.inFlight() == 0 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned while an Alloc was in flight: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(be.gate)
	b := <-allocated
	var leak *LeakError
	require.ErrorAs(t, <-closed, &leak)
	require.Equal(t, 1, leak.Count)
	require.Equal(t, b.ID(), leak.Buffers[0].ID)
	require.ErrorIs(t, b.Free(), distbuf.ErrClosed)
}
