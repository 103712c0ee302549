// Package mpitest is the TestMain of test binaries that need MPI: it
// brings MPI up once for the binary (the in-process one-rank world without
// the mpi build tag, the real world under mpirun with it), runs the tests
// and ends MPI. It owns nothing past Run.
package mpitest

import (
	"fmt"
	"os"
	"testing"

	"github.com/distbuf/distbuf/cluster"
)

// Run runs m's tests between cluster.Init and cluster.Finalize and returns
// the binary's exit code: the tests', or 1 when MPI would not come up or
// end cleanly.
func Run(m *testing.M) int {
	if err := cluster.Init(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster.Init:", err)
		return 1
	}
	code := m.Run()
	if err := cluster.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster.Finalize:", err)
		return 1
	}
	return code
}
