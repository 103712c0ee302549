package hostblas

import (
	"fmt"
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"
)

// matrix is a row-major operand as stored: rows x cols with row stride ld,
// its elements as complex128 whatever the dtype under test.
type matrix struct {
	rows, cols, ld int
	v              []complex128
}

// randMatrix has ld-cols elements of padding after each row, filled with
// NaN: a product that reads them, or reads past its matrix, shows it.
func randMatrix(rng *rand.Rand, rows, cols, pad int, complexValues bool) matrix {
	ld := cols + pad
	if ld == 0 {
		ld = 1
	}
	x := matrix{rows: rows, cols: cols, ld: ld, v: make([]complex128, rows*ld)}
	for i := range x.v {
		if i%ld >= cols {
			x.v[i] = complex(math.NaN(), math.NaN())
			continue
		}
		re, im := rng.Float64()*2-1, 0.0
		if complexValues {
			im = rng.Float64()*2 - 1
		}
		x.v[i] = complex(re, im)
	}
	return x
}

// naive is the definition, with nothing shared with the code under test:
// out[i][j] = alpha * sum_l opA(i,l)*opB(l,j) + beta*C[i][j], beta*C left
// out when beta is 0 and the sum when alpha is 0, and the magnitude
// |alpha| sum |opA||opB| + |beta||C| that bounds its rounding error.
func naive(transA, transB bool, m, n, k int, alpha complex128, a, b matrix, beta complex128, c matrix) (out, mag []complex128) {
	opA := func(i, l int) complex128 {
		if transA {
			return a.v[l*a.ld+i]
		}
		return a.v[i*a.ld+l]
	}
	opB := func(l, j int) complex128 {
		if transB {
			return b.v[j*b.ld+l]
		}
		return b.v[l*b.ld+j]
	}
	out = append([]complex128(nil), c.v...)
	mag = make([]complex128, len(c.v))
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var sum complex128
			var abs float64
			if alpha != 0 {
				for l := 0; l < k; l++ {
					sum += opA(i, l) * opB(l, j)
					abs += cmplx.Abs(opA(i, l)) * cmplx.Abs(opB(l, j))
				}
			}
			r := alpha * sum
			bound := cmplx.Abs(alpha) * abs
			if beta != 0 {
				r += beta * c.v[i*c.ld+j]
				bound += cmplx.Abs(beta) * cmplx.Abs(c.v[i*c.ld+j])
			}
			out[i*c.ld+j] = r
			mag[i*c.ld+j] = complex(bound, 0)
		}
	}
	return out, mag
}

func convert[T Elem](v []complex128) []T {
	out := make([]T, len(v))
	for i, x := range v {
		switch p := any(&out[i]).(type) {
		case *float32:
			*p = float32(real(x))
		case *float64:
			*p = real(x)
		case *complex64:
			*p = complex64(x)
		case *complex128:
			*p = x
		}
	}
	return out
}

func widen[T Elem](x T) complex128 {
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

func eps[T Elem]() float64 {
	switch any(*new(T)).(type) {
	case float32, complex64:
		return 1e-6
	}
	return 1e-15
}

// product is one call's arguments.
type product struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    complex128
	pad            int
}

func (p product) String() string {
	op := func(t bool) string { return map[bool]string{false: "N", true: "T"}[t] }
	return fmt.Sprintf("%s%s/m=%d/n=%d/k=%d/alpha=%v/beta=%v/pad=%d", op(p.transA), op(p.transB), p.m, p.n, p.k, p.alpha, p.beta, p.pad)
}

// check runs p in T against naive and fails on an element out of bounds,
// on padding written, or on a NaN where the definition has none.
func check[T Elem](t *testing.T, rng *rand.Rand, p product, w *Workspace) {
	t.Helper()
	cplx := isComplex[T]()
	ar, ac := p.m, p.k
	if p.transA {
		ar, ac = p.k, p.m
	}
	br, bc := p.k, p.n
	if p.transB {
		br, bc = p.n, p.k
	}
	a := randMatrix(rng, ar, ac, p.pad, cplx)
	b := randMatrix(rng, br, bc, p.pad, cplx)
	c := randMatrix(rng, p.m, p.n, p.pad, cplx)
	if p.beta == 0 { // C must be written without being read
		for i := range c.v {
			c.v[i] = complex(math.NaN(), math.NaN())
		}
	}
	if p.alpha == 0 { // A and B must not be read
		for i := range a.v {
			a.v[i] = complex(math.NaN(), 0)
		}
		for i := range b.v {
			b.v[i] = complex(math.Inf(-1), 0)
		}
	}
	alpha, beta := p.alpha, p.beta
	if !cplx {
		alpha, beta = complex(real(alpha), 0), complex(real(beta), 0)
	}
	// The reference computes from the values as T holds them.
	for _, x := range []*matrix{&a, &b, &c} {
		for i, v := range convert[T](x.v) {
			x.v[i] = widen(v)
		}
	}
	want, mag := naive(p.transA, p.transB, p.m, p.n, p.k, alpha, a, b, beta, c)
	got := convert[T](c.v)
	Gemm(p.transA, p.transB, p.m, p.n, p.k, convert[T]([]complex128{alpha})[0], convert[T](a.v), a.ld, convert[T](b.v), b.ld,
		convert[T]([]complex128{beta})[0], got, c.ld, w)
	tol := eps[T]() * float64(4*p.k+8)
	for i := range want {
		g := widen(got[i])
		r, cc := i/c.ld, i%c.ld
		if cc >= p.n { // padding: untouched
			if !cmplx.IsNaN(g) {
				t.Fatalf("%v: padding element (%d, %d) written: %v", p, r, cc, g)
			}
			continue
		}
		if cmplx.IsNaN(g) || cmplx.IsInf(g) || cmplx.Abs(g-want[i]) > tol*(real(mag[i])+1e-300) && g != want[i] {
			t.Fatalf("%v: C(%d, %d) = %v, want %v (bound %g)", p, r, cc, g, want[i], tol*real(mag[i]))
		}
	}
}

