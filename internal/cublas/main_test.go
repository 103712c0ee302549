package cublas

import (
	"fmt"
	"os"
	"testing"

	"github.com/distbuf/distbuf/internal/cukernel/cudafake"
)

// TestMain runs the tests on the real CUDA libraries when they load, and
// otherwise on CPU stand-ins (internal/cukernel/cudafake), so that the loaders' C
// trampolines are exercised on machines without a GPU too.
func TestMain(m *testing.M) {
	how, cleanup, err := cudafake.Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cudafake:", err)
	} else if os.Getenv("DISTBUF_TEST_SAY_CUDA") != "" {
		fmt.Println("CUDA:", how)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}
