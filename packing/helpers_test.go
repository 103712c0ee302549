package packing

import (
	"testing"

	"github.com/distbuf/distbuf/internal/alloctest"
	"github.com/distbuf/distbuf/internal/gputest"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

var (
	backends   = alloctest.Backends()
	openHost   = alloctest.OpenHost
	openCUDA   = alloctest.OpenCUDA
	closeClean = alloctest.CloseClean
	requireGPU = gputest.Required
)

// readAll copies a buffer's bytes to the host (through pinned memory on a
// device) once the stream has run.
func readAll(t *testing.T, s *devalloc.Stream, b *devalloc.Buffer) []byte {
	t.Helper()
	a := b.Allocator()
	p, err := a.AllocPinned(b.Size(), s)
	require.NoError(t, err)
	require.NoError(t, s.Copy(p, 0, b, 0, b.Size()))
	require.NoError(t, s.Synchronize())
	mem, err := p.Bytes()
	require.NoError(t, err)
	out := append([]byte(nil), mem...)
	require.NoError(t, p.Free())
	return out
}

// writeAll fills a buffer from host bytes in the order of s.
func writeAll(t *testing.T, s *devalloc.Stream, b *devalloc.Buffer, data []byte) {
	t.Helper()
	require.Equal(t, int(b.Size()), len(data))
	p, err := b.Allocator().AllocPinned(b.Size(), s)
	require.NoError(t, err)
	mem, err := p.Bytes()
	require.NoError(t, err)
	copy(mem, data)
	require.NoError(t, s.Copy(b, 0, p, 0, b.Size()))
	require.NoError(t, p.Free())
}
