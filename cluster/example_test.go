package cluster_test

import (
	"fmt"
	"log"
	"os"
	"time"

	"github.com/distbuf/distbuf/cluster"
)

// A rank's life: Init once per process, work on World, Finalize at the end.
// An error this rank's peers cannot learn from a collective ends the job
// with Abort instead of returning, so that no rank waits for ever.
//
// This example has no output check: Init may be called once per process,
// and this package's test binary has already called it. Built without the
// mpi tag the world is this process alone, rank 0 of 1.
func Example() {
	if err := cluster.Init(); err != nil {
		log.Fatal(err)
	}
	world, err := cluster.World()
	if err != nil {
		log.Fatal(err)
	}
	// Sum one value over every rank: the world's size.
	total := []int64{0}
	if err := cluster.Allreduce(world, []int64{1}, total, cluster.Sum); err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", world.Rank(), err)
		cluster.Abort(1)
	}
	fmt.Printf("rank %d of %d sees %d ranks\n", world.Rank(), world.Size(), total[0])
	if err := cluster.Finalize(); err != nil {
		log.Fatal(err)
	}
}

// A nonblocking message to this same rank: it runs in any world, the
// one-process world of a build without the mpi tag included. MPI may hold
// the memory after the call returns, so the Go slices are pinned, and each
// request unpins its slice when it completes.
func ExampleComm_Isend() {
	world, err := cluster.World() // after cluster.Init, once per process
	if err != nil {
		log.Fatal(err)
	}
	self, tag := world.Rank(), 7
	out := cluster.PinBytes([]byte("hello"))
	in := make([]byte, 16) // a receive may be longer than the message
	pinnedIn := cluster.PinBytes(in)

	recv, err := world.Irecv(pinnedIn, self, tag)
	if err != nil {
		log.Fatal(err)
	}
	if err := recv.Attach(pinnedIn); err != nil {
		log.Fatal(err)
	}
	send, err := world.Isend(out, self, tag)
	if err != nil {
		log.Fatal(err)
	}
	if err := send.Attach(out); err != nil {
		log.Fatal(err)
	}
	if err := cluster.Waitall([]*cluster.Request{recv, send}); err != nil {
		log.Fatal(err)
	}
	st, err := recv.Wait() // complete already: its status at once
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q from self: %v, tag %d\n", in[:st.Bytes], st.Source == self, st.Tag)
	// Output: "hello" from self: true, tag 7
}

// A receiver that does not trust the sender's length matches the message
// first (Await with a Probe), reads its length, and only then
// gives memory that holds it all.
func ExampleMessage_Recv() {
	world, err := cluster.World() // after cluster.Init, once per process
	if err != nil {
		log.Fatal(err)
	}
	self, tag := world.Rank(), 8
	out := cluster.PinBytes([]byte("a message of unknown length"))
	send, err := world.Isend(out, self, tag)
	if err != nil {
		log.Fatal(err)
	}
	if err := send.Attach(out); err != nil {
		log.Fatal(err)
	}

	probe := &cluster.Probe{Comm: world, Source: self, Tag: tag}
	_, m, err := cluster.Await(nil, nil, probe, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	if m == nil {
		log.Fatal("no message within 10 s") // Await's timeout is no error
	}
	in := make([]byte, m.Status().Bytes)
	pinnedIn := cluster.PinBytes(in)
	recv, err := m.Recv(pinnedIn)
	if err != nil {
		log.Fatal(err)
	}
	if err := recv.Attach(pinnedIn); err != nil {
		log.Fatal(err)
	}
	if err := cluster.Waitall([]*cluster.Request{recv, send}); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d bytes: %s\n", len(in), in)
	// Output: 27 bytes: a message of unknown length
}
