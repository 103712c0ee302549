package packing

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cukernel/cudafake"
)

// TestMain runs the tests on the real CUDA libraries when they load, and on
// CPU stand-ins otherwise.
func TestMain(m *testing.M) { cudafake.Main(m) }
