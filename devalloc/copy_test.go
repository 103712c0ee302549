package devalloc_test

import (
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

// TestCopyWithinOneAllocator: a stream copies between buffers of its own
// allocator only; a source or destination of another allocator is refused,
// naming the buffer, and nothing is enqueued.
func TestCopyWithinOneAllocator(t *testing.T) {
	open := func() *devalloc.Allocator {
		a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &devalloc.Config{}})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, a.Close()) })
		return a
	}
	a, b := open(), open()
	s := a.DefaultStream()
	mine, err := a.Alloc(4096, s)
	require.NoError(t, err)
	other, err := b.Alloc(4096, b.DefaultStream())
	require.NoError(t, err)
	require.NoError(t, s.Memset(mine, 0, 4096, 1))
	require.NoError(t, b.DefaultStream().Memset(other, 0, 4096, 2))

	err = s.Copy(mine, 0, other, 0, 4096)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "belongs to another allocator")
	err = s.Copy(other, 0, mine, 0, 4096)
	require.ErrorIs(t, err, distbuf.ErrInvalid)

	require.NoError(t, s.Synchronize())
	require.NoError(t, b.DefaultStream().Synchronize())
	for buf, want := range map[*devalloc.Buffer]byte{mine: 1, other: 2} {
		h, err := buf.Hold(devalloc.Read)
		require.NoError(t, err)
		require.NoError(t, h.Wait())
		bytes, err := buf.Bytes()
		require.NoError(t, err)
		require.Equal(t, want, bytes[0], "nothing was copied")
		require.NoError(t, h.Release())
	}
	require.NoError(t, mine.Free())
	require.NoError(t, other.Free())
}
