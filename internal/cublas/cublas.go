//go:build cgo

package cublas

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../cudart
#include <stdint.h>
#include "decl.h"
#include "cudart_setdev.h"

// DEVICE sets the device through internal/cudart (Runtime.SetDeviceFunc).
#define DEVICE() do { if (DBC_SET_DEVICE(setdev, dev) != 0) return -1; } while (0)

static dbc_status c_create(void *setdev, void *f, int dev, uintptr_t *h) {
	DEVICE();
	dbc_handle x = 0;
	dbc_status s = ((dbc_Create_fn)f)(&x);
	*h = (uintptr_t)x;
	return s;
}
static dbc_status c_destroy(void *setdev, void *f, int dev, uintptr_t h) {
	DEVICE();
	return ((dbc_Destroy_fn)f)((dbc_handle)h);
}
static dbc_status c_set_stream(void *setdev, void *f, int dev, uintptr_t h, uintptr_t s) {
	DEVICE();
	return ((dbc_SetStream_fn)f)((dbc_handle)h, (dbc_stream)s);
}
static dbc_status c_set_int(void *setdev, void *f, int dev, uintptr_t h, int v) {
	DEVICE();
	return ((dbc_SetMathMode_fn)f)((dbc_handle)h, v);
}
static const char *c_status_string(void *f, int s) { return f ? ((dbc_GetStatusString_fn)f)(s) : ""; }

#define SCALARS \
	float sa = (float)ar, sb = (float)br; double da = ar, db = br; \
	dbc_c ca = {(float)ar, (float)ai}, cb = {(float)br, (float)bi}; \
	dbc_z za = {ar, ai}, zb = {br, bi};

static dbc_status c_gemm(void *setdev, void *f, int dev, int dt, uintptr_t h, int ta, int tb, int m, int n, int k,
		double ar, double ai, uintptr_t a, int lda, uintptr_t b, int ldb, double br, double bi, uintptr_t c, int ldc) {
	DEVICE();
	SCALARS
	dbc_handle hh = (dbc_handle)h;
	switch (dt) {
	case 0: return ((dbc_Sgemm_fn)f)(hh, ta, tb, m, n, k, &sa, (const float *)a, lda, (const float *)b, ldb, &sb, (float *)c, ldc);
	case 1: return ((dbc_Dgemm_fn)f)(hh, ta, tb, m, n, k, &da, (const double *)a, lda, (const double *)b, ldb, &db, (double *)c, ldc);
	case 2: return ((dbc_Cgemm_fn)f)(hh, ta, tb, m, n, k, &ca, (const dbc_c *)a, lda, (const dbc_c *)b, ldb, &cb, (dbc_c *)c, ldc);
	default: return ((dbc_Zgemm_fn)f)(hh, ta, tb, m, n, k, &za, (const dbc_z *)a, lda, (const dbc_z *)b, ldb, &zb, (dbc_z *)c, ldc);
	}
}

static dbc_status c_gemm_strided(void *setdev, void *f, int dev, int dt, uintptr_t h, int ta, int tb, int m, int n, int k,
		double ar, double ai, uintptr_t a, int lda, long long sa_, uintptr_t b, int ldb, long long sb_,
		double br, double bi, uintptr_t c, int ldc, long long sc_, int batch) {
	DEVICE();
	SCALARS
	dbc_handle hh = (dbc_handle)h;
	switch (dt) {
	case 0: return ((dbc_SgemmStridedBatched_fn)f)(hh, ta, tb, m, n, k, &sa, (const float *)a, lda, sa_, (const float *)b, ldb, sb_, &sb, (float *)c, ldc, sc_, batch);
	case 1: return ((dbc_DgemmStridedBatched_fn)f)(hh, ta, tb, m, n, k, &da, (const double *)a, lda, sa_, (const double *)b, ldb, sb_, &db, (double *)c, ldc, sc_, batch);
	case 2: return ((dbc_CgemmStridedBatched_fn)f)(hh, ta, tb, m, n, k, &ca, (const dbc_c *)a, lda, sa_, (const dbc_c *)b, ldb, sb_, &cb, (dbc_c *)c, ldc, sc_, batch);
	default: return ((dbc_ZgemmStridedBatched_fn)f)(hh, ta, tb, m, n, k, &za, (const dbc_z *)a, lda, sa_, (const dbc_z *)b, ldb, sb_, &zb, (dbc_z *)c, ldc, sc_, batch);
	}
}

