package packing_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
)

// Plan four blocks of two shapes into one buffer, allocate it with one
// allocator call, and find blocks by position and by id. Blocks of one
// shape form a class: one strided batch, starting on a 256-byte boundary.
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
	c, err := packing.Alloc(a, plan, a.DefaultStream())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("buffer bytes:", c.Size(), "allocations:", a.Stats().AllocCalls)

	// Locate gives a block's class and offset without making a view.
	class, off, ok := c.Locate(3)
	fmt.Println("position 3:", class, off, ok)
	v, err := c.Lookup(11)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("id 11:", v.PlanIndex(), v.Offset(), v.Rows(), v.Cols())

	if err := errors.Join(c.Free(), a.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 2x3: 3 blocks from offset 0, stride 48
	// 4x4: 1 blocks from offset 256, stride 128
	// buffer bytes: 512 allocations: 1
	// position 3: 0 96 true
	// id 11: 1 256 4 4
}

// Blocks bound for different ranks go to different groups, one buffer (and
// one message) per destination; each group's layout starts at offset 0.
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
		members, err := plan.Members(g)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("dest %d: %d blocks, %d bytes, plan indices %v\n",
			grp.Dest, grp.Blocks, grp.Bytes, members)
	}
	i, ok := plan.Index(3)
	if !ok {
		log.Fatal("no block with id 3")
	}
	desc, off, err := plan.Block(i)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("id 3: dest %d, offset %d, %d bytes\n", desc.Dest, off, desc.Bytes())
	// Output:
	// dest 0: 1 blocks, 256 bytes, plan indices [1]
	// dest 2: 2 blocks, 512 bytes, plan indices [0 2]
	// id 3: dest 2, offset 256, 256 bytes
}
