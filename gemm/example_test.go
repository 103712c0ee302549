package gemm_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/packing"
)

// Two 2x2 products, C[i] = A[i]*B[i], planned once and run as one batch
// on the host backend.
func Example() {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		log.Fatal(err)
	}
	s := a.DefaultStream()

	// A, B and C share one layout: two row-major 2x2 float64 blocks each.
	layout, err := packing.NewPlan([]packing.Desc{
		{ID: 0, DType: packing.Float64, Rows: 2, Cols: 2},
		{ID: 1, DType: packing.Float64, Rows: 2, Cols: 2},
	}, packing.Options{})
	if err != nil {
		log.Fatal(err)
	}
	A := operand(a, layout, 1, 2, 3, 4, 0, 1, 1, 0) // A[1] swaps the rows of B[1]
	B := operand(a, layout, 5, 6, 7, 8, 1, 2, 3, 4)
	C := operand(a, layout, 0, 0, 0, 0, 0, 0, 0, 0)

	// Triples name blocks by position in their buffer.
	plan, err := gemm.NewPlan(gemm.Problem{
		A: A, B: B, C: C, Alpha: 1,
		Triples: []gemm.Triple{{A: 0, B: 0, C: 0}, {A: 1, B: 1, C: 1}},
	}, gemm.Options{})
	if err != nil {
		log.Fatal(err)
	}
	eng, err := gemm.NewEngine(s, gemm.EngineOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if err := eng.Run(plan); err != nil {
		log.Fatal(err)
	}

	// Run only enqueues: OnHost reads C after the products, in stream order.
	err = C.OnHost(s, devalloc.Read, func(h *packing.HostBlocks) error {
		for k := range h.Len() {
			f, err := h.Float64s(k)
			if err != nil {
				return err
			}
			fmt.Println(f)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	err = errors.Join(plan.Close(), eng.Close(), A.Free(), B.Free(), C.Free(), a.Close())
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// [19 22 43 50]
	// [3 4 1 2]
}

// operand allocates a buffer laid out by layout and fills its blocks, in
// order, with values, from Go in the order of the allocator's default
// stream.
func operand(a *devalloc.Allocator, layout *packing.Plan, values ...float64) *packing.Coalesced {
	s := a.DefaultStream()
	c, err := packing.Alloc(a, layout, s)
	if err != nil {
		log.Fatal(err)
	}
	err = c.OnHost(s, devalloc.Write, func(h *packing.HostBlocks) error {
		for k := range h.Len() {
			f, err := h.Float64s(k)
			if err != nil {
				return err
			}
			values = values[copy(f, values):]
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	return c
}
