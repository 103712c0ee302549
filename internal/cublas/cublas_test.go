//go:build cgo

package cublas

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/distbuf/distbuf/internal/gputest"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/stretchr/testify/require"
)

func loadOrSkip(t *testing.T) (*Lib, *cudart.Device) {
	t.Helper()
	l, err := Load()
	var d *cudart.Device
	if err == nil {
		var rt *cudart.Runtime
		if rt, err = cudart.Load(); err == nil {
			d = rt.Device(0)
			_, _, err = d.ComputeCapability()
		}
	}
	if err != nil {
		gputest.Unavailable(t, "cuBLAS", err)
	}
	return l, d
}

// newHandle loads cuBLAS and makes a handle on device 0, destroyed at the
// end of the test.
func newHandle(t *testing.T) (*cudart.Device, *Handle) {
	t.Helper()
	l, d := loadOrSkip(t)
	h, err := l.NewHandle(0, 0, false)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Destroy()) })
	return d, h
}

func TestLoadMissingLibrary(t *testing.T) {
	if _, err := cudart.Load(); err != nil {
		gputest.Unavailable(t, "the CUDA runtime", err)
	}
	t.Setenv(EnvCUBLAS, "libcublas-does-not-exist.so.99")
	_, err := load()
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "libcublas-does-not-exist.so.99")
}

func f64bytes(v []float64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 8*len(v))
}

// colMajor computes C = alpha A B + beta C for column-major A (m x k), B (k x n).
func colMajor(m, n, k int, alpha float64, a, b []float64, beta float64, c []float64) []float64 {
	out := make([]float64, m*n)
	for j := range n {
		for i := range m {
			var s float64
			for l := range k {
				s += a[i+l*m] * b[l+j*k]
			}
			out[i+j*m] = alpha*s + beta*c[i+j*m]
		}
	}
	return out
}

func TestDgemmKinds(t *testing.T) {
	d, h := newHandle(t)
	const m, n, k, batch = 3, 4, 5, 3
	rng := rand.New(rand.NewPCG(1, 1))
	rnd := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = rng.Float64()
		}
		return v
	}
	A, B, C := rnd(batch*m*k), rnd(batch*k*n), rnd(batch*m*n)
	up := func(v []float64) uintptr {
		p, err := d.Malloc(int64(8 * len(v)))
		require.NoError(t, err)
		require.NoError(t, d.CopyToDevice(p, f64bytes(v)))
		t.Cleanup(func() { _ = d.Free(p) })
		return p
	}
	down := func(p uintptr, n int) []float64 {
		out := make([]float64, n)
		require.NoError(t, d.CopyFromDevice(f64bytes(out), p))
		return out
	}
	want := make([]float64, 0, len(C))
	for i := range batch {
		want = append(want, colMajor(m, n, k, 2, A[i*m*k:(i+1)*m*k], B[i*k*n:(i+1)*k*n], 0.5, C[i*m*n:(i+1)*m*n])...)
	}
	check := func(got []float64) {
		t.Helper()
		for i := range want {
			require.InDelta(t, want[i], got[i], 1e-12*math.Max(1, math.Abs(want[i])))
		}
	}
	dA, dB := up(A), up(B)
	// One gemm per matrix.
	dC := up(C)
	for i := range batch {
		require.NoError(t, h.Gemm(D, N, N, m, n, k, 2, dA+uintptr(8*i*m*k), m, dB+uintptr(8*i*k*n), k, 0.5, dC+uintptr(8*i*m*n), m))
	}
	check(down(dC, len(C)))
	// Strided batched.
	dC = up(C)
	require.NoError(t, h.GemmStrided(D, N, N, m, n, k, 2, dA, m, m*k, dB, k, k*n, 0.5, dC, m, m*n, batch))
	check(down(dC, len(C)))
	// Pointer arrays.
	dC = up(C)
	ptrs := make([]byte, 3*8*batch)
	for i := range batch {
		binary.LittleEndian.PutUint64(ptrs[8*i:], uint64(dA)+uint64(8*i*m*k))
		binary.LittleEndian.PutUint64(ptrs[8*(batch+i):], uint64(dB)+uint64(8*i*k*n))
		binary.LittleEndian.PutUint64(ptrs[8*(2*batch+i):], uint64(dC)+uint64(8*i*m*n))
	}
	dP, err := d.Malloc(int64(len(ptrs)))
	require.NoError(t, err)
	defer d.Free(dP)
	require.NoError(t, d.CopyToDevice(dP, ptrs))
	require.NoError(t, h.GemmBatched(D, N, N, m, n, k, 2, dP, m, dP+8*batch, k, 0.5, dP+16*batch, m, batch))
	check(down(dC, len(C)))
	// Grouped: the same three problems as groups of 1 and 2.
	require.True(t, h.l.HasGrouped(), "CUDA 13 has grouped batched GEMM")
	dC = up(C)
	for i := range batch {
		binary.LittleEndian.PutUint64(ptrs[8*(2*batch+i):], uint64(dC)+uint64(8*i*m*n))
	}
	require.NoError(t, d.CopyToDevice(dP, ptrs))
	g := Group{TransA: N, TransB: N, M: m, N: n, K: k, Alpha: 2, Beta: 0.5, LdA: m, LdB: k, LdC: m}
	g1, g2 := g, g
	g1.Size, g2.Size = 1, 2
	require.NoError(t, h.GemmGrouped(D, []Group{g1, g2}, dP, dP+8*batch, dP+16*batch))
	check(down(dC, len(C)))
	require.NoError(t, d.Synchronize())
	// A bad leading dimension is a cuBLAS error, not a crash.
	require.ErrorIs(t, h.Gemm(D, N, N, m, n, k, 1, dA, 1, dB, k, 0, dC, m), ErrCUBLAS)
}