static dbc_status c_gemm_batched(void *setdev, void *f, int dev, int dt, uintptr_t h, int ta, int tb, int m, int n, int k,
		double ar, double ai, uintptr_t a, int lda, uintptr_t b, int ldb, double br, double bi, uintptr_t c, int ldc, int batch) {
	DEVICE();
	SCALARS
	dbc_handle hh = (dbc_handle)h;
	switch (dt) {
	case 0: return ((dbc_SgemmBatched_fn)f)(hh, ta, tb, m, n, k, &sa, (const float *const *)a, lda, (const float *const *)b, ldb, &sb, (float *const *)c, ldc, batch);
	case 1: return ((dbc_DgemmBatched_fn)f)(hh, ta, tb, m, n, k, &da, (const double *const *)a, lda, (const double *const *)b, ldb, &db, (double *const *)c, ldc, batch);
	case 2: return ((dbc_CgemmBatched_fn)f)(hh, ta, tb, m, n, k, &ca, (const dbc_c *const *)a, lda, (const dbc_c *const *)b, ldb, &cb, (dbc_c *const *)c, ldc, batch);
	default: return ((dbc_ZgemmBatched_fn)f)(hh, ta, tb, m, n, k, &za, (const dbc_z *const *)a, lda, (const dbc_z *const *)b, ldb, &zb, (dbc_z *const *)c, ldc, batch);
	}
}

static dbc_status c_gemm_grouped(void *setdev, void *f, int dev, int dt, uintptr_t h,
		const int *ta, const int *tb, const int *m, const int *n, const int *k,
		const void *alpha, uintptr_t a, const int *lda, uintptr_t b, const int *ldb, const void *beta,
		uintptr_t c, const int *ldc, int groups, const int *sizes) {
	DEVICE();
	dbc_handle hh = (dbc_handle)h;
	if (dt == 0)
		return ((dbc_SgemmGroupedBatched_fn)f)(hh, (const dbc_op *)ta, (const dbc_op *)tb, m, n, k, (const float *)alpha,
			(const float *const *)a, lda, (const float *const *)b, ldb, (const float *)beta, (float *const *)c, ldc, groups, sizes);
	return ((dbc_DgemmGroupedBatched_fn)f)(hh, (const dbc_op *)ta, (const dbc_op *)tb, m, n, k, (const double *)alpha,
		(const double *const *)a, lda, (const double *const *)b, ldb, (const double *)beta, (double *const *)c, ldc, groups, sizes);
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/dl"
)

// Lib is the loaded cuBLAS library.
type Lib struct {
	lib    *dl.Library
	setDev unsafe.Pointer

	create, destroy, setStream, setMath, setPtrMode, statusString unsafe.Pointer
	gemm, strided, batched                                        [4]unsafe.Pointer
	grouped                                                       [2]unsafe.Pointer
}

var loaded dl.Lazy[*Lib]

// Load opens cuBLAS (and the CUDA runtime, for cudaSetDevice) on first use.
func Load() (*Lib, error) { return loaded.Get(load) }

func load() (*Lib, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	// Every call sets the device first, through internal/cudart.
	l := &Lib{setDev: rt.SetDeviceFunc()}
	table := []dl.Symbol{
		{Name: "cublasCreate_v2", Ptr: &l.create},
		{Name: "cublasDestroy_v2", Ptr: &l.destroy},
		{Name: "cublasSetStream_v2", Ptr: &l.setStream},
		{Name: "cublasSetMathMode", Ptr: &l.setMath},
		{Name: "cublasSetPointerMode_v2", Ptr: &l.setPtrMode},
		{Name: "cublasGetStatusString", Ptr: &l.statusString, Optional: true},
		{Name: "cublasSgemmGroupedBatched", Ptr: &l.grouped[0], Optional: true},
		{Name: "cublasDgemmGroupedBatched", Ptr: &l.grouped[1], Optional: true},
	}
	for i, p := range []string{"S", "D", "C", "Z"} {
		table = append(table,
			dl.Symbol{Name: "cublas" + p + "gemm_v2", Ptr: &l.gemm[i]},
			dl.Symbol{Name: "cublas" + p + "gemmStridedBatched", Ptr: &l.strided[i]},
			dl.Symbol{Name: "cublas" + p + "gemmBatched", Ptr: &l.batched[i]})
	}
	if l.lib, err = dl.Load(ErrUnavailable, EnvCUBLAS, libNames, table); err != nil {
		return nil, err
	}
	return l, nil
}

