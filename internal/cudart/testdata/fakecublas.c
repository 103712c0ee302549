/* A column-major CPU stand-in for the cuBLAS subset that internal/cublas
 * binds, with cuBLAS's argument checks, for tests without a GPU. "Device"
 * pointers are host pointers. Like cuBLAS, each call reads its host
 * arguments (scalars, the grouped call's per-group arrays) when it is made
 * and does its work in the order of the handle's stream: here as a host
 * function (cudaLaunchHostFunc) on that stream of the fake libcudart, which
 * must be loaded from DISTBUF_CUDART first; pointer arrays, which live in
 * "device" memory, are read when the work runs. It expects the device to
 * have been set (by the trampolines) before every call. */
#define _GNU_SOURCE
#include <complex.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK 0
#define NOT_INITIALIZED 1
#define ALLOC_FAILED 3
#define INVALID_VALUE 7
#define EXECUTION_FAILED 13

typedef struct { void *stream; int math, ptrmode; } handle_t;

/* cudaLaunchHostFunc of the fake runtime already loaded in the process. */
typedef int (*launch_host_func_t)(void *stream, void (*fn)(void *), void *data);
static launch_host_func_t launch_host_func;
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;

static void resolve_runtime(void) {
	const char *path = getenv("DISTBUF_CUDART");
	void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
	if (lib) launch_host_func = (launch_host_func_t)dlsym(lib, "cudaLaunchHostFunc");
	if (!launch_host_func)
		fprintf(stderr, "fakecublas: the fake libcudart (DISTBUF_CUDART=%s) is not loaded: no stream to work on\n", path ? path : "");
}

int cublasCreate_v2(handle_t **h) {
	pthread_once(&resolve_once, resolve_runtime);
	if (!launch_host_func) return NOT_INITIALIZED;
	*h = calloc(1, sizeof(handle_t));
	return *h ? OK : ALLOC_FAILED;
}
int cublasDestroy_v2(handle_t *h) { if (!h) return NOT_INITIALIZED; free(h); return OK; }
int cublasSetStream_v2(handle_t *h, void *s) { h->stream = s; return OK; }
int cublasSetMathMode(handle_t *h, int m) { if (m != 0 && m != 3) return INVALID_VALUE; h->math = m; return OK; }
int cublasSetPointerMode_v2(handle_t *h, int m) { if (m != 0 && m != 1) return INVALID_VALUE; h->ptrmode = m; return OK; }
const char *cublasGetStatusString(int s) {
	switch (s) {
	case NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (fake)";
	case ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (fake)";
	case INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (fake)";
	case EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED (fake)";
	}
	return "cuBLAS error (fake)";
}

static int check(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc) {
	int ra = ta == 0 ? m : k, rb = tb == 0 ? k : n;
	if ((ta != 0 && ta != 1) || (tb != 0 && tb != 1) || m < 0 || n < 0 || k < 0) return INVALID_VALUE;
	if (lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1)) return INVALID_VALUE;
	return OK;
}

/* One product in double complex arithmetic; dt selects the element type. */
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

static size_t elem(int dt) { return dt == 0 ? 4 : dt == 3 ? 16 : 8; }

static double complex scalar(int dt, const void *p) {
	switch (dt) {
	case 0: return *(const float *)p;
	case 1: return *(const double *)p;
	case 2: return *(const float complex *)p;
	}
	return *(const double complex *)p;
}

/* One call's work, run on the stream. */
enum { J_ONE, J_STRIDED, J_BATCHED, J_GROUPED };
typedef struct job {
	int kind, dt, ta, tb, m, n, k, lda, ldb, ldc, batch;
	double complex alpha, beta;
	const char *a, *b;
	char *c;
	long long sa, sb, sc;                  /* strides, in elements */
	const void *const *pa, *const *pb;     /* batched and grouped: device pointer arrays */
	void *const *pc;
	int groups;
	int *g;                                /* grouped: ta, tb, m, n, k, lda, ldb, ldc, size per group */
	double complex *galpha, *gbeta;
} job;

static void run_job(void *arg) {
	job *j = arg;
	size_t es = elem(j->dt);
	switch (j->kind) {
	case J_ONE:
		gemm1(j->dt, j->ta, j->tb, j->m, j->n, j->k, j->alpha, j->a, j->lda, j->b, j->ldb, j->beta, j->c, j->ldc);
		break;
	case J_STRIDED:
		for (int i = 0; i < j->batch; i++)
			gemm1(j->dt, j->ta, j->tb, j->m, j->n, j->k, j->alpha, j->a + i * j->sa * es, j->lda, j->b + i * j->sb * es, j->ldb,
			      j->beta, j->c + i * j->sc * es, j->ldc);
		break;
	case J_BATCHED:
		for (int i = 0; i < j->batch; i++)
			gemm1(j->dt, j->ta, j->tb, j->m, j->n, j->k, j->alpha, j->pa[i], j->lda, j->pb[i], j->ldb, j->beta, j->pc[i], j->ldc);
		break;
	default: {
		int idx = 0;
		for (int g = 0; g < j->groups; g++) {
			const int *q = &j->g[9 * g];
			for (int i = 0; i < q[8]; i++, idx++)
				gemm1(j->dt, q[0], q[1], q[2], q[3], q[4], j->galpha[g], j->pa[idx], q[5], j->pb[idx], q[6], j->gbeta[g], j->pc[idx], q[7]);
		}
		free(j->g);
		free(j->galpha);
		free(j->gbeta);
	}
	}
	free(j);
}

