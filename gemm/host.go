package gemm

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/distbuf/distbuf/packing"
	"golang.org/x/sync/errgroup"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
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
	return hostGemm{dt: p.dtype, ta: blasOp(pr.TransA), tb: blasOp(pr.TransB), alpha: o.Alpha, bases: bases, tinyMax: hostTinyMax(p.dtype)}, nil
}

func blasOp(o Op) blas.Transpose {
	if o == Trans {
		return blas.Trans
	}
	return blas.NoTrans
}

// hostGemm is a plan's products bound to host memory: the operands' layout
// starts and the scalars. Products whose dimensions are all at most tinyMax
// take tinyGemm, the others gonum's BLAS.
type hostGemm struct {
	dt      packing.DType
	ta, tb  blas.Transpose
	alpha   complex128
	bases   [3]unsafe.Pointer
	tinyMax int32
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

// products runs probs in order.
func (x hostGemm) products(probs []problem, beta complex128) {
	for i := range probs {
		x.run(&probs[i], beta)
	}
}

// run is one row-major product, as gonum's BLAS computes them: blocks are
// packed, so A's and B's row strides are the plan's and C's is n.
func (x hostGemm) run(q *problem, beta complex128) {
	var impl gonum.Implementation
	switch x.dt {
	case packing.Float64:
		product(x, q, real(x.alpha), real(beta), impl.Dgemm)
	case packing.Float32:
		product(x, q, float32(real(x.alpha)), float32(real(beta)), impl.Sgemm)
	case packing.Complex128:
		product(x, q, x.alpha, beta, impl.Zgemm)
	case packing.Complex64:
		product(x, q, complex64(x.alpha), complex64(beta), impl.Cgemm)
	}
}

// element is what the host products take; gemmFunc is gonum's product of
// one of them.
type (
	element interface {
		float32 | float64 | complex64 | complex128
	}
	gemmFunc[T element] func(tA, tB blas.Transpose, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)
)

func slice[T any](base unsafe.Pointer, off int64, n int) []T {
	return unsafe.Slice((*T)(unsafe.Add(base, off)), n)
}

func product[T element](x hostGemm, q *problem, alpha, beta T, gemm gemmFunc[T]) {
	m, n, k := int(q.m), int(q.n), int(q.k)
	a := slice[T](x.bases[0], q.a, m*k)
	b := slice[T](x.bases[1], q.b, k*n)
	c := slice[T](x.bases[2], q.c, m*n)
	if q.m <= x.tinyMax && q.n <= x.tinyMax && q.k <= x.tinyMax {
		tinyGemm(x.ta == blas.Trans, x.tb == blas.Trans, m, n, k, alpha, a, b, beta, c)
		return
	}
	gemm(x.ta, x.tb, m, n, k, alpha, a, int(q.lda), b, int(q.ldb), beta, c, n)
}

// hostTinyMax is the largest dimension tinyGemm takes in dt. Up to it the
// plain loops beat gonum, whose argument checks and call per row of C cost
// more than such a product's few multiply-adds; above it gonum's SIMD rows
// win in the real dtypes, float32 rows of 8 already (BenchmarkHostGemm,
// vs-gonum and loops-vs-gonum). gonum's complex products are plain loops
// that these beat further up too, but the edge stays at the tiniest
// blocks: the host products are gonum's, not a second BLAS.
func hostTinyMax(dt packing.DType) int32 {
	if dt == packing.Float32 {
		return 7
	}
	return 8
}

// tinyGemm is C = alpha*op(A)*op(B) + beta*C for packed row-major blocks
// (row strides: A's and B's stored columns, n for C) too small for a BLAS
// call to pay. With beta = 0, C is written without being read, as gonum
// does.
func tinyGemm[T element](ta, tb bool, m, n, k int, alpha T, a, b []T, beta T, c []T) {
	rs, cs := k, 1 // op(A)[i,l] = a[i*rs+l*cs]
	if ta {
		rs, cs = 1, m
	}
	if !tb { // row i of C accumulates rows of B, contiguous in j
		for i := range m {
			crow := c[i*n : i*n+n]
			switch beta {
			case 0:
				clear(crow)
			case 1:
			default:
				for j := range crow {
					crow[j] *= beta
				}
			}
			for l := range k {
				s := alpha * a[i*rs+l*cs]
				for j, v := range b[l*n : l*n+n] {
					crow[j] += s * v
				}
			}
		}
		return
	}
	for i := range m { // C[i,j] is op(A)'s row i dotted with B's row j
		crow := c[i*n : i*n+n]
		for j := range crow {
			brow := b[j*k : j*k+k]
			var sum T
			for l, v := range brow {
				sum += a[i*rs+l*cs] * v
			}
			if beta == 0 {
				crow[j] = alpha * sum
			} else {
				crow[j] = beta*crow[j] + alpha*sum
			}
		}
	}
}
