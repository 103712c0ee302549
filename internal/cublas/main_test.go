package cublas

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
)

// TestMain runs the tests on the real CUDA libraries when a GPU is there,
// and on the fake libcudart and libcublas otherwise.
func TestMain(m *testing.M) { cudarttest.Main(m) }
