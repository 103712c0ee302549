package msg_test

import (
	"errors"
	"fmt"
	"log"
	"slices"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// One step of a block-sparse contraction on every rank: fill an operand
// from Go, multiply into the blocks owed to each rank (the send buffers are
// the GEMM's C operands), exchange, and read what arrived. The same code
// runs on the host backend and, unchanged, on a GPU: devalloc's default
// backend is DISTBUF_BACKEND, else the GPU when there is one. must and
// check end the program on an error.
func Example_contraction() {
	world := must(cluster.World()) // after cluster.Init, once per process
	rank, size := world.Rank(), world.Size()
	a := must(devalloc.Open(devalloc.Options{}))
	s := a.DefaultStream()
	x := must(msg.New(msg.Options{Comm: world, Alloc: a})) // collective

	// The operand: A (id 1, 2x2) = [1 2; 3 rank], filled from Go.
	ops := []packing.Desc{{ID: 1, DType: packing.Float64, Rows: 2, Cols: 2}}
	in := must(packing.Alloc(a, must(packing.NewPlan(ops, packing.Options{})), s))
	check(in.OnHost(s, devalloc.Write, func(h *packing.HostBlocks) error {
		A, err := h.Float64s(0)
		copy(A, []float64{1, 2, 3, float64(rank)})
		return err
	}))

	// The plan by destination: C block 100+r (2x2) is owed to rank r.
	var owed []packing.Desc
	for r := range size {
		owed = append(owed, packing.Desc{ID: uint64(100 + r), DType: packing.Float64, Rows: 2, Cols: 2, Dest: r})
	}
	send := must(msg.AllocSend(a, must(packing.NewPlan(owed, packing.Options{})), s)) // a buffer per rank
	eng := must(gemm.NewEngine(s, gemm.EngineOptions{}))
	for _, c := range send {
		p := must(gemm.NewPlan(gemm.Problem{A: in, B: in, C: c, Alpha: 1,
			Blocks: []gemm.BlockTriple{{A: 1, B: 1, C: uint64(100 + c.Dest())}}}, gemm.Options{}))
		check(errors.Join(eng.Run(p), p.Close()))
	}

	recv := must(x.Exchange(send)) // collective; ordered after the products
	ok := true
	for src := range size {
		c := recv.From(src)
		k := must(c.Position(uint64(100 + rank)))
		check(c.OnHost(s, devalloc.Read, func(h *packing.HostBlocks) error {
			C, err := h.Float64s(k) // rank src's A times itself
			f := float64(src)
			ok = ok && slices.Equal(C, []float64{7, 2 + 2*f, 3 + 3*f, 6 + f*f})
			return err
		}))
	}
	fmt.Println("every block as expected:", ok)

	for _, c := range send {
		check(c.Free())
	}
	check(errors.Join(recv.Free(), in.Free(), eng.Close(), x.Close(), a.Close()))
	// Output:
	// every block as expected: true
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
