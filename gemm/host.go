package gemm

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/distbuf/distbuf/internal/hostblas"
	"github.com/distbuf/distbuf/packing"
	"golang.org/x/sync/errgroup"
)

// parallelFlops is the work below which one goroutine runs a whole wave.
const parallelFlops = 1 << 20

// hostBase is where c's layout begins: view offsets count from there.
func hostBase(c *packing.Coalesced) (unsafe.Pointer, error) {
	mem, err := c.Buffer().Bytes()
	if err != nil {
		return nil, fmt.Errorf("gemm: %w", err)
	}
	return unsafe.Add(unsafe.Pointer(unsafe.SliceData(mem)), c.Start()), nil
}

// runHost enqueues the plan: one stream function per wave whose products
// run in parallel on goroutines (a wave has no two products writing one C
// block), or, for the Loop strategy, one stream function per product.
func (e *Engine) runHost(p *Plan, o Operands) error {
	x, err := newHostGemm(p, o)
	if err != nil {
		return err
	}
	if p.strategy == Loop {
		for _, l := range p.launches {
			probs := p.problems[l.lo:l.hi]
			beta := betaOf(o.Beta, l.wave)
			if err := e.s.Enqueue(func() error { x.products(probs, beta); return nil }); err != nil {
				return fmt.Errorf("gemm: %w", err)
			}
			e.stats.Launches++
		}
		return nil
	}
	for lo := 0; lo < len(p.launches); {
		hi := lo
		for hi < len(p.launches) && p.launches[hi].wave == p.launches[lo].wave {
			hi++
		}
		probs := p.problems[p.launches[lo].lo:p.launches[hi-1].hi]
		beta := betaOf(o.Beta, p.launches[lo].wave)
		if err := e.s.Enqueue(func() error { return x.wave(probs, beta) }); err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
		e.stats.Launches += int64(hi - lo)
		lo = hi
	}
	return nil
}

// newHostGemm binds p's products to o's host memory.
func newHostGemm(p *Plan, o Operands) (hostGemm, error) {
	pr := &p.prob
	var bases [3]unsafe.Pointer
	for i, c := range []*packing.Coalesced{o.A, o.B, o.C} {
		b, err := hostBase(c)
		if err != nil {
			return hostGemm{}, err
		}
		bases[i] = b
	}
	return hostGemm{dt: p.dtype, ta: pr.TransA == Trans, tb: pr.TransB == Trans, alpha: o.Alpha, bases: bases}, nil
}

// hostGemm is a plan's products bound to host memory: the operands' layout
// starts and the scalars.
type hostGemm struct {
	dt     packing.DType
	ta, tb bool
	alpha  complex128
	bases  [3]unsafe.Pointer
}

// wave runs independent products, split among goroutines by flops.
func (x hostGemm) wave(probs []problem, beta complex128) error {
	var total int64
	for i := range probs {
		total += probs[i].flops()
	}
	workers := runtime.GOMAXPROCS(0)
	if total < parallelFlops || len(probs) < 2 || workers < 2 {
		x.products(probs, beta)
		return nil
	}
	var g errgroup.Group
	per := total/int64(workers) + 1
	start, acc := 0, int64(0)
	for i := range probs {
		acc += probs[i].flops()
		if acc >= per || i == len(probs)-1 {
			part := probs[start : i+1]
			g.Go(func() error {
				x.products(part, beta)
				return nil
			})
			start, acc = i+1, 0
		}
	}
	return g.Wait()
}

func slice[T any](base unsafe.Pointer, off int64, n int) []T {
	return unsafe.Slice((*T)(unsafe.Add(base, off)), n)
}

// workspaces holds the host GEMM's operand copies between stream
// functions and goroutines: each takes one for its products.
var workspaces = sync.Pool{New: func() any { return new(hostblas.Workspace) }}

// products runs probs in order with one workspace.
func (x hostGemm) products(probs []problem, beta complex128) {
	w := workspaces.Get().(*hostblas.Workspace)
	defer workspaces.Put(w)
	for i := range probs {
		x.run(&probs[i], beta, w)
	}
}

// run is one row-major product: blocks are packed, so A's and B's row
// strides are the plan's and C's is n.
func (x hostGemm) run(q *problem, beta complex128, w *hostblas.Workspace) {
	m, n, k := int(q.m), int(q.n), int(q.k)
	lda, ldb := int(q.lda), int(q.ldb)
	a, b, c := x.bases[0], x.bases[1], x.bases[2]
	switch x.dt {
	case packing.Float64:
		hostblas.Gemm(x.ta, x.tb, m, n, k, real(x.alpha), slice[float64](a, q.a, m*k), lda,
			slice[float64](b, q.b, k*n), ldb, real(beta), slice[float64](c, q.c, m*n), n, w)
	case packing.Float32:
		hostblas.Gemm(x.ta, x.tb, m, n, k, float32(real(x.alpha)), slice[float32](a, q.a, m*k), lda,
			slice[float32](b, q.b, k*n), ldb, float32(real(beta)), slice[float32](c, q.c, m*n), n, w)
	case packing.Complex128:
		hostblas.Gemm(x.ta, x.tb, m, n, k, x.alpha, slice[complex128](a, q.a, m*k), lda,
			slice[complex128](b, q.b, k*n), ldb, beta, slice[complex128](c, q.c, m*n), n, w)
	case packing.Complex64:
		hostblas.Gemm(x.ta, x.tb, m, n, k, complex64(x.alpha), slice[complex64](a, q.a, m*k), lda,
			slice[complex64](b, q.b, k*n), ldb, complex64(beta), slice[complex64](c, q.c, m*n), n, w)
	}
}
