package packing

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
)

// TestMain runs the tests on the real CUDA libraries when a GPU is there,
// and on the fake libcudart, libnvrtc and libcublas otherwise, so that the
// CUDA variants run on every machine.
func TestMain(m *testing.M) { cudarttest.Main(m) }