func TestZgemm(t *testing.T) {
	d, h := newHandle(t)
	// 1x1 complex product: (1+2i)(3-1i) = 5+5i, times alpha i = -5+5i.
	vals := []complex128{1 + 2i, 3 - 1i, 0}
	p, err := d.Malloc(48)
	require.NoError(t, err)
	defer d.Free(p)
	require.NoError(t, d.CopyToDevice(p, unsafe.Slice((*byte)(unsafe.Pointer(&vals[0])), 48)))
	require.NoError(t, h.Gemm(Z, N, N, 1, 1, 1, 1i, p, 1, p+16, 1, 0, p+32, 1))
	out := make([]complex128, 3)
	require.NoError(t, d.CopyFromDevice(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 48), p))
	require.Equal(t, complex(-5, 5), out[2])
}

// encode writes complex values as elements of dt.
func encode(dt DType, v []complex128) []byte {
	size := [...]int{4, 8, 8, 16}[dt]
	out := make([]byte, size*len(v))
	for i, x := range v {
		p := unsafe.Pointer(&out[size*i])
		switch dt {
		case S:
			*(*float32)(p) = float32(real(x))
		case D:
			*(*float64)(p) = real(x)
		case C:
			*(*complex64)(p) = complex64(x)
		case Z:
			*(*complex128)(p) = x
		}
	}
	return out
}

func decode(dt DType, b []byte) []complex128 {
	size := [...]int{4, 8, 8, 16}[dt]
	out := make([]complex128, len(b)/size)
	for i := range out {
		p := unsafe.Pointer(&b[size*i])
		switch dt {
		case S:
			out[i] = complex(float64(*(*float32)(p)), 0)
		case D:
			out[i] = complex(*(*float64)(p), 0)
		case C:
			out[i] = complex128(*(*complex64)(p))
		case Z:
			out[i] = *(*complex128)(p)
		}
	}
	return out
}