func forEachType(t *testing.T, f func(t *testing.T, name string, run func(*rand.Rand, product, *Workspace))) {
	t.Run("float32", func(t *testing.T) {
		f(t, "float32", func(r *rand.Rand, p product, w *Workspace) { check[float32](t, r, p, w) })
	})
	t.Run("float64", func(t *testing.T) {
		f(t, "float64", func(r *rand.Rand, p product, w *Workspace) { check[float64](t, r, p, w) })
	})
	t.Run("complex64", func(t *testing.T) {
		f(t, "complex64", func(r *rand.Rand, p product, w *Workspace) { check[complex64](t, r, p, w) })
	})
	t.Run("complex128", func(t *testing.T) {
		f(t, "complex128", func(r *rand.Rand, p product, w *Workspace) { check[complex128](t, r, p, w) })
	})
}

// TestShapes runs every pair of operations over shapes on both paths and
// across the tile and cache-block edges: 1 x 1, k = 1, non-square, sizes
// that are no multiple of a tile, and the special scalars.
func TestShapes(t *testing.T) {
	dims := []int{1, 2, 3, 5, 7, 8, 9, 13, 33}
	shapes := [][3]int{{1, 1, 1}, {1, 1, 9}, {9, 1, 1}, {1, 9, 1}, {7, 5, 1}, {3, 17, 2}, {17, 3, 11}, {blockM + 3, 6, 5}, {5, blockN + 3, 2}, {6, 5, blockK + 7}, {0, 3, 2}, {3, 0, 2}, {3, 2, 0}}
	for _, m := range dims {
		for _, n := range dims {
			for _, k := range dims {
				if (m*7+n*3+k)%3 == 0 { // a third of the cube, spread over it
					shapes = append(shapes, [3]int{m, n, k})
				}
			}
		}
	}
	scalars := [][2]complex128{{1, 0}, {1, 1}, {0, 0.5}, {0, 0}, {-0.75, 2}, {complex(0.5, -1.5), complex(-0.25, 0.75)}}
	forEachType(t, func(t *testing.T, _ string, run func(*rand.Rand, product, *Workspace)) {
		rng := rand.New(rand.NewPCG(1, 2))
		var w Workspace
		for _, s := range shapes {
			for _, ops := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				for i, sc := range scalars {
					run(rng, product{ops[0], ops[1], s[0], s[1], s[2], sc[0], sc[1], i % 3}, &w)
				}
			}
		}
	})
}

// TestRandom draws products of random shapes, strides, operations and
// scalars, one Workspace reused across them as the engine does.
func TestRandom(t *testing.T) {
	forEachType(t, func(t *testing.T, _ string, run func(*rand.Rand, product, *Workspace)) {
		rng := rand.New(rand.NewPCG(3, 4))
		var w Workspace
		dim := func() int {
			if rng.IntN(4) == 0 {
				return 1 + rng.IntN(70)
			}
			return 1 + rng.IntN(10)
		}
		scalar := func() complex128 {
			switch rng.IntN(5) {
			case 0:
				return 0
			case 1:
				return 1
			}
			return complex(rng.Float64()*4-2, rng.Float64()*4-2)
		}
		for range 300 {
			run(rng, product{rng.IntN(2) == 1, rng.IntN(2) == 1, dim(), dim(), dim(), scalar(), scalar(), rng.IntN(4)}, &w)
		}
	})
}

// FuzzGemm checks any shape, pair of operations and scalars in float64
// and complex128.
func FuzzGemm(f *testing.F) {
	f.Add(uint8(3), uint8(4), uint8(5), uint8(0), 1.0, 0.0, 0.5, 0.0, uint8(1), uint64(1))
	f.Add(uint8(40), uint8(9), uint8(33), uint8(3), -1.5, 0.25, 0.0, 0.0, uint8(0), uint64(2))
	f.Fuzz(func(t *testing.T, m, n, k, ops uint8, ar, ai, br, bi float64, pad uint8, seed uint64) {
		for _, v := range []float64{ar, ai, br, bi} {
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e6 {
				t.Skip()
			}
		}
		p := product{ops&1 == 1, ops&2 == 2, int(m % 80), int(n % 80), int(k % 80), complex(ar, ai), complex(br, bi), int(pad % 4)}
		rng := rand.New(rand.NewPCG(seed, 5))
		check[float64](t, rng, p, nil)
		check[complex128](t, rng, p, nil)
	})
}

func TestRefusesShortOperands(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func()
	}{
		{"short A", func() {
			Gemm(false, false, 2, 2, 2, 1, make([]float64, 3), 2, make([]float64, 4), 2, 0, make([]float64, 4), 2, nil)
		}},
		{"short B transposed", func() {
			Gemm(false, true, 2, 3, 2, 1, make([]float64, 4), 2, make([]float64, 5), 2, 0, make([]float64, 6), 3, nil)
		}},
		{"short C", func() {
			Gemm(false, false, 2, 2, 2, 1, make([]float64, 4), 2, make([]float64, 4), 2, 0, make([]float64, 3), 2, nil)
		}},
		{"stride under a row", func() {
			Gemm(false, false, 2, 2, 2, 1, make([]float64, 4), 1, make([]float64, 4), 2, 0, make([]float64, 4), 2, nil)
		}},
		{"negative k", func() { Gemm(false, false, 2, 2, -1, 1, nil, 1, nil, 2, 0, make([]float64, 4), 2, nil) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			c.run()
		})
	}
}
