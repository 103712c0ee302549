package packing

import (
	"os"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

// backendCase is one allocator the shared tests run on.
type backendCase struct {
	name string
	open func(t *testing.T) *devalloc.Allocator
}

func openHost(t *testing.T) *devalloc.Allocator {
	t.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(m string) { t.Log(m) }})
	require.NoError(t, err)
	return a
}

// openCUDA skips without a GPU, and fails when DISTBUF_REQUIRE_GPU=1 says
// the machine has one.
func openCUDA(t *testing.T) *devalloc.Allocator {
	t.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Warn: func(m string) { t.Log(m) }})
	if err != nil {
		if os.Getenv("DISTBUF_REQUIRE_GPU") == "1" {
			t.Fatalf("DISTBUF_REQUIRE_GPU=1 but the CUDA backend does not open: %v", err)
		}
		t.Skipf("CUDA backend unavailable: %v", err)
	}
	return a
}

var backends = []backendCase{{"host", openHost}, {"cuda", openCUDA}}

func closeClean(t *testing.T, a *devalloc.Allocator) {
	t.Helper()
	require.NoError(t, a.Sync())
	require.NoError(t, a.Close())
}

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

func requireGPU() bool { return os.Getenv("DISTBUF_REQUIRE_GPU") == "1" }
