package msg_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// One step of a block-sparse contraction on every rank: fill the operands
// from Go, multiply into the blocks each rank is owed (the send buffers are
// the GEMM's C operands), exchange them, and read what arrived. The same
// code runs on the host backend and, unchanged, on a GPU (devalloc's
// default backend: DISTBUF_BACKEND, else the GPU when there is one).
func Example_contraction() {
	world, err := cluster.World() // after cluster.Init, once per process
	check(err)
	rank, size := world.Rank(), world.Size()
	a, err := devalloc.Open(devalloc.Options{})
	check(err)
	s := a.DefaultStream()
	x, err := msg.New(msg.Options{Comm: world, Alloc: a}) // collective
	check(err)

	// The operands: A (id 1, 2x3) and B (id 2, 3x2) in one buffer.
	ops, err := packing.NewPlan([]packing.Desc{{ID: 1, DType: packing.Float64, Rows: 2, Cols: 3}, {ID: 2, DType: packing.Float64, Rows: 3, Cols: 2}}, packing.Options{})
	check(err)
	in, err := packing.Alloc(a, ops, s)
	check(err)
	check(in.OnHost(s, devalloc.Write, func(h *packing.HostBlocks) error {
		A, errA := h.Float64s(0)
		B, errB := h.Float64s(1)
		if err := errors.Join(errA, errB); err != nil {
			return err
		}
		for i := range A {
			A[i], B[i] = float64(i+1), float64(rank+1) // A = [1 2 3; 4 5 6]
		}
		return nil
	}))

	// C block 100+r, 2x2, for each rank r: one send buffer per rank.
	var owed []packing.Desc
	for r := range size {
		owed = append(owed, packing.Desc{ID: uint64(100 + r), DType: packing.Float64, Rows: 2, Cols: 2, Dest: r})
	}
	layout, err := packing.NewPlan(owed, packing.Options{})
	check(err)
	send, err := msg.AllocSend(a, layout, s)
	check(err)
	eng, err := gemm.NewEngine(s, gemm.EngineOptions{})
	check(err)
	var plans []*gemm.Plan
	for _, c := range send {
		p, err := gemm.NewPlan(gemm.Problem{A: in, B: in, C: c, Alpha: 1,
			Blocks: []gemm.BlockTriple{{A: 1, B: 2, C: uint64(100 + c.Dest())}}}, gemm.Options{})
		check(err)
		check(eng.Run(p))
		plans = append(plans, p)
	}

	recv, err := x.Exchange(send) // collective; ordered after the products
	check(err)
	ok := true
	for src := range size {
		check(recv.From(src).OnHost(s, devalloc.Read, func(h *packing.HostBlocks) error {
			k, err := recv.From(src).Position(uint64(100 + rank))
			if err != nil {
				return err
			}
			C, err := h.Float64s(k) // rank src's A times its B, all src+1
			f := float64(src + 1)
			ok = ok && fmt.Sprint(C) == fmt.Sprint([]float64{6 * f, 6 * f, 15 * f, 15 * f})
			return err
		}))
	}
	fmt.Println("every block as expected:", ok)

	for _, p := range plans {
		check(p.Close())
	}
	for _, c := range send {
		check(c.Free())
	}
	check(errors.Join(recv.Free(), in.Free(), eng.Close(), x.Close(), a.Close()))
	// Output:
	// every block as expected: true
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
