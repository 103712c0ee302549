// Package gputest decides, for tests, what a CUDA failure means. A GPU that
// is really absent (no library to load, no driver, no device, a build
// without cgo) is a skip that says why on machines without one, and a
// failure where the environment promises a GPU (DISTBUF_REQUIRE_GPU=1, set
// on the GPU machine). Any other error is a failure everywhere: a library
// that loads but lacks a symbol, a failed call, an out-of-memory error must
// not pass as a skip. It imports only the loaders' error types, so every
// package's tests can use it.
package gputest

import (
	"errors"
	"os"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/dl"
)

// EnvRequireGPU set to 1 turns every skip for want of a GPU into a failure.
const EnvRequireGPU = "DISTBUF_REQUIRE_GPU"

// ErrAbsent marks an error that means the GPU is absent for a reason the
// loaders' errors do not carry (too few devices for a test, say): wrap it
// with %w to make Unavailable skip.
var ErrAbsent = errors.New("gputest: GPU absent")

// Required reports whether the environment promises a usable GPU.
func Required() bool { return os.Getenv(EnvRequireGPU) == "1" }

// Absent reports whether err means that the GPU is absent rather than
// broken: a library that cannot be loaded (dl.ErrNotFound), a build without
// cgo (dl.ErrNoCgo), no device or no usable driver (an error of the runtime
// matching cudart.ErrUnavailable, other than a library missing symbols), or
// ErrAbsent.
func Absent(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, dl.ErrMissingSymbol) {
		// The library is there but is not what the loader needs: broken.
		return false
	}
	return errors.Is(err, dl.ErrNotFound) || errors.Is(err, dl.ErrNoCgo) ||
		errors.Is(err, cudart.ErrUnavailable) || errors.Is(err, ErrAbsent)
}

// Unavailable ends the test because what (the CUDA runtime, cuBLAS, the CUDA
// backend) could not be used: a skip when err means the GPU is absent
// (Absent) and DISTBUF_REQUIRE_GPU is not 1, a failure otherwise, with the
// reason either way.
func Unavailable(t testing.TB, what string, err error) {
	t.Helper()
	switch {
	case !Absent(err):
		t.Fatalf("%s is unusable, and not for want of a GPU: %v", what, err)
	case Required():
		t.Fatalf("%s=1 but %s is unusable: %v", EnvRequireGPU, what, err)
	}
	t.Skipf("%s unavailable (%s=1 makes this a failure): %v", what, EnvRequireGPU, err)
}

// DeviceMemory allocates n bytes of d's memory with cudaMalloc, freed at
// the end of the test.
func DeviceMemory(t testing.TB, d *cudart.Device, n int64) uintptr {
	t.Helper()
	p, err := d.Malloc(n)
	if err != nil {
		t.Fatalf("cudaMalloc of %d bytes: %v", n, err)
	}
	t.Cleanup(func() {
		if err := d.Free(p); err != nil {
			t.Errorf("cudaFree: %v", err)
		}
	})
	return p
}
