/* Hand-written declarations of the CUDA runtime API subset used by package
 * cukernel. Built with DBK_ABICHECK defined (abicheck/cudart_abi.c), the
 * types map onto the real headers so that the compiler checks every
 * prototype, enum value and struct layout below against them. */
#ifndef DISTBUF_CUKERNEL_DECL_H
#define DISTBUF_CUKERNEL_DECL_H

#include <stddef.h>

#ifdef DBK_ABICHECK
#include <cuda_runtime_api.h>
typedef cudaError_t dbk_err;
typedef cudaStream_t dbk_stream;
typedef cudaEvent_t dbk_event;
typedef cudaLibrary_t dbk_library;
typedef cudaKernel_t dbk_kernel;
typedef dim3 dbk_dim3;
typedef enum cudaMemcpyKind dbk_memcpy_kind;
typedef enum cudaDeviceAttr dbk_dev_attr;
typedef enum cudaJitOption dbk_jit_option;
typedef enum cudaLibraryOption dbk_library_option;
typedef struct cudaMemcpyAttributes dbk_memcpy_attrs;
#else
typedef int dbk_err;
typedef struct dbk_stream_st *dbk_stream;
typedef struct dbk_event_st *dbk_event;
typedef struct dbk_library_st *dbk_library;
typedef struct dbk_kernel_st *dbk_kernel;
typedef struct { unsigned int x, y, z; } dbk_dim3;
typedef int dbk_memcpy_kind;
typedef int dbk_dev_attr;
typedef int dbk_jit_option;
typedef int dbk_library_option;
/* cudaMemcpyAttributes: srcAccessOrder, srcLocHint {type, id}, dstLocHint
 * {type, id}, flags. Only srcAccessOrder is set; the rest stays zero. */
typedef struct {
	int srcAccessOrder;
	int srcLocType, srcLocId;
	int dstLocType, dstLocId;
	unsigned int flags;
} dbk_memcpy_attrs;
#endif

#define DBK_SUCCESS 0
#define DBK_MEMCPY_DEFAULT 4              /* cudaMemcpyDefault */
#define DBK_ATTR_CC_MAJOR 75              /* cudaDevAttrComputeCapabilityMajor */
#define DBK_ATTR_CC_MINOR 76              /* cudaDevAttrComputeCapabilityMinor */
#define DBK_ATTR_SM_COUNT 16              /* cudaDevAttrMultiProcessorCount */
#define DBK_SRC_ACCESS_ORDER_STREAM 1     /* cudaMemcpySrcAccessOrderStream */

typedef dbk_err (*dbk_SetDevice_fn)(int device);
typedef const char *(*dbk_GetErrorString_fn)(dbk_err error);
typedef dbk_err (*dbk_RuntimeGetVersion_fn)(int *runtimeVersion);
typedef dbk_err (*dbk_DeviceGetAttribute_fn)(int *value, dbk_dev_attr attr, int device);
typedef dbk_err (*dbk_LibraryLoadData_fn)(dbk_library *library, const void *code,
	dbk_jit_option *jitOptions, void **jitOptionsValues, unsigned int numJitOptions,
	dbk_library_option *libraryOptions, void **libraryOptionValues, unsigned int numLibraryOptions);
typedef dbk_err (*dbk_LibraryGetKernel_fn)(dbk_kernel *pKernel, dbk_library library, const char *name);
typedef dbk_err (*dbk_LaunchKernel_fn)(const void *func, dbk_dim3 gridDim, dbk_dim3 blockDim,
	void **args, size_t sharedMem, dbk_stream stream);
typedef dbk_err (*dbk_MemcpyAsync_fn)(void *dst, const void *src, size_t count, dbk_memcpy_kind kind, dbk_stream stream);
typedef dbk_err (*dbk_Memcpy_fn)(void *dst, const void *src, size_t count, dbk_memcpy_kind kind);
/* CUDA 13 form; CUDA 12.8 and 12.9 have a size_t *failIdx before the stream
 * (dbk_MemcpyBatchAsync12_fn). The runtime version picks one. */
typedef dbk_err (*dbk_MemcpyBatchAsync_fn)(void *const *dsts, const void *const *srcs, const size_t *sizes,
	size_t count, dbk_memcpy_attrs *attrs, size_t *attrsIdxs, size_t numAttrs, dbk_stream stream);
typedef dbk_err (*dbk_MemcpyBatchAsync12_fn)(void **dsts, void **srcs, size_t *sizes,
	size_t count, dbk_memcpy_attrs *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, dbk_stream stream);
typedef dbk_err (*dbk_EventCreate_fn)(dbk_event *event);
typedef dbk_err (*dbk_EventRecord_fn)(dbk_event event, dbk_stream stream);
typedef dbk_err (*dbk_EventSynchronize_fn)(dbk_event event);
typedef dbk_err (*dbk_EventElapsedTime_fn)(float *ms, dbk_event start, dbk_event end);
typedef dbk_err (*dbk_EventDestroy_fn)(dbk_event event);
typedef dbk_err (*dbk_Malloc_fn)(void **devPtr, size_t size);
typedef dbk_err (*dbk_Free_fn)(void *devPtr);
typedef dbk_err (*dbk_DeviceSynchronize_fn)(void);
typedef dbk_err (*dbk_StreamSynchronize_fn)(dbk_stream stream);

#endif