// Library is the name cuBLAS was loaded from.
func (l *Lib) Library() string { return l.lib.Name }

// HasGrouped reports whether cublas{S,D}gemmGroupedBatched are present.
func (l *Lib) HasGrouped() bool { return l.grouped[0] != nil && l.grouped[1] != nil }

func (l *Lib) check(call string, s C.dbc_status) error {
	if s == 0 {
		return nil
	}
	msg := "cudaSetDevice failed"
	if s != -1 {
		msg = C.GoString(C.c_status_string(l.statusString, C.int(s)))
	}
	return &Error{Lib: "cublas", Call: call, Code: int(s), Msg: msg, Kind: ErrCUBLAS}
}

// Handle is one cuBLAS context on one device, bound to one stream.
type Handle struct {
	l   *Lib
	h   C.uintptr_t
	dev C.int
}

// NewHandle creates a handle on device dev bound to stream, with scalars in
// host memory and, unless tf32, the default (full precision) math mode.
func (l *Lib) NewHandle(dev int, stream uintptr, tf32 bool) (*Handle, error) {
	h := &Handle{l: l, dev: C.int(dev)}
	if err := l.check("cublasCreate", C.c_create(l.setDev, l.create, h.dev, &h.h)); err != nil {
		return nil, err
	}
	math := C.int(C.DBC_DEFAULT_MATH)
	if tf32 {
		math = C.DBC_TF32_TENSOR_OP_MATH
	}
	err := l.check("cublasSetStream", C.c_set_stream(l.setDev, l.setStream, h.dev, h.h, C.uintptr_t(stream)))
	if err == nil {
		err = l.check("cublasSetMathMode", C.c_set_int(l.setDev, l.setMath, h.dev, h.h, math))
	}
	if err == nil {
		err = l.check("cublasSetPointerMode", C.c_set_int(l.setDev, l.setPtrMode, h.dev, h.h, C.DBC_POINTER_MODE_HOST))
	}
	if err != nil {
		_ = h.Destroy()
		return nil, err
	}
	return h, nil
}

// Destroy releases the handle.
func (h *Handle) Destroy() error {
	if h.h == 0 {
		return fmt.Errorf("cublas: handle destroyed twice: %w", ErrCUBLAS)
	}
	err := h.l.check("cublasDestroy", C.c_destroy(h.l.setDev, h.l.destroy, h.dev, h.h))
	h.h = 0
	return err
}

func cint(v int) C.int { return C.int(v) }

// Gemm is one cublas<t>gemm: C = alpha op(A) op(B) + beta C, column-major.
func (h *Handle) Gemm(dt DType, ta, tb Op, m, n, k int, alpha complex128, a uintptr, lda int, b uintptr, ldb int, beta complex128, c uintptr, ldc int) error {
	return h.l.check("cublas"+dt.String()+"gemm", C.c_gemm(h.l.setDev, h.l.gemm[dt], h.dev, C.int(dt), h.h, C.int(ta), C.int(tb),
		cint(m), cint(n), cint(k), C.double(real(alpha)), C.double(imag(alpha)), C.uintptr_t(a), cint(lda), C.uintptr_t(b), cint(ldb),
		C.double(real(beta)), C.double(imag(beta)), C.uintptr_t(c), cint(ldc)))
}

