/* Compile with: cc -I/usr/local/cuda/include -o /tmp/x cudart_abi.c && /tmp/x
 * It fails to compile if a hand-written declaration in ../decl.h disagrees
 * with the CUDA runtime headers: a prototype, an enum value, a struct layout,
 * or a function that the header renames with a macro (so dlsym would bind a
 * different symbol). */
#pragma GCC diagnostic error "-Wincompatible-pointer-types"
#define DBK_ABICHECK 1
#include "../decl.h"
#include <stdio.h>
#include <stddef.h>

#define SAME_FN(fn, type) _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), #fn " prototype differs from decl.h")

#if defined(cudaSetDevice) || defined(cudaGetErrorString) || defined(cudaRuntimeGetVersion) || \
    defined(cudaDeviceGetAttribute) || defined(cudaLibraryLoadData) || defined(cudaLibraryGetKernel) || \
    defined(cudaLaunchKernel) || defined(cudaMemcpyAsync) || defined(cudaMemcpy) || defined(cudaMemcpyBatchAsync) || \
    defined(cudaEventCreate) || defined(cudaEventRecord) || defined(cudaEventSynchronize) || \
    defined(cudaEventElapsedTime) || defined(cudaEventDestroy) || defined(cudaMalloc) || defined(cudaFree) || \
    defined(cudaDeviceSynchronize) || defined(cudaStreamSynchronize)
#error "a runtime function used by cukernel is a macro in this header: the dlsym name would be wrong"
#endif

SAME_FN(cudaSetDevice, dbk_SetDevice_fn);
SAME_FN(cudaGetErrorString, dbk_GetErrorString_fn);
SAME_FN(cudaRuntimeGetVersion, dbk_RuntimeGetVersion_fn);
SAME_FN(cudaDeviceGetAttribute, dbk_DeviceGetAttribute_fn);
SAME_FN(cudaLibraryLoadData, dbk_LibraryLoadData_fn);
SAME_FN(cudaLibraryGetKernel, dbk_LibraryGetKernel_fn);
SAME_FN(cudaLaunchKernel, dbk_LaunchKernel_fn);
SAME_FN(cudaMemcpyAsync, dbk_MemcpyAsync_fn);
SAME_FN(cudaMemcpy, dbk_Memcpy_fn);
#if CUDART_VERSION >= 13000
SAME_FN(cudaMemcpyBatchAsync, dbk_MemcpyBatchAsync_fn);
#elif CUDART_VERSION >= 12080
SAME_FN(cudaMemcpyBatchAsync, dbk_MemcpyBatchAsync12_fn);
#endif
SAME_FN(cudaEventCreate, dbk_EventCreate_fn);
SAME_FN(cudaEventRecord, dbk_EventRecord_fn);
SAME_FN(cudaEventSynchronize, dbk_EventSynchronize_fn);
SAME_FN(cudaEventElapsedTime, dbk_EventElapsedTime_fn);
SAME_FN(cudaEventDestroy, dbk_EventDestroy_fn);
SAME_FN(cudaMalloc, dbk_Malloc_fn);
SAME_FN(cudaFree, dbk_Free_fn);
SAME_FN(cudaDeviceSynchronize, dbk_DeviceSynchronize_fn);
SAME_FN(cudaStreamSynchronize, dbk_StreamSynchronize_fn);

_Static_assert(cudaSuccess == DBK_SUCCESS, "cudaSuccess");
_Static_assert(cudaMemcpyDefault == DBK_MEMCPY_DEFAULT, "cudaMemcpyDefault");
_Static_assert(cudaDevAttrComputeCapabilityMajor == DBK_ATTR_CC_MAJOR, "cudaDevAttrComputeCapabilityMajor");
_Static_assert(cudaDevAttrComputeCapabilityMinor == DBK_ATTR_CC_MINOR, "cudaDevAttrComputeCapabilityMinor");
_Static_assert(cudaDevAttrMultiProcessorCount == DBK_ATTR_SM_COUNT, "cudaDevAttrMultiProcessorCount");
_Static_assert(sizeof(cudaError_t) == sizeof(int), "cudaError_t is an int");
_Static_assert(sizeof(enum cudaMemcpyKind) == sizeof(int), "cudaMemcpyKind is an int");
_Static_assert(sizeof(enum cudaDeviceAttr) == sizeof(int), "cudaDeviceAttr is an int");
_Static_assert(sizeof(dim3) == 12, "dim3 is three unsigned ints");
#if CUDART_VERSION >= 12080
_Static_assert(cudaMemcpySrcAccessOrderStream == DBK_SRC_ACCESS_ORDER_STREAM, "cudaMemcpySrcAccessOrderStream");
_Static_assert(sizeof(struct cudaMemcpyAttributes) == 24, "cudaMemcpyAttributes is 24 bytes");
_Static_assert(offsetof(struct cudaMemcpyAttributes, srcAccessOrder) == 0, "srcAccessOrder first");
_Static_assert(offsetof(struct cudaMemcpyAttributes, flags) == 20, "flags last");
#endif

int main(void) {
	printf("cukernel: declarations match CUDA runtime %d\n", CUDART_VERSION);
	return 0;
}
