package devalloc

import (
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
	for a.inflight.Load() == 0 {
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
