/* A column-major CPU stand-in for the cuBLAS subset that internal/cublas
 * binds, with cuBLAS's argument checks, for tests without a GPU. "Device"
 * pointers are host pointers; pointer arrays are read directly. It expects
 * the device to have been set (by the trampolines) before every call. */
#include <complex.h>
#include <stdint.h>
#include <stdlib.h>

#define OK 0
#define NOT_INITIALIZED 1
#define INVALID_VALUE 7

typedef struct { void *stream; int math, ptrmode; } handle_t;

int cublasCreate_v2(handle_t **h) { *h = calloc(1, sizeof(handle_t)); return OK; }
int cublasDestroy_v2(handle_t *h) { if (!h) return NOT_INITIALIZED; free(h); return OK; }
int cublasSetStream_v2(handle_t *h, void *s) { h->stream = s; return OK; }
int cublasSetMathMode(handle_t *h, int m) { if (m != 0 && m != 3) return INVALID_VALUE; h->math = m; return OK; }
int cublasSetPointerMode_v2(handle_t *h, int m) { if (m != 0 && m != 1) return INVALID_VALUE; h->ptrmode = m; return OK; }
const char *cublasGetStatusString(int s) { return s == INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE (fake)" : "cuBLAS error (fake)"; }

static int check(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc) {
	int ra = ta == 0 ? m : k, rb = tb == 0 ? k : n;
	if ((ta != 0 && ta != 1) || (tb != 0 && tb != 1) || m < 0 || n < 0 || k < 0) return INVALID_VALUE;
	if (lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1)) return INVALID_VALUE;
	return OK;
}

/* One product in double complex arithmetic; es selects the element type. */
static void gemm1(int dt, int ta, int tb, int m, int n, int k, double complex alpha, const void *a, int lda,
		const void *b, int ldb, double complex beta, void *c, int ldc) {
#define LOAD(p, i) (dt == 0 ? (double complex)((const float *)(p))[i] : dt == 1 ? (double complex)((const double *)(p))[i] : \
	dt == 2 ? (double complex)((const float complex *)(p))[i] : ((const double complex *)(p))[i])
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			double complex s = 0;
			for (int l = 0; l < k; l++)
				s += LOAD(a, ta == 0 ? i + l * lda : l + i * lda) * LOAD(b, tb == 0 ? l + j * ldb : j + l * ldb);
			double complex v = alpha * s;
			if (beta != 0) v += beta * LOAD(c, i + j * ldc);
			switch (dt) {
			case 0: ((float *)c)[i + j * ldc] = (float)creal(v); break;
			case 1: ((double *)c)[i + j * ldc] = creal(v); break;
			case 2: ((float complex *)c)[i + j * ldc] = (float complex)v; break;
			default: ((double complex *)c)[i + j * ldc] = v;
			}
		}
#undef LOAD
}

static double complex scalar(int dt, const void *p) {
	switch (dt) {
	case 0: return *(const float *)p;
	case 1: return *(const double *)p;
	case 2: return *(const float complex *)p;
	}
	return *(const double complex *)p;
}

#define GEMM(P, DT, T) \
int cublas##P##gemm_v2(handle_t *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *a, int lda, \
		const T *b, int ldb, const T *beta, T *c, int ldc) { \
	if (!h) return NOT_INITIALIZED; \
	int e = check(ta, tb, m, n, k, lda, ldb, ldc); if (e) return e; \
	gemm1(DT, ta, tb, m, n, k, scalar(DT, alpha), a, lda, b, ldb, scalar(DT, beta), c, ldc); \
	return OK; \
} \
int cublas##P##gemmStridedBatched(handle_t *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *a, int lda, \
		long long sa, const T *b, int ldb, long long sb, const T *beta, T *c, int ldc, long long sc, int batch) { \
	if (!h) return NOT_INITIALIZED; \
	int e = check(ta, tb, m, n, k, lda, ldb, ldc); if (e || batch < 0) return e ? e : INVALID_VALUE; \
	for (int i = 0; i < batch; i++) \
		gemm1(DT, ta, tb, m, n, k, scalar(DT, alpha), a + i * sa, lda, b + i * sb, ldb, scalar(DT, beta), c + i * sc, ldc); \
	return OK; \
} \
int cublas##P##gemmBatched(handle_t *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *const a[], int lda, \
		const T *const b[], int ldb, const T *beta, T *const c[], int ldc, int batch) { \
	if (!h) return NOT_INITIALIZED; \
	int e = check(ta, tb, m, n, k, lda, ldb, ldc); if (e || batch < 0) return e ? e : INVALID_VALUE; \
	for (int i = 0; i < batch; i++) \
		gemm1(DT, ta, tb, m, n, k, scalar(DT, alpha), a[i], lda, b[i], ldb, scalar(DT, beta), c[i], ldc); \
	return OK; \
}
GEMM(S, 0, float)
GEMM(D, 1, double)
GEMM(C, 2, float complex)
GEMM(Z, 3, double complex)

#define GROUPED(P, DT, T) \
int cublas##P##gemmGroupedBatched(handle_t *h, const int *ta, const int *tb, const int *m, const int *n, const int *k, \
		const T *alpha, const T *const a[], const int *lda, const T *const b[], const int *ldb, const T *beta, \
		T *const c[], const int *ldc, int groups, const int *size) { \
	if (!h) return NOT_INITIALIZED; \
	if (h->ptrmode != 0 || groups < 0) return INVALID_VALUE; \
	int idx = 0; \
	for (int g = 0; g < groups; g++) { \
		int e = check(ta[g], tb[g], m[g], n[g], k[g], lda[g], ldb[g], ldc[g]); if (e || size[g] < 0) return e ? e : INVALID_VALUE; \
		for (int i = 0; i < size[g]; i++, idx++) \
			gemm1(DT, ta[g], tb[g], m[g], n[g], k[g], alpha[g], a[idx], lda[g], b[idx], ldb[g], beta[g], c[idx], ldc[g]); \
	} \
	return OK; \
}
GROUPED(S, 0, float)
GROUPED(D, 1, double)
