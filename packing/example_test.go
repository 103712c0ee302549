package packing_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"math"

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

// A program that keeps its blocks in device storage of its own (here one
// buffer, block i at byte 32*i) packs them into one buffer per destination
// rank with a Mover. Plan.GroupPosition says where each block of the list
// goes in its group, so each group's Refs follow from the list. Nothing
// waits on the host until the packed blocks are read: the storage is filled
// on one stream, the groups are packed on another, and the storage's ledger
// orders the packs after the fill. devalloc's default backend is
// DISTBUF_BACKEND, else the GPU when there is one: the same code runs on
// the host backend and, unchanged, on a GPU, where the storage is device
// memory and the Mover a gather kernel. must and check end the program on
// an error.
func ExampleNewMover() {
	a := must(devalloc.Open(devalloc.Options{}))
	fill := a.DefaultStream()
	pack := must(a.NewStream())

	// Six 2x2 float64 blocks, bound alternately for ranks 0 and 1.
	descs := make([]packing.Desc, 6)
	for i := range descs {
		descs[i] = packing.Desc{ID: uint64(100 + i), DType: packing.Float64, Rows: 2, Cols: 2, Dest: i % 2}
	}
	const blockBytes = 32
	storage := must(a.Alloc(blockBytes*int64(len(descs)), fill))

	// Fill the storage in the order of fill: element j of block i is
	// 10*i + j, written into pinned memory by a function the stream runs
	// (declared as a write, so that the copy after it reads what it wrote),
	// then copied into the storage.
	staging := must(a.AllocPinned(storage.Size(), fill))
	w := must(staging.Write(fill))
	check(fill.Enqueue(func() error {
		b, err := staging.Bytes()
		for i := range descs {
			for j := range 4 {
				binary.NativeEndian.PutUint64(b[blockBytes*i+8*j:], math.Float64bits(float64(10*i+j)))
			}
		}
		return err
	}))
	check(w.Done())
	check(fill.Copy(storage, 0, staging, 0, storage.Size()))

	// Each group's Refs, in group-position order, from the list.
	plan := must(packing.NewPlan(descs, packing.Options{}))
	refs := make([][]packing.Ref, len(plan.Groups()))
	for g, grp := range plan.Groups() {
		refs[g] = make([]packing.Ref, grp.Blocks)
	}
	for i := range descs {
		g, k, err := plan.GroupPosition(i)
		check(err)
		refs[g][k] = packing.Ref{Buf: storage, Off: blockBytes * int64(i)}
	}

	for g, grp := range plan.Groups() {
		c := must(packing.Alloc(a, plan, pack, packing.AllocOptions{Group: g}))
		m := must(packing.NewMover(pack, c, refs[g]))
		check(m.Pack(pack)) // after the fill: pack waits for it, the host does not
		// The packed buffer is the message to rank grp.Dest; here it is read.
		check(c.OnHost(pack, devalloc.Read, func(h *packing.HostBlocks) error {
			fmt.Printf("rank %d:", grp.Dest)
			for k := range h.Len() {
				d, err := h.Desc(k)
				if err != nil {
					return err
				}
				x, err := h.Float64s(k)
				if err != nil {
					return err
				}
				fmt.Printf(" id %d %v", d.ID, x)
			}
			fmt.Println()
			return nil
		}))
		check(errors.Join(m.Close(), c.Free()))
	}
	check(errors.Join(staging.Free(), storage.Free(), a.Close()))
	// Output:
	// rank 0: id 100 [0 1 2 3] id 102 [20 21 22 23] id 104 [40 41 42 43]
	// rank 1: id 101 [10 11 12 13] id 103 [30 31 32 33] id 105 [50 51 52 53]
}

func must[T any](v T, err error) T {
	check(err)
	return v
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
