package devalloc_test

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
)

// TestMain runs the CUDA tests on the real runtime where there is a GPU and
// on the fake libcudart elsewhere, so that CI runs them too.
func TestMain(m *testing.M) { cudarttest.Main(m) }
