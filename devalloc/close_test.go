package devalloc

import (
	"sync"
	"testing"
	"time"

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
	require.ErrorIs(t, a.Close(), ErrLeak)
	select {
	case err := <-synced:
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorContains(t, err, "abandoned")
		require.ErrorContains(t, err, "never released")
	case <-time.After(10 * time.Second):
		t.Fatal("Synchronize did not return")
	}
}

// TestCloseRacesFree: Frees and Memsets race with Close. Each Free either
// releases its buffer, which the leak report then leaves out, or returns
// ErrClosed, and the report names the buffer; a Memset either runs before
// Close destroys the streams or returns ErrClosed.
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
						require.ErrorIs(t, err, ErrClosed)
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
				require.ErrorIs(t, err, ErrClosed)
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
