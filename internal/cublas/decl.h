/* Hand-written declarations of the cuBLAS API subset used by package cublas.
 * abicheck/cublas_abi.c compiles them against <cublas_v2.h> with DBC_ABICHECK
 * so that every prototype, enum value and type size is checked. */
#ifndef DISTBUF_CUBLAS_DECL_H
#define DISTBUF_CUBLAS_DECL_H

#ifdef DBC_ABICHECK
#include <cublas_v2.h>
typedef cublasStatus_t dbc_status;
typedef cublasHandle_t dbc_handle;
typedef cudaStream_t dbc_stream;
typedef cublasOperation_t dbc_op;
typedef cublasMath_t dbc_math;
typedef cublasPointerMode_t dbc_ptrmode;
typedef cuComplex dbc_c;
typedef cuDoubleComplex dbc_z;
#else
typedef int dbc_status;
typedef struct dbc_context *dbc_handle;
typedef struct dbc_stream_st *dbc_stream;
typedef int dbc_op;
typedef int dbc_math;
typedef int dbc_ptrmode;
typedef struct { float x, y; } __attribute__((aligned(8))) dbc_c;
typedef struct { double x, y; } __attribute__((aligned(16))) dbc_z;
#endif

#define DBC_STATUS_SUCCESS 0
#define DBC_OP_N 0
#define DBC_OP_T 1
#define DBC_DEFAULT_MATH 0
#define DBC_TF32_TENSOR_OP_MATH 3
#define DBC_POINTER_MODE_HOST 0

typedef dbc_status (*dbc_Create_fn)(dbc_handle *handle);
typedef dbc_status (*dbc_Destroy_fn)(dbc_handle handle);
typedef dbc_status (*dbc_SetStream_fn)(dbc_handle handle, dbc_stream stream);
typedef dbc_status (*dbc_SetMathMode_fn)(dbc_handle handle, dbc_math mode);
typedef dbc_status (*dbc_SetPointerMode_fn)(dbc_handle handle, dbc_ptrmode mode);
typedef const char *(*dbc_GetStatusString_fn)(dbc_status status);

#define DBC_GEMM_FN(P, T) \
	typedef dbc_status (*dbc_##P##gemm_fn)(dbc_handle handle, dbc_op transa, dbc_op transb, int m, int n, int k, \
		const T *alpha, const T *A, int lda, const T *B, int ldb, const T *beta, T *C, int ldc); \
	typedef dbc_status (*dbc_##P##gemmBatched_fn)(dbc_handle handle, dbc_op transa, dbc_op transb, int m, int n, int k, \
		const T *alpha, const T *const Aarray[], int lda, const T *const Barray[], int ldb, const T *beta, \
		T *const Carray[], int ldc, int batchCount); \
	typedef dbc_status (*dbc_##P##gemmStridedBatched_fn)(dbc_handle handle, dbc_op transa, dbc_op transb, int m, int n, int k, \
		const T *alpha, const T *A, int lda, long long int strideA, const T *B, int ldb, long long int strideB, \
		const T *beta, T *C, int ldc, long long int strideC, int batchCount);
DBC_GEMM_FN(S, float)
DBC_GEMM_FN(D, double)
DBC_GEMM_FN(C, dbc_c)
DBC_GEMM_FN(Z, dbc_z)

/* cublas<t>gemmGroupedBatched, CUDA 12.5+: per-group arrays on the host,
 * per-problem pointer arrays on the device. */
#define DBC_GROUPED_FN(P, T) \
	typedef dbc_status (*dbc_##P##gemmGroupedBatched_fn)(dbc_handle handle, const dbc_op transa_array[], \
		const dbc_op transb_array[], const int m_array[], const int n_array[], const int k_array[], \
		const T alpha_array[], const T *const Aarray[], const int lda_array[], const T *const Barray[], \
		const int ldb_array[], const T beta_array[], T *const Carray[], const int ldc_array[], \
		int group_count, const int group_size[]);
DBC_GROUPED_FN(S, float)
DBC_GROUPED_FN(D, double)

#endif
