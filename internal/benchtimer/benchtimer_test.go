package benchtimer

import (
	"errors"
	"testing"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	require.Zero(t, Median(nil))
	require.Equal(t, 2.0, Median([]float64{3, 1, 2}))
	require.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
}

// TestHostTimer: on the host the timer measures the wall clock of each
// call, after one untimed warm-up call, and passes f's error on.
func TestHostTimer(t *testing.T) {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	tm, err := New(a, a.DefaultStream())
	require.NoError(t, err)
	require.Equal(t, "wall-clock", tm.Name())
	calls := 0
	us, err := tm.MedianUS(3, func() error {
		calls++
		time.Sleep(2 * time.Millisecond)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 4, calls)
	require.GreaterOrEqual(t, us, 2000.0)
	boom := errors.New("boom")
	_, err = tm.MedianUS(3, func() error { return boom })
	require.ErrorIs(t, err, boom)
}