// TestAllTypesTransposed runs a transposed strided batch and a single GEMM
// in every precision against a column-major reference.
func TestAllTypesTransposed(t *testing.T) {
	d, h := newHandle(t)
	const m, n, k, batch = 3, 2, 4, 2
	rng := rand.New(rand.NewPCG(3, 3))
	for _, dt := range []DType{S, D, C, Z} {
		val := func() complex128 {
			if dt == C || dt == Z {
				return complex(rng.Float64(), rng.Float64())
			}
			return complex(rng.Float64(), 0)
		}
		// A is stored k x m (op T), B stored n x k (op T), C m x n.
		A, B, Cm := make([]complex128, batch*k*m), make([]complex128, batch*n*k), make([]complex128, batch*m*n)
		for _, v := range [][]complex128{A, B, Cm} {
			for i := range v {
				v[i] = val()
			}
		}
		alpha, beta := val(), val()
		want := make([]complex128, len(Cm))
		for bi := range batch {
			for j := range n {
				for i := range m {
					var s complex128
					for x := range k {
						s += A[bi*k*m+x+i*k] * B[bi*n*k+j+x*n]
					}
					want[bi*m*n+i+j*m] = alpha*s + beta*Cm[bi*m*n+i+j*m]
				}
			}
		}
		up := func(v []complex128) uintptr {
			b := encode(dt, v)
			p, err := d.Malloc(int64(len(b)))
			require.NoError(t, err)
			require.NoError(t, d.CopyToDevice(p, b))
			t.Cleanup(func() { _ = d.Free(p) })
			return p
		}
		dA, dB, dC := up(A), up(B), up(Cm)
		require.NoError(t, h.GemmStrided(dt, T, T, m, n, k, alpha, dA, k, k*m, dB, n, n*k, beta, dC, m, m*n, batch))
		got := make([]byte, len(encode(dt, Cm)))
		require.NoError(t, d.CopyFromDevice(got, dC))
		tol := 1e-12
		if dt == S || dt == C {
			tol = 1e-5
		}
		for i, g := range decode(dt, got) {
			require.InDelta(t, 0, cmplxAbs(g-want[i]), tol*8, "%v element %d: got %v want %v", dt, i, g, want[i])
		}
		if dt == S || dt == D {
			// The same batch as one grouped call (a group of 1 and a group of 1).
			dCg := up(Cm)
			ptrs := make([]byte, 3*8*batch)
			for i := range batch {
				binary.LittleEndian.PutUint64(ptrs[8*i:], uint64(dA)+uint64(i*k*m*len(encode(dt, []complex128{0}))))
				binary.LittleEndian.PutUint64(ptrs[8*(batch+i):], uint64(dB)+uint64(i*n*k*len(encode(dt, []complex128{0}))))
				binary.LittleEndian.PutUint64(ptrs[8*(2*batch+i):], uint64(dCg)+uint64(i*m*n*len(encode(dt, []complex128{0}))))
			}
			dP, err := d.Malloc(int64(len(ptrs)))
			require.NoError(t, err)
			require.NoError(t, d.CopyToDevice(dP, ptrs))
			g := Group{TransA: T, TransB: T, M: m, N: n, K: k, Alpha: real(alpha), Beta: real(beta), LdA: k, LdB: n, LdC: m, Size: 1}
			require.NoError(t, h.GemmGrouped(dt, []Group{g, g}, dP, dP+8*batch, dP+16*batch))
			gotg := make([]byte, len(encode(dt, Cm)))
			require.NoError(t, d.CopyFromDevice(gotg, dCg))
			for i, v := range decode(dt, gotg) {
				require.InDelta(t, 0, cmplxAbs(v-want[i]), tol*8, "%v grouped element %d", dt, i)
			}
			require.NoError(t, d.Free(dP))
		} else {
			require.ErrorIs(t, h.GemmGrouped(dt, nil, 0, 0, 0), ErrUnavailable, "no grouped GEMM for complex types")
		}
		// The first product alone through the single GEMM.
		dC1 := up(Cm[:m*n])
		require.NoError(t, h.Gemm(dt, T, T, m, n, k, alpha, dA, k, dB, n, beta, dC1, m))
		got1 := make([]byte, len(encode(dt, Cm[:m*n])))
		require.NoError(t, d.CopyFromDevice(got1, dC1))
		for i, g := range decode(dt, got1) {
			require.InDelta(t, 0, cmplxAbs(g-want[i]), tol*8, "%v single element %d", dt, i)
		}
	}
}

func cmplxAbs(z complex128) float64 { return math.Hypot(real(z), imag(z)) }
