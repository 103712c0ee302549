package msg_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// Every rank sends two blocks to the next rank around a ring, as one
// message, and receives the previous rank's as one pooled buffer whose
// views are the blocks. Without the mpi build tag the world is this process
// alone, so the next rank is this one and the message is one stream copy;
// under mpirun the same code sends through MPI.
func Example() {
	world, err := cluster.World() // after cluster.Init, once per process
	if err != nil {
		log.Fatal(err)
	}
	rank, size := world.Rank(), world.Size()
	next, prev := (rank+1)%size, (rank+size-1)%size

	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		log.Fatal(err)
	}
	x, err := msg.New(msg.Options{Comm: world, Alloc: a}) // collective
	if err != nil {
		log.Fatal(err)
	}

	plan, err := packing.NewPlan([]packing.Desc{
		{ID: 7, DType: packing.Float64, Rows: 1, Cols: 2, Dest: next},
		{ID: 9, DType: packing.Float64, Rows: 2, Cols: 1, Dest: next},
	}, packing.Options{})
	if err != nil {
		log.Fatal(err)
	}
	// One send buffer per destination, with room for the manifest in front.
	send, err := msg.AllocSend(a, plan, a.DefaultStream())
	if err != nil {
		log.Fatal(err)
	}
	fill(send[0], 1.5, 2.5, 3.5, 4.5)

	recv, err := x.Exchange(send) // collective: every rank calls it
	if err != nil {
		log.Fatal(err)
	}
	// OnHost reads after the receive, the buffer's last writer.
	err = recv.From(prev).OnHost(a.DefaultStream(), devalloc.Read, func(h *packing.HostBlocks) error {
		for k := range h.Len() {
			d, errD := h.Desc(k)
			f, errF := h.Float64s(k)
			if err := errors.Join(errD, errF); err != nil {
				return err
			}
			fmt.Printf("block %d (%dx%d): %v\n", d.ID, d.Rows, d.Cols, f)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	st := x.Stats()
	fmt.Println("messages:", st.Messages+st.Routes[msg.RouteSelf].Messages)

	err = errors.Join(recv.Free(), send[0].Free(), x.Close(), a.Close())
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// block 7 (1x2): [1.5 2.5]
	// block 9 (2x1): [3.5 4.5]
	// messages: 1
}

// fill writes values into c's blocks in order, from Go in the order of the
// allocator's default stream, which Exchange's own work on the buffer
// follows.
func fill(c *packing.Coalesced, values ...float64) {
	s := c.Buffer().Allocator().DefaultStream()
	if err := c.OnHost(s, devalloc.Write, func(h *packing.HostBlocks) error {
		for k := range h.Len() {
			f, err := h.Float64s(k)
			values = values[copy(f, values):] // f is nil on error
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		log.Fatal(err)
	}
}
