package msg

import (
	"fmt"
	"os"
	"testing"

	"github.com/distbuf/distbuf/cluster"
)

// TestMain brings MPI up once for the binary: the in-process one-rank
// world without the mpi build tag, the real world under mpirun with it.
func TestMain(m *testing.M) {
	cleanup := setupCUDA()
	if err := cluster.Init(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster.Init:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := cluster.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster.Finalize:", err)
		code = 1
	}
	cleanup()
	os.Exit(code)
}