static int enqueue(handle_t *h, job *j) {
	if (launch_host_func(h->stream, run_job, j) != 0) {
		free(j->g);
		free(j->galpha);
		free(j->gbeta);
		free(j);
		return EXECUTION_FAILED;
	}
	return OK;
}

static job *new_job(int kind, int dt, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc,
		const void *alpha, const void *beta) {
	job *j = calloc(1, sizeof *j);
	if (!j) return NULL;
	j->kind = kind, j->dt = dt, j->ta = ta, j->tb = tb, j->m = m, j->n = n, j->k = k;
	j->lda = lda, j->ldb = ldb, j->ldc = ldc;
	if (alpha) j->alpha = scalar(dt, alpha);
	if (beta) j->beta = scalar(dt, beta);
	return j;
}

#define GEMM(P, DT, T) \
int cublas##P##gemm_v2(handle_t *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *a, int lda, \
		const T *b, int ldb, const T *beta, T *c, int ldc) { \
	if (!h) return NOT_INITIALIZED; \
	int e = check(ta, tb, m, n, k, lda, ldb, ldc); if (e) return e; \
	job *j = new_job(J_ONE, DT, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta); if (!j) return ALLOC_FAILED; \
	j->a = (const char *)a, j->b = (const char *)b, j->c = (char *)c; \
	return enqueue(h, j); \
} \
int cublas##P##gemmStridedBatched(handle_t *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *a, int lda, \
		long long sa, const T *b, int ldb, long long sb, const T *beta, T *c, int ldc, long long sc, int batch) { \
	if (!h) return NOT_INITIALIZED; \
	int e = check(ta, tb, m, n, k, lda, ldb, ldc); if (e || batch < 0) return e ? e : INVALID_VALUE; \
	job *j = new_job(J_STRIDED, DT, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta); if (!j) return ALLOC_FAILED; \
	j->a = (const char *)a, j->b = (const char *)b, j->c = (char *)c, j->sa = sa, j->sb = sb, j->sc = sc, j->batch = batch; \
	return enqueue(h, j); \
} \
int cublas##P##gemmBatched(handle_t *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *const a[], int lda, \
		const T *const b[], int ldb, const T *beta, T *const c[], int ldc, int batch) { \
	if (!h) return NOT_INITIALIZED; \
	int e = check(ta, tb, m, n, k, lda, ldb, ldc); if (e || batch < 0) return e ? e : INVALID_VALUE; \
	job *j = new_job(J_BATCHED, DT, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta); if (!j) return ALLOC_FAILED; \
	j->pa = (const void *const *)a, j->pb = (const void *const *)b, j->pc = (void *const *)c, j->batch = batch; \
	return enqueue(h, j); \
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
	for (int g = 0; g < groups; g++) { \
		int e = check(ta[g], tb[g], m[g], n[g], k[g], lda[g], ldb[g], ldc[g]); if (e || size[g] < 0) return e ? e : INVALID_VALUE; \
	} \
	job *j = new_job(J_GROUPED, DT, 0, 0, 0, 0, 0, 0, 0, 0, NULL, NULL); if (!j) return ALLOC_FAILED; \
	j->groups = groups; \
	j->g = malloc(sizeof(int) * 9 * (groups > 0 ? groups : 1)); \
	j->galpha = malloc(sizeof(double complex) * (groups > 0 ? groups : 1)); \
	j->gbeta = malloc(sizeof(double complex) * (groups > 0 ? groups : 1)); \
	if (!j->g || !j->galpha || !j->gbeta) { free(j->g); free(j->galpha); free(j->gbeta); free(j); return ALLOC_FAILED; } \
	for (int g = 0; g < groups; g++) { \
		int q[9] = {ta[g], tb[g], m[g], n[g], k[g], lda[g], ldb[g], ldc[g], size[g]}; \
		memcpy(&j->g[9 * g], q, sizeof q); \
		j->galpha[g] = alpha[g]; \
		j->gbeta[g] = beta[g]; \
	} \
	j->pa = (const void *const *)a, j->pb = (const void *const *)b, j->pc = (void *const *)c; \
	return enqueue(h, j); \
}
GROUPED(S, 0, float)
GROUPED(D, 1, double)
