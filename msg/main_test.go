package msg

import (
	"os"
	"testing"

	"github.com/distbuf/distbuf/internal/mpitest"
)

// TestMain brings MPI up once for the binary (mpitest), on the CUDA runtime
// setupCUDA chooses.
func TestMain(m *testing.M) {
	cleanup := setupCUDA()
	code := mpitest.Run(m)
	cleanup()
	os.Exit(code)
}
