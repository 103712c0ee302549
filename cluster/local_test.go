//go:build !mpi

package cluster_test

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
)

func unsetenv(name string) { os.Unsetenv(name) }

func checkLauncherLocalRank(t *testing.T, w *cluster.Comm) {
	if w.Rank() != 0 || w.Size() != 1 || w.Local().Rank() != 0 || w.Local().Size() != 1 {
		t.Fatalf("in-process world is rank %d of %d (local %d of %d), want 0 of 1", w.Rank(), w.Size(), w.Local().Rank(), w.Local().Size())
	}
}

func checkCUDAAwareOn(t *testing.T) {
	if _, err := cluster.CUDAAware(); !errors.Is(err, distbuf.ErrBadConfig) {
		t.Fatalf("%s=1 without MPI: %v, want ErrBadConfig", "DISTBUF_MPI_CUDA_AWARE", err)
	}
}

// TestSelfSendWaitsForReceive: in the in-process world a send completes
// when its receive is posted, never before.
func TestSelfSendWaitsForReceive(t *testing.T) {
	w := mustWorld(t)
	sr, err := w.Isend(pinned(t, pattern(0, 0, 3, 10)), 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if done, err := completed(sr); done || err != nil {
			t.Fatalf("unmatched self-send completed: %v %v", done, err)
		}
	}
	in := pinned(t, make([]byte, 10))
	rr, err := w.Irecv(in, cluster.AnySource, cluster.AnyTag)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := completed(sr); !done || err != nil {
		t.Fatalf("matched self-send: done %v err %v", done, err)
	}
	st := wait(t, rr)
	if st != (cluster.Status{Source: 0, Tag: 3, Bytes: 10}) {
		t.Fatalf("status %+v", st)
	}
	sameBytes(t, "self message", in.Bytes(), pattern(0, 0, 3, 10))
}

func TestThreadingInProcess(t *testing.T) {
	mode, provided, err := cluster.Threading()
	if err != nil || mode != cluster.ThreadMultiple || provided == "" {
		t.Fatalf("Threading() = %v, %q, %v", mode, provided, err)
	}
}

// TestAbortEndsTheProcess runs this test binary again, alone, calling
// Abort: in the one-rank world the process is the job. (The abort of a
// job under mpirun is tested by cmd/ranktest.)
func TestAbortEndsTheProcess(t *testing.T) {
	if code := os.Getenv("CLUSTER_TEST_ABORT"); code != "" {
		os.Stderr.WriteString("aborting on purpose\n")
		cluster.Abort(7)
		t.Fatal("Abort returned")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAbortEndsTheProcess$")
	cmd.Env = append(os.Environ(), "CLUSTER_TEST_ABORT=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Fatalf("the aborting process ended with %v, want exit status 7; output:\n%s", err, out)
	}
}
