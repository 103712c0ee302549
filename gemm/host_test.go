package gemm

import (
	"fmt"
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"

	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// TestHostEdges runs the host engine on products on both sides of the
// plain loops' edge, and far from it, in every dtype and pair of
// operations: all dimensions at the edge (the loops), one of m, n or k past
// it (gonum), 1 x 1, a long inner dimension between tiny ones and medium
// blocks (gonum's strides for each transpose), against the naive reference.
func TestHostEdges(t *testing.T) {
	s := openClean(t, openHost).DefaultStream()
	eng := newEngine(t, s)
	rng := rand.New(rand.NewPCG(41, 2))
	for _, dt := range dtypes {
		e := int(hostTinyMax(dt))
		shapes := [][3]int{{e, e, e}, {e + 1, e, e}, {e, e + 1, e}, {e, e, e + 1}, {1, 1, 1}, {2, e + 1, 1}, {3, 40, 2}, {33, 5, 17}, {e - 1, 1, e}}
		for _, ops := range opPairs {
			t.Run(fmt.Sprintf("%v/%v%v", dt, ops[0], ops[1]), func(t *testing.T) {
				var da, db, dc []packing.Desc
				var triples []Triple
				for i, sh := range shapes { // sh is m, k, n
					a, b, c := productDescs(uint64(i), dt, ops, sh[0], sh[1], sh[2])
					da, db, dc = append(da, a), append(db, b), append(dc, c)
					triples = append(triples, Triple{i, i, i})
				}
				A, B, C := makeOperand(t, s, da, rng), makeOperand(t, s, db, rng), makeOperand(t, s, dc, rng)
				pr := Problem{A: A.c, B: B.c, C: C.c, TransA: ops[0], TransB: ops[1], Alpha: randValue(rng, dt), Beta: randValue(rng, dt), Triples: triples}
				ref, mag := reference(pr, A, B, C)
				p, err := NewPlan(pr, Options{})
				require.NoError(t, err)
				runChecked(t, eng, p, dt, C, ref, mag)
				freeOperands(t, A, B, C)
			})
		}
	}
}

// gonumGemm is gonum's product in T.
func gonumGemm[T element]() gemmFunc[T] {
	var impl gonum.Implementation
	var f any
	switch any(*new(T)).(type) {
	case float32:
		f = impl.Sgemm
	case float64:
		f = impl.Dgemm
	case complex64:
		f = impl.Cgemm
	default:
		f = impl.Zgemm
	}
	return f.(func(blas.Transpose, blas.Transpose, int, int, int, T, []T, int, []T, int, T, []T, int))
}

func toElem[T element](x complex128) T {
	var out T
	switch p := any(&out).(type) {
	case *float32:
		*p = float32(real(x))
	case *float64:
		*p = real(x)
	case *complex64:
		*p = complex64(x)
	case *complex128:
		*p = x
	}
	return out
}

func fromElem[T element](x T) complex128 {
	switch v := any(x).(type) {
	case float32:
		return complex(float64(v), 0)
	case float64:
		return complex(v, 0)
	case complex64:
		return complex128(v)
	}
	return any(x).(complex128)
}

// checkTiny runs tinyGemm and gonum on the same packed operands of
// random values and compares the two C's: within rounding of the
// products' magnitudes, and with beta = 0, no trace of the NaN C held
// before. The plain loops must compute what the BLAS call they replace
// computes, at any size.
func checkTiny[T element](t *testing.T, rng *rand.Rand, ta, tb bool, m, n, k int, alpha, beta complex128) {
	t.Helper()
	cplx := fromElem(toElem[T](1i)) != 0
	fill := func(n int) []T {
		out := make([]T, n)
		for i := range out {
			v := complex(rng.Float64()*2-1, 0)
			if cplx {
				v += complex(0, rng.Float64()*2-1)
			}
			out[i] = toElem[T](v)
		}
		return out
	}
	a, b, c := fill(m*k), fill(k*n), fill(m*n)
	if beta == 0 {
		for i := range c {
			c[i] = toElem[T](complex(math.NaN(), math.NaN()))
		}
	}
	lda, ldb := k, n
	if ta {
		lda = m
	}
	if tb {
		ldb = k
	}
	got, want := append([]T(nil), c...), append([]T(nil), c...)
	al, be := toElem[T](alpha), toElem[T](beta)
	tinyGemm(ta, tb, m, n, k, al, a, b, be, got)
	op := map[bool]blas.Transpose{false: blas.NoTrans, true: blas.Trans}
	gonumGemm[T]()(op[ta], op[tb], m, n, k, al, a, lda, b, ldb, be, want, n)
	tol := 1e-13
	if fromElem(toElem[T](1+1e-10)) == 1 { // single precision
		tol = 1e-5
	}
	for i := range got {
		g, w := fromElem(got[i]), fromElem(want[i])
		bound := tol * float64(k+2) * (2*cmplx.Abs(fromElem(al))*float64(k) + 2*cmplx.Abs(fromElem(be)) + 1)
		if cmplx.IsNaN(g) || cmplx.IsNaN(w) || cmplx.Abs(g-w) > bound {
			t.Fatalf("ta %v tb %v m %d n %d k %d alpha %v beta %v: C[%d] = %v, gonum %v", ta, tb, m, n, k, alpha, beta, i, g, w)
		}
	}
}

// TestTinyGemm compares the plain loops with gonum in every dtype and pair
// of operations, up to and past the sizes they take, for the scalars
// that take the branches: beta 0 (C not read), 1 and other, alpha 1 and
// other.
func TestTinyGemm(t *testing.T) {
	scalars := [][2]complex128{{1, 0}, {1, 1}, {-0.5, 0.25}, {complex(0.5, -1.5), complex(-0.25, 0.75)}}
	dims := []int{1, 2, 3, 5, 7, 8, 9, 13}
	run := func(name string, check func(rng *rand.Rand, ta, tb bool, m, n, k int, alpha, beta complex128)) {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 11))
			for _, ops := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				for _, m := range dims {
					for _, n := range dims {
						for _, k := range dims {
							sc := scalars[(m+2*n+3*k)%len(scalars)]
							check(rng, ops[0], ops[1], m, n, k, sc[0], sc[1])
						}
					}
				}
			}
		})
	}
	run("float32", func(rng *rand.Rand, ta, tb bool, m, n, k int, al, be complex128) {
		checkTiny[float32](t, rng, ta, tb, m, n, k, complex(real(al), 0), complex(real(be), 0))
	})
	run("float64", func(rng *rand.Rand, ta, tb bool, m, n, k int, al, be complex128) {
		checkTiny[float64](t, rng, ta, tb, m, n, k, complex(real(al), 0), complex(real(be), 0))
	})
	run("complex64", func(rng *rand.Rand, ta, tb bool, m, n, k int, al, be complex128) {
		checkTiny[complex64](t, rng, ta, tb, m, n, k, al, be)
	})
	run("complex128", func(rng *rand.Rand, ta, tb bool, m, n, k int, al, be complex128) {
		checkTiny[complex128](t, rng, ta, tb, m, n, k, al, be)
	})
}

// FuzzTinyGemm compares the plain loops with gonum for any shape up to
// 24, pair of operations and scalars, in float64 and complex128.
func FuzzTinyGemm(f *testing.F) {
	f.Add(uint8(3), uint8(4), uint8(5), uint8(0), 1.0, 0.0, 0.5, 0.0, uint64(1))
	f.Add(uint8(8), uint8(1), uint8(8), uint8(3), -1.5, 0.25, 0.0, 0.0, uint64(2))
	f.Fuzz(func(t *testing.T, m, n, k, ops uint8, ar, ai, br, bi float64, seed uint64) {
		for _, v := range []float64{ar, ai, br, bi} {
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e6 {
				t.Skip()
			}
		}
		rng := rand.New(rand.NewPCG(seed, 3))
		dm, dn, dk := int(m%24)+1, int(n%24)+1, int(k%24)+1
		checkTiny[float64](t, rng, ops&1 == 1, ops&2 == 2, dm, dn, dk, complex(ar, 0), complex(br, 0))
		checkTiny[complex128](t, rng, ops&1 == 1, ops&2 == 2, dm, dn, dk, complex(ar, ai), complex(br, bi))
	})
}