// GemmStrided is one cublas<t>gemmStridedBatched; strides are in elements.
func (h *Handle) GemmStrided(dt DType, ta, tb Op, m, n, k int, alpha complex128, a uintptr, lda int, sa int64, b uintptr, ldb int, sb int64,
	beta complex128, c uintptr, ldc int, sc int64, batch int) error {
	return h.l.check("cublas"+dt.String()+"gemmStridedBatched", C.c_gemm_strided(h.l.setDev, h.l.strided[dt], h.dev, C.int(dt), h.h, C.int(ta), C.int(tb),
		cint(m), cint(n), cint(k), C.double(real(alpha)), C.double(imag(alpha)), C.uintptr_t(a), cint(lda), C.longlong(sa),
		C.uintptr_t(b), cint(ldb), C.longlong(sb), C.double(real(beta)), C.double(imag(beta)), C.uintptr_t(c), cint(ldc), C.longlong(sc), cint(batch)))
}

// GemmBatched is one cublas<t>gemmBatched over device arrays of pointers.
func (h *Handle) GemmBatched(dt DType, ta, tb Op, m, n, k int, alpha complex128, aArr uintptr, lda int, bArr uintptr, ldb int,
	beta complex128, cArr uintptr, ldc int, batch int) error {
	return h.l.check("cublas"+dt.String()+"gemmBatched", C.c_gemm_batched(h.l.setDev, h.l.batched[dt], h.dev, C.int(dt), h.h, C.int(ta), C.int(tb),
		cint(m), cint(n), cint(k), C.double(real(alpha)), C.double(imag(alpha)), C.uintptr_t(aArr), cint(lda), C.uintptr_t(bArr), cint(ldb),
		C.double(real(beta)), C.double(imag(beta)), C.uintptr_t(cArr), cint(ldc), cint(batch)))
}

// GemmGrouped is one cublas{S,D}gemmGroupedBatched: aArr, bArr and cArr are
// device arrays of pointers holding every problem, group after group.
func (h *Handle) GemmGrouped(dt DType, groups []Group, aArr, bArr, cArr uintptr) error {
	if dt != S && dt != D {
		return fmt.Errorf("cublas: grouped batched GEMM exists for S and D only, not %v: %w", dt, ErrUnavailable)
	}
	if !h.l.HasGrouped() {
		return fmt.Errorf("cublas: %s lacks cublas%vgemmGroupedBatched (CUDA 12.5+): %w", h.l.lib.Name, dt, ErrUnavailable)
	}
	if len(groups) == 0 {
		return nil
	}
	g := len(groups)
	ints := make([]int32, 10*g) // ta, tb, m, n, k, lda, ldb, ldc, size, spare
	col := func(i int) []int32 { return ints[i*g : (i+1)*g] }
	ta, tb, m, n, k, lda, ldb, ldc, size := col(0), col(1), col(2), col(3), col(4), col(5), col(6), col(7), col(8)
	var alpha, beta unsafe.Pointer
	a64, b64 := make([]float64, g), make([]float64, g)
	a32, b32 := make([]float32, g), make([]float32, g)
	for i, gr := range groups {
		ta[i], tb[i], m[i], n[i], k[i] = int32(gr.TransA), int32(gr.TransB), gr.M, gr.N, gr.K
		lda[i], ldb[i], ldc[i], size[i] = gr.LdA, gr.LdB, gr.LdC, gr.Size
		a64[i], b64[i], a32[i], b32[i] = gr.Alpha, gr.Beta, float32(gr.Alpha), float32(gr.Beta)
	}
	alpha, beta = unsafe.Pointer(&a64[0]), unsafe.Pointer(&b64[0])
	if dt == S {
		alpha, beta = unsafe.Pointer(&a32[0]), unsafe.Pointer(&b32[0])
	}
	p := func(s []int32) *C.int { return (*C.int)(unsafe.Pointer(&s[0])) }
	return h.l.check("cublas"+dt.String()+"gemmGroupedBatched", C.c_gemm_grouped(h.l.setDev, h.l.grouped[dt], h.dev, C.int(dt), h.h,
		p(ta), p(tb), p(m), p(n), p(k), alpha, C.uintptr_t(aArr), p(lda), C.uintptr_t(bArr), p(ldb), beta,
		C.uintptr_t(cArr), p(ldc), C.int(g), p(size)))
}
