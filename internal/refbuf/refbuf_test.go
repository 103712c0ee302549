package refbuf

import (
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/alloctest"
	"github.com/stretchr/testify/require"
)

// TestShared: the buffer lives while any reference does, the creator's
// included, and is freed with the last; references cannot be taken or
// given back once it is gone.
func TestShared(t *testing.T) {
	a := alloctest.OpenHost(t)
	defer alloctest.CloseClean(t, a)
	buf, err := a.Alloc(64, a.DefaultStream())
	require.NoError(t, err)
	s, err := New(buf)
	require.NoError(t, err)
	require.Same(t, buf, s.Buffer())
	require.NoError(t, s.Acquire())
	require.NoError(t, s.Acquire())
	live := func() int64 { return a.Stats().LiveBuffers }
	require.NoError(t, s.Release(), "the creator's reference")
	require.EqualValues(t, 1, live())
	require.NoError(t, s.Release())
	require.EqualValues(t, 1, live(), "one reference left")
	require.NoError(t, s.Release())
	require.Zero(t, live(), "the last reference frees the buffer")
	require.ErrorIs(t, s.Acquire(), distbuf.ErrFreed)
	require.ErrorIs(t, s.Release(), distbuf.ErrFreed)
	_, err = New(nil)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
}
