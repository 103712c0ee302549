package packing_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
)

// Plan four blocks of two shapes into one buffer, allocate it with one
// allocator call, fill a block by id from host code and walk the views.
// Blocks of one shape form a class: one strided batch, starting on a
// 256-byte boundary. OnHost runs the same on the CUDA backend, through a
// pinned staging copy.
func Example() {
	plan, err := packing.NewPlan([]packing.Desc{
		{ID: 10, DType: packing.Float64, Rows: 2, Cols: 3},
		{ID: 11, DType: packing.Float64, Rows: 4, Cols: 4},
		{ID: 12, DType: packing.Float64, Rows: 2, Cols: 3},
		{ID: 13, DType: packing.Float64, Rows: 2, Cols: 3},
	}, packing.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for _, cl := range plan.Classes() {
		fmt.Printf("%dx%d: %d blocks from offset %d, stride %d\n",
			cl.Rows, cl.Cols, cl.Count, cl.Offset, cl.Stride)
	}

	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		log.Fatal(err)
	}
	s := a.DefaultStream()
	c, err := packing.Alloc(a, plan, s)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("buffer bytes:", c.Size(), "allocations:", a.Stats().AllocCalls)

	k, err := c.Position(11)
	if err != nil {
		log.Fatal(err)
	}
	err = c.OnHost(s, devalloc.Write, func(h *packing.HostBlocks) error {
		x, err := h.Float64s(k)
		for i := range x {
			x[i] = float64(i)
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	for k, v := range c.All() {
		d := v.Desc()
		fmt.Printf("position %d: id %d, %dx%d at offset %d\n", k, d.ID, d.Rows, d.Cols, v.Offset())
	}
	err = c.OnHost(s, devalloc.Read, func(h *packing.HostBlocks) error {
		x, err := h.Float64s(k)
		fmt.Println("id 11:", x)
		return err
	})
	if err := errors.Join(err, c.Free(), a.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 2x3: 3 blocks from offset 0, stride 48
	// 4x4: 1 blocks from offset 256, stride 128
	// buffer bytes: 512 allocations: 1
	// position 0: id 10, 2x3 at offset 0
	// position 1: id 11, 4x4 at offset 256
	// position 2: id 12, 2x3 at offset 48
	// position 3: id 13, 2x3 at offset 96
	// id 11: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]
}

// Blocks bound for different ranks go to different groups, one buffer (and
// one message) per destination; each group's layout starts at offset 0.
// The manifest of a group is what its receiver needs to view the blocks.
// msg.AllocSend allocates the groups' buffers, to exchange.
func ExamplePlan_Groups() {
	plan, err := packing.NewPlan([]packing.Desc{
		{ID: 1, DType: packing.Float32, Rows: 8, Cols: 8, Dest: 2},
		{ID: 2, DType: packing.Float32, Rows: 8, Cols: 8, Dest: 0},
		{ID: 3, DType: packing.Float32, Rows: 8, Cols: 8, Dest: 2},
	}, packing.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for g, grp := range plan.Groups() {
		entries, size, err := plan.Manifest(g)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("dest %d: %d blocks, %d bytes:", grp.Dest, grp.Blocks, size)
		for _, e := range entries {
			fmt.Printf(" id %d at %d", e.ID, e.Offset)
		}
		fmt.Println()
	}
	// Output:
	// dest 0: 1 blocks, 256 bytes: id 2 at 0
	// dest 2: 2 blocks, 512 bytes: id 1 at 0 id 3 at 256
}
