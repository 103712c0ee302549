// Package gputest decides, for tests, what a missing GPU means: a skip that
// says why on machines without one, and a failure where the environment
// promises one (DISTBUF_REQUIRE_GPU=1, set on the GPU machine). It depends on
// nothing, so the CUDA loaders' own tests can use it.
package gputest

import (
	"os"
	"testing"
)

// EnvRequireGPU set to 1 turns every skip for want of a GPU into a failure.
const EnvRequireGPU = "DISTBUF_REQUIRE_GPU"

// Required reports whether the environment promises a usable GPU.
func Required() bool { return os.Getenv(EnvRequireGPU) == "1" }

// Unavailable ends the test because what (the CUDA runtime, cuBLAS, the CUDA
// backend) could not be used: it fails under DISTBUF_REQUIRE_GPU=1 and skips
// otherwise, with the reason either way.
func Unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if Required() {
		t.Fatalf("%s=1 but %s is unusable: %v", EnvRequireGPU, what, err)
	}
	t.Skipf("%s unavailable (%s=1 makes this a failure): %v", what, EnvRequireGPU, err)
}
