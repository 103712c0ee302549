package alloctest

import (
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/stretchr/testify/require"
)

// Backend is one allocator a package's shared tests run on.
type Backend struct {
	Name string
	Open func(t *testing.T) *devalloc.Allocator
}

// Backends are the host backend and the CUDA backend; the CUDA one skips
// without a GPU (and fails under DISTBUF_REQUIRE_GPU=1).
func Backends() []Backend {
	return []Backend{{Name: "host", Open: OpenHost}, {Name: "cuda", Open: OpenCUDA}}
}

// OpenHost opens a host-backend allocator with the default configuration.
func OpenHost(t *testing.T) *devalloc.Allocator {
	t.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &devalloc.Config{}, Warn: func(m string) { t.Log(m) }})
	require.NoError(t, err)
	return a
}

// OpenCUDA opens a CUDA-backend allocator, or ends the test as
// gputest.Unavailable says.
func OpenCUDA(t *testing.T) *devalloc.Allocator {
	t.Helper()
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Config: &devalloc.Config{}, Warn: func(m string) { t.Log(m) }})
	if err != nil {
		gputest.Unavailable(t, "the CUDA backend", err)
	}
	return a
}

// CloseClean waits for the allocator's work and closes it, requiring that
// nothing leaked.
func CloseClean(t *testing.T, a *devalloc.Allocator) {
	t.Helper()
	require.NoError(t, a.Sync())
	require.NoError(t, a.Close())
}
