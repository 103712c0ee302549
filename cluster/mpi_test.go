//go:build mpi

package cluster_test

import (
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/distbuf/distbuf/cluster"
)

func unsetenv(name string) { syscall.Unsetenv(name) }

// checkLauncherLocalRank compares the node-local rank with what Open MPI's
// launcher says, when it says anything.
func checkLauncherLocalRank(t *testing.T, w *cluster.Comm) {
	for name, got := range map[string]int{
		"OMPI_COMM_WORLD_LOCAL_RANK": w.LocalRank(),
		"OMPI_COMM_WORLD_LOCAL_SIZE": w.LocalSize(),
		"OMPI_COMM_WORLD_RANK":       w.Rank(),
		"OMPI_COMM_WORLD_SIZE":       w.Size(),
	} {
		v, ok := os.LookupEnv(name)
		if !ok {
			continue
		}
		if want, err := strconv.Atoi(v); err != nil || want != got {
			t.Errorf("%s=%s but cluster says %d", name, v, got)
		}
	}
}

func checkCUDAAwareOn(t *testing.T) {
	if aware, err := cluster.CUDAAware(); err != nil || !aware {
		t.Fatalf("%s=1: %v, %v", cluster.EnvCUDAAware, aware, err)
	}
}

func TestThreadLevel(t *testing.T) {
	mode, provided, err := cluster.Threading()
	if err != nil {
		t.Fatal(err)
	}
	want := cluster.ThreadMultiple
	if m, _ := cluster.ParseThreadMode(os.Getenv(cluster.EnvThread)); m == cluster.ThreadFunneled {
		want = cluster.ThreadFunneled
	}
	if mode != want {
		t.Fatalf("Threading() = %v (MPI provided %s), want %v", mode, provided, want)
	}
	if mode == cluster.ThreadMultiple && provided != "MPI_THREAD_MULTIPLE" {
		t.Fatalf("multiple design with MPI providing %s", provided)
	}
	t.Logf("design %v, MPI provided %s", mode, provided)
}

// TestGoPanicsStayRecoverable: MPI must not replace Go's signal handlers,
// or a nil dereference would abort the rank instead of panicking.
func TestGoPanicsStayRecoverable(t *testing.T) {
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		var p *int
		_ = *p
	}()
	if recovered == nil {
		t.Fatal("nil dereference did not panic")
	}
}

func TestCUDAQuery(t *testing.T) {
	t.Setenv(cluster.EnvCUDAAware, "")
	unsetenv(cluster.EnvCUDAAware)
	aware, err := cluster.CUDAAware()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the MPI library reports CUDA-awareness %v", aware)
}
