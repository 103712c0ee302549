package cluster_test

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
)

// TestMain calls Init (from a fresh goroutine: any goroutine may) and
// FinalizeWithin, as every MPI test binary must. It first records what the
// package returns before Init, for TestUseBeforeInit, and after Finalize
// checks that every call returns an error matching distbuf.ErrClosed.
func TestMain(m *testing.M) {
	beforeInit = callEverything(nil)
	errc := make(chan error)
	go func() { errc <- cluster.Init() }()
	if err := <-errc; err != nil {
		fmt.Fprintln(os.Stderr, "Init:", err)
		os.Exit(1)
	}
	world, err := cluster.World()
	if err != nil {
		fmt.Fprintln(os.Stderr, "World:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := cluster.FinalizeWithin(time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "Finalize:", err)
		code = 1
	}
	for name, err := range callEverything(world) {
		if !errors.Is(err, distbuf.ErrClosed) {
			fmt.Fprintf(os.Stderr, "after Finalize, %s returned %v, want ErrClosed\n", name, err)
			code = 1
		}
	}
	if err := cluster.Init(); !errors.Is(err, distbuf.ErrClosed) {
		fmt.Fprintf(os.Stderr, "Init after Finalize returned %v, want ErrClosed\n", err)
		code = 1
	}
	os.Exit(code)
}

var beforeInit map[string]error

// callEverything calls each entry point that needs MPI; with a nil world
// only those reachable without a communicator.
func callEverything(world *cluster.Comm) map[string]error {
	errs := map[string]error{}
	_, errs["World"] = cluster.World()
	_, _, errs["Threading"] = cluster.Threading()
	_, errs["MaxTag"] = cluster.MaxTag()
	_, errs["CUDAAware"] = cluster.CUDAAware()
	errs["Finalize"] = cluster.Finalize()
	errs["FinalizeWithin"] = cluster.FinalizeWithin(time.Second)
	_, errs["Request.Wait"] = new(cluster.Request).Wait()
	errs["Waitall"] = cluster.Waitall([]*cluster.Request{new(cluster.Request)})
	_, _, errs["Await"] = cluster.Await([]*cluster.Request{new(cluster.Request)}, nil, nil, 0)
	if world == nil {
		return errs
	}
	buf := cluster.PinBytes(make([]byte, 8))
	defer buf.Release()
	_, errs["Isend"] = world.Isend(buf, 0, 0)
	_, errs["Irecv"] = world.Irecv(buf, 0, 0)
	_, _, errs["Await with a probe"] = cluster.Await(nil, nil, &cluster.Probe{Comm: world}, 0)
	_, errs["Dup"] = world.Dup()
	_, errs["Split"] = world.Split(0, 0)
	errs["Barrier"] = world.Barrier()
	errs["Bcast"] = cluster.Bcast(world, buf.Bytes(), 0)
	x := []int64{1}
	errs["Allreduce"] = cluster.Allreduce(world, x, x, cluster.Sum)
	errs["Allgather"] = cluster.Allgather(world, []byte{1}, make([]byte, world.Size()))
	errs["BarrierWithin"] = world.BarrierWithin(time.Second)
	errs["BcastWithin"] = cluster.BcastWithin(world, buf.Bytes(), 0, time.Second)
	errs["AllreduceWithin"] = cluster.AllreduceWithin(world, x, x, cluster.Sum, time.Second)
	errs["AllgatherWithin"] = cluster.AllgatherWithin(world, []byte{1}, make([]byte, world.Size()), time.Second)
	errs["AlltoallWithin"] = cluster.AlltoallWithin(world, make([]int64, world.Size()), make([]int64, world.Size()), time.Second)
	return errs
}

func TestUseBeforeInit(t *testing.T) {
	if len(beforeInit) == 0 {
		t.Fatal("TestMain recorded nothing before Init")
	}
	for name, err := range beforeInit {
		if !errors.Is(err, cluster.ErrNotInitialized) {
			t.Errorf("%s before Init: %v, want ErrNotInitialized", name, err)
		}
	}
}

func TestInitTwice(t *testing.T) {
	if err := cluster.Init(); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("second Init: %v, want ErrInvalid", err)
	}
	if !cluster.Initialized() {
		t.Fatal("Initialized() = false after Init")
	}
}
