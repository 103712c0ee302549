/* Compile with: cc -I/usr/local/cuda/include -o /tmp/x cublas_abi.c && /tmp/x
 * It fails to compile if ../decl.h disagrees with <cublas_v2.h>: a
 * prototype, an enum value, the size or alignment of a complex type, or a
 * function the header renames (cublas_v2.h maps cublasDgemm to
 * cublasDgemm_v2; package cublas binds the _v2 names directly). */
#define DBC_ABICHECK 1
#include "../decl.h"
#include "../../dl/abicheck.h"

#if defined(cublasCreate_v2) || defined(cublasDestroy_v2) || defined(cublasSetStream_v2) || \
    defined(cublasSetMathMode) || defined(cublasSetPointerMode_v2) || defined(cublasGetStatusString) || \
    defined(cublasSgemm_v2) || defined(cublasDgemm_v2) || defined(cublasCgemm_v2) || defined(cublasZgemm_v2) || \
    defined(cublasSgemmBatched) || defined(cublasDgemmBatched) || defined(cublasCgemmBatched) || defined(cublasZgemmBatched) || \
    defined(cublasSgemmStridedBatched) || defined(cublasDgemmStridedBatched) || \
    defined(cublasCgemmStridedBatched) || defined(cublasZgemmStridedBatched) || \
    defined(cublasSgemmGroupedBatched) || defined(cublasDgemmGroupedBatched)
#error "a cuBLAS function bound by name is a macro in this header: the dlsym name would be wrong"
#endif

SAME_FN(cublasCreate_v2, dbc_Create_fn);
SAME_FN(cublasDestroy_v2, dbc_Destroy_fn);
SAME_FN(cublasSetStream_v2, dbc_SetStream_fn);
SAME_FN(cublasSetMathMode, dbc_SetMathMode_fn);
SAME_FN(cublasSetPointerMode_v2, dbc_SetPointerMode_fn);
SAME_FN(cublasGetStatusString, dbc_GetStatusString_fn);
SAME_FN(cublasSgemm_v2, dbc_Sgemm_fn);
SAME_FN(cublasDgemm_v2, dbc_Dgemm_fn);
SAME_FN(cublasCgemm_v2, dbc_Cgemm_fn);
SAME_FN(cublasZgemm_v2, dbc_Zgemm_fn);
SAME_FN(cublasSgemmBatched, dbc_SgemmBatched_fn);
SAME_FN(cublasDgemmBatched, dbc_DgemmBatched_fn);
SAME_FN(cublasCgemmBatched, dbc_CgemmBatched_fn);
SAME_FN(cublasZgemmBatched, dbc_ZgemmBatched_fn);
SAME_FN(cublasSgemmStridedBatched, dbc_SgemmStridedBatched_fn);
SAME_FN(cublasDgemmStridedBatched, dbc_DgemmStridedBatched_fn);
SAME_FN(cublasCgemmStridedBatched, dbc_CgemmStridedBatched_fn);
SAME_FN(cublasZgemmStridedBatched, dbc_ZgemmStridedBatched_fn);
SAME_FN(cublasSgemmGroupedBatched, dbc_SgemmGroupedBatched_fn);
SAME_FN(cublasDgemmGroupedBatched, dbc_DgemmGroupedBatched_fn);

_Static_assert(CUBLAS_STATUS_SUCCESS == DBC_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS");
_Static_assert(CUBLAS_OP_N == DBC_OP_N, "CUBLAS_OP_N");
_Static_assert(CUBLAS_OP_T == DBC_OP_T, "CUBLAS_OP_T");
_Static_assert(CUBLAS_DEFAULT_MATH == DBC_DEFAULT_MATH, "CUBLAS_DEFAULT_MATH");
_Static_assert(CUBLAS_TF32_TENSOR_OP_MATH == DBC_TF32_TENSOR_OP_MATH, "CUBLAS_TF32_TENSOR_OP_MATH");
_Static_assert(CUBLAS_POINTER_MODE_HOST == DBC_POINTER_MODE_HOST, "CUBLAS_POINTER_MODE_HOST");
_Static_assert(sizeof(cublasStatus_t) == sizeof(int) && sizeof(cublasOperation_t) == sizeof(int), "enums are ints");
_Static_assert(sizeof(cublasMath_t) == sizeof(int) && sizeof(cublasPointerMode_t) == sizeof(int), "enums are ints");
_Static_assert(sizeof(cuComplex) == 8 && _Alignof(cuComplex) == 8, "cuComplex is Go's complex64 with 8-byte alignment");
_Static_assert(sizeof(cuDoubleComplex) == 16 && _Alignof(cuDoubleComplex) == 16, "cuDoubleComplex is 16 bytes, 16-aligned");

int main(void) {
	printf("cublas: declarations match <cublas_v2.h> (CUBLAS_VERSION %d)\n", CUBLAS_VERSION);
	return 0;
}
