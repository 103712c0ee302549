/*
 * Hand-written declarations of the small part of the CUDA runtime (and the
 * four driver functions reached through its entry-point API) that distbuf
 * uses. No NVIDIA header is needed to build: the library is opened with
 * dlopen at run time and every function is called through a pointer in
 * dbc_api.
 *
 * This header is the single source of truth for those declarations. The Go
 * side reads the constants and the symbol table from it through cgo, and
 * abicheck/cudart_abi.c includes it next to the real headers (with
 * DBC_USE_REAL_CUDA_TYPES defined) to prove that every value, struct layout
 * and prototype matches the installed toolkit.
 */
#ifndef DISTBUF_CUDART_DECL_H
#define DISTBUF_CUDART_DECL_H

#include <stddef.h>
#include <stdint.h>
#include "cudart_setdev.h"

/* cudaError_t values. */
enum {
	DBC_SUCCESS = 0,
	DBC_ERROR_INVALID_VALUE = 1,
	DBC_ERROR_MEMORY_ALLOCATION = 2,
	DBC_ERROR_INITIALIZATION = 3,
	DBC_ERROR_INVALID_CONFIGURATION = 9,
	DBC_ERROR_STUB_LIBRARY = 34,
	DBC_ERROR_INSUFFICIENT_DRIVER = 35,
	DBC_ERROR_DEVICES_UNAVAILABLE = 46,
	DBC_ERROR_NO_DEVICE = 100,
	DBC_ERROR_INVALID_DEVICE = 101,
	DBC_ERROR_INVALID_KERNEL_IMAGE = 200,
	DBC_ERROR_DEVICE_UNINITIALIZED = 201,
	DBC_ERROR_MAP_BUFFER_OBJECT_FAILED = 205,
	DBC_ERROR_INVALID_RESOURCE_HANDLE = 400,
	DBC_ERROR_SYMBOL_NOT_FOUND = 500,
	DBC_ERROR_NOT_READY = 600,
	DBC_ERROR_NOT_SUPPORTED = 801,
	DBC_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
	DBC_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804
};

/* enum cudaDeviceAttr values. */
enum {
	DBC_DEV_ATTR_MULTIPROCESSOR_COUNT = 16,
	DBC_DEV_ATTR_CAN_MAP_HOST_MEMORY = 19,
	DBC_DEV_ATTR_UNIFIED_ADDRESSING = 41,
	DBC_DEV_ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
	DBC_DEV_ATTR_COMPUTE_CAPABILITY_MINOR = 76,
	DBC_DEV_ATTR_MEMORY_POOLS_SUPPORTED = 115,
	DBC_DEV_ATTR_MPS_ENABLED = 133 /* CUDA 12.3+ */
};

/* enum cudaMemPoolAttr values. */
enum {
	DBC_MEMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
	DBC_MEMPOOL_REUSE_ALLOW_OPPORTUNISTIC = 2,
	DBC_MEMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
	DBC_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
	DBC_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
	DBC_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
	DBC_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
	DBC_MEMPOOL_ATTR_USED_MEM_HIGH = 8
};

/* cudaMemAllocationType, cudaMemAllocationHandleType, cudaMemLocationType,
 * cudaMemcpyKind, cudaDriverEntryPointQueryResult and
 * cudaMemcpySrcAccessOrder values. */
enum {
	DBC_MEM_ALLOCATION_TYPE_PINNED = 1,
	DBC_MEM_HANDLE_TYPE_NONE = 0,
	DBC_MEM_LOCATION_TYPE_DEVICE = 1,
	DBC_MEMCPY_DEFAULT = 4,
	DBC_DRIVER_ENTRY_POINT_SUCCESS = 0,
	DBC_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1
};

/* Flag macros of cuda_runtime_api.h / driver_types.h and cuda.h. */
enum {
	DBC_STREAM_NON_BLOCKING = 0x01,    /* cudaStreamNonBlocking */
	DBC_EVENT_DEFAULT = 0x00,          /* cudaEventDefault */
	DBC_EVENT_DISABLE_TIMING = 0x02,   /* cudaEventDisableTiming */
	DBC_EVENT_INTERPROCESS = 0x04,     /* cudaEventInterprocess */
	DBC_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x01, /* cudaIpcMemLazyEnablePeerAccess */
	DBC_IPC_HANDLE_SIZE = 64,          /* CUDA_IPC_HANDLE_SIZE */
	DBC_HOST_ALLOC_PORTABLE = 0x01,    /* cudaHostAllocPortable */
	DBC_HOST_ALLOC_MAPPED = 0x02,      /* cudaHostAllocMapped */
	DBC_ENABLE_DEFAULT = 0x0,          /* cudaEnableDefault */
	DBC_CU_SUCCESS = 0,                /* CUDA_SUCCESS */
	DBC_CU_STREAM_WAIT_VALUE_GEQ = 0x0 /* CU_STREAM_WAIT_VALUE_GEQ */
};

/* The CUDA version whose driver-function ABI is requested from
 * cudaGetDriverEntryPointByVersion: 12.0, where cuStreamWaitValue32 became
 * the always-available v2 stream memory operation. */
#define DBC_DRIVER_ABI_VERSION 12000

/* struct cudaMemLocation. */
struct dbc_mem_location {
	int type;
	int id;
};

/* struct cudaMemPoolProps (CUDA 12.2 and later; 12.0 and 12.1 had
 * reserved[64] in place of maxSize and usage: same size, zero is the
 * default for all of them). */
struct dbc_mem_pool_props {
	int allocType;
	int handleTypes;
	struct dbc_mem_location location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
};

/* struct cudaMemcpyAttributes (CUDA 12.8 and later): srcAccessOrder,
 * srcLocHint, dstLocHint, flags. Only srcAccessOrder is set. */
struct dbc_memcpy_attributes {
	int srcAccessOrder;
	struct dbc_mem_location srcLocHint;
	struct dbc_mem_location dstLocHint;
	unsigned int flags;
};

/* dim3. */
struct dbc_dim3 {
	unsigned int x, y, z;
};

/* cudaIpcMemHandle_t and cudaIpcEventHandle_t: opaque bytes, passed by
 * value to the open functions. */
struct dbc_ipc_mem_handle {
	char reserved[DBC_IPC_HANDLE_SIZE];
};
struct dbc_ipc_event_handle {
	char reserved[DBC_IPC_HANDLE_SIZE];
};

#ifdef DBC_USE_REAL_CUDA_TYPES
/* abicheck: the real types, so that the prototypes below can be compared
 * with the toolkit's own declarations. */
typedef cudaError_t dbc_error_t;
typedef cudaStream_t dbc_stream_t;
typedef cudaEvent_t dbc_event_t;
typedef cudaMemPool_t dbc_mempool_t;
typedef enum cudaDeviceAttr dbc_device_attr_t;
typedef enum cudaMemPoolAttr dbc_mempool_attr_t;
typedef enum cudaMemcpyKind dbc_memcpy_kind_t;
typedef enum cudaDriverEntryPointQueryResult dbc_entry_point_status_t;
typedef struct cudaMemPoolProps dbc_mem_pool_props_t;
typedef cudaHostFn_t dbc_host_fn_t;
typedef cudaLibrary_t dbc_library_t;
typedef cudaKernel_t dbc_kernel_t;
typedef enum cudaJitOption dbc_jit_option_t;
typedef enum cudaLibraryOption dbc_library_option_t;
typedef dim3 dbc_dim3_t;
typedef struct cudaMemcpyAttributes dbc_memcpy_attributes_t;
typedef cudaIpcMemHandle_t dbc_ipc_mem_handle_t;
typedef cudaIpcEventHandle_t dbc_ipc_event_handle_t;
typedef CUresult dbc_cu_result_t;
typedef CUstream dbc_cu_stream_t;
typedef CUdeviceptr dbc_cu_deviceptr_t;
typedef CUdevice dbc_cu_device_t;
typedef CUcontext dbc_cu_context_t;
typedef cuuint32_t dbc_cuuint32_t;
#else
typedef int dbc_error_t;
typedef void *dbc_stream_t;
typedef void *dbc_event_t;
typedef void *dbc_mempool_t;
typedef int dbc_device_attr_t;
typedef int dbc_mempool_attr_t;
typedef int dbc_memcpy_kind_t;
typedef int dbc_entry_point_status_t;
typedef struct dbc_mem_pool_props dbc_mem_pool_props_t;
typedef void (*dbc_host_fn_t)(void *userData);
typedef void *dbc_library_t;
typedef void *dbc_kernel_t;
typedef int dbc_jit_option_t;
typedef int dbc_library_option_t;
typedef struct dbc_dim3 dbc_dim3_t;
typedef struct dbc_memcpy_attributes dbc_memcpy_attributes_t;
typedef struct dbc_ipc_mem_handle dbc_ipc_mem_handle_t;
typedef struct dbc_ipc_event_handle dbc_ipc_event_handle_t;
typedef int dbc_cu_result_t;
typedef void *dbc_cu_stream_t;
typedef unsigned long long dbc_cu_deviceptr_t;
typedef int dbc_cu_device_t;
typedef void *dbc_cu_context_t;
typedef uint32_t dbc_cuuint32_t;
#endif

/* Runtime functions that must resolve for the library to be usable. */
#define DBC_CUDART_REQUIRED(X)                                                                  \
	X(cudaGetErrorName, const char *, (dbc_error_t error))                                      \
	X(cudaGetErrorString, const char *, (dbc_error_t error))                                    \
	X(cudaGetLastError, dbc_error_t, (void))                                                     \
	X(cudaDriverGetVersion, dbc_error_t, (int *driverVersion))                                  \
	X(cudaRuntimeGetVersion, dbc_error_t, (int *runtimeVersion))                                \
	X(cudaGetDeviceCount, dbc_error_t, (int *count))                                            \
	X(cudaSetDevice, dbc_error_t, (int device))                                                 \
	X(cudaDeviceSynchronize, dbc_error_t, (void))                                               \
	X(cudaDeviceGetAttribute, dbc_error_t, (int *value, dbc_device_attr_t attr, int device))    \
	X(cudaMemGetInfo, dbc_error_t, (size_t *free, size_t *total))                               \
	X(cudaStreamCreateWithFlags, dbc_error_t, (dbc_stream_t *pStream, unsigned int flags))      \
	X(cudaStreamDestroy, dbc_error_t, (dbc_stream_t stream))                                    \
	X(cudaStreamSynchronize, dbc_error_t, (dbc_stream_t stream))                                \
	X(cudaStreamWaitEvent, dbc_error_t, (dbc_stream_t stream, dbc_event_t event, unsigned int flags)) \
	X(cudaEventCreateWithFlags, dbc_error_t, (dbc_event_t *event, unsigned int flags))          \
	X(cudaEventRecord, dbc_error_t, (dbc_event_t event, dbc_stream_t stream))                   \
	X(cudaEventQuery, dbc_error_t, (dbc_event_t event))                                         \
	X(cudaEventSynchronize, dbc_error_t, (dbc_event_t event))                                   \
	X(cudaEventDestroy, dbc_error_t, (dbc_event_t event))                                       \
	X(cudaEventElapsedTime, dbc_error_t, (float *ms, dbc_event_t start, dbc_event_t end))       \
	X(cudaLaunchHostFunc, dbc_error_t, (dbc_stream_t stream, dbc_host_fn_t fn, void *userData)) \
	X(cudaMalloc, dbc_error_t, (void **devPtr, size_t size))                                    \
	X(cudaFree, dbc_error_t, (void *devPtr))                                                    \
	X(cudaMemcpy, dbc_error_t, (void *dst, const void *src, size_t count, dbc_memcpy_kind_t kind)) \
	X(cudaMemcpyAsync, dbc_error_t,                                                              \
	  (void *dst, const void *src, size_t count, dbc_memcpy_kind_t kind, dbc_stream_t stream))  \
	X(cudaMemsetAsync, dbc_error_t, (void *devPtr, int value, size_t count, dbc_stream_t stream)) \
	X(cudaHostAlloc, dbc_error_t, (void **pHost, size_t size, unsigned int flags))              \
	X(cudaFreeHost, dbc_error_t, (void *ptr))                                                   \
	X(cudaHostGetDevicePointer, dbc_error_t, (void **pDevice, void *pHost, unsigned int flags))

/* Stream-ordered pool functions: all present, or no pool capability. */
#define DBC_CUDART_POOL(X)                                                                      \
	X(cudaMemPoolCreate, dbc_error_t, (dbc_mempool_t *memPool, const dbc_mem_pool_props_t *poolProps)) \
	X(cudaMemPoolDestroy, dbc_error_t, (dbc_mempool_t memPool))                                 \
	X(cudaMemPoolSetAttribute, dbc_error_t, (dbc_mempool_t memPool, dbc_mempool_attr_t attr, void *value)) \
	X(cudaMemPoolGetAttribute, dbc_error_t, (dbc_mempool_t memPool, dbc_mempool_attr_t attr, void *value)) \
	X(cudaMemPoolTrimTo, dbc_error_t, (dbc_mempool_t memPool, size_t minBytesToKeep))           \
	X(cudaMallocFromPoolAsync, dbc_error_t, (void **ptr, size_t size, dbc_mempool_t memPool, dbc_stream_t stream)) \
	X(cudaFreeAsync, dbc_error_t, (void *devPtr, dbc_stream_t hStream))

/* Loading a kernel image and launching its kernels: all present, or no
 * launch capability. The library API exists since CUDA 12.0; launching a
 * cudaKernel_t through cudaLaunchKernel needs 12.8 (checked at load). */
#define DBC_CUDART_KERNEL(X)                                                                    \
	X(cudaLibraryLoadData, dbc_error_t,                                                         \
	  (dbc_library_t *library, const void *code, dbc_jit_option_t *jitOptions,                 \
	   void **jitOptionsValues, unsigned int numJitOptions, dbc_library_option_t *libraryOptions, \
	   void **libraryOptionValues, unsigned int numLibraryOptions))                             \
	X(cudaLibraryGetKernel, dbc_error_t, (dbc_kernel_t *pKernel, dbc_library_t library, const char *name)) \
	X(cudaLaunchKernel, dbc_error_t,                                                            \
	  (const void *func, dbc_dim3_t gridDim, dbc_dim3_t blockDim, void **args, size_t sharedMem, \
	   dbc_stream_t stream))

/* Batched copies (CUDA 12.8 and later). This is the CUDA 13 prototype;
 * 12.8 and 12.9 have a size_t *failIdx before the stream
 * (dbc_memcpy_batch_async12_fn), and the runtime version picks one. */
#define DBC_CUDART_BATCH(X)                                                                     \
	X(cudaMemcpyBatchAsync, dbc_error_t,                                                        \
	  (void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count,          \
	   dbc_memcpy_attributes_t *attrs, size_t *attrsIdxs, size_t numAttrs, dbc_stream_t stream))

typedef dbc_error_t (*dbc_memcpy_batch_async12_fn)(void **dsts, void **srcs, size_t *sizes, size_t count,
                                                   dbc_memcpy_attributes_t *attrs, size_t *attrsIdxs,
                                                   size_t numAttrs, size_t *failIdx, dbc_stream_t stream);

/* Legacy interprocess memory and events: all present, or no IPC
 * capability (cudaEventCreateWithFlags, which makes an interprocess event,
 * is required anyway). */
#define DBC_CUDART_IPC(X)                                                                       \
	X(cudaIpcGetMemHandle, dbc_error_t, (dbc_ipc_mem_handle_t *handle, void *devPtr))          \
	X(cudaIpcOpenMemHandle, dbc_error_t, (void **devPtr, dbc_ipc_mem_handle_t handle, unsigned int flags)) \
	X(cudaIpcCloseMemHandle, dbc_error_t, (void *devPtr))                                       \
	X(cudaIpcGetEventHandle, dbc_error_t, (dbc_ipc_event_handle_t *handle, dbc_event_t event)) \
	X(cudaIpcOpenEventHandle, dbc_error_t, (dbc_event_t *event, dbc_ipc_event_handle_t handle))

/* Driver entry-point lookup: ByVersion since CUDA 12.5 (the other one is
 * deprecated in 13.0); either serves. */
#define DBC_CUDART_ENTRY(X)                                                                     \
	X(cudaGetDriverEntryPointByVersion, dbc_error_t,                                            \
	  (const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,  \
	   dbc_entry_point_status_t *driverStatus))                                                 \
	X(cudaGetDriverEntryPoint, dbc_error_t,                                                     \
	  (const char *symbol, void **funcPtr, unsigned long long flags,                            \
	   dbc_entry_point_status_t *driverStatus))

/* Driver functions, reached through the entry-point lookup (never dlsym:
 * distbuf does not open libcuda itself). */
#define DBC_CUDA_DRIVER(X)                                                                      \
	X(cuDeviceGet, dbc_cu_result_t, (dbc_cu_device_t *device, int ordinal))                     \
	X(cuDeviceGetName, dbc_cu_result_t, (char *name, int len, dbc_cu_device_t dev))             \
	X(cuStreamWaitValue32, dbc_cu_result_t,                                                     \
	  (dbc_cu_stream_t stream, dbc_cu_deviceptr_t addr, dbc_cuuint32_t value, unsigned int flags)) \
	X(cuCtxGetCurrent, dbc_cu_result_t, (dbc_cu_context_t *pctx))                                 \
	X(cuMemGetAddressRange, dbc_cu_result_t,                                                    \
	  (dbc_cu_deviceptr_t *pbase, size_t *psize, dbc_cu_deviceptr_t dptr))

/* Devices whose primary context a runtime remembers (see dbc_api). */
#define DBC_MAX_DEVICES 64

/* The function table of one loaded library, and what its calls learn. */
typedef struct dbc_api {
#define DBC_FIELD(name, ret, args) ret(*name) args;
	DBC_CUDART_REQUIRED(DBC_FIELD)
	DBC_CUDART_POOL(DBC_FIELD)
	DBC_CUDART_KERNEL(DBC_FIELD)
	DBC_CUDART_BATCH(DBC_FIELD)
	DBC_CUDART_IPC(DBC_FIELD)
	DBC_CUDART_ENTRY(DBC_FIELD)
	DBC_CUDA_DRIVER(DBC_FIELD)
#undef DBC_FIELD
	/* The primary context of each device, as cuCtxGetCurrent reported it
	 * right after cudaSetDevice made it current; NULL until then. A call
	 * on a device whose primary context is already current to the thread
	 * skips cudaSetDevice. Read and written with atomic builtins. */
	void *primary_ctx[DBC_MAX_DEVICES];
	/* Nonzero: call cudaSetDevice before every call (DISTBUF_CUDA_SETDEVICE=always). */
	int set_device_always;
	/* This table's device setter for other loaders (cudart_setdev.h). */
	dbc_device_setter setter;
} dbc_api;

/* The position of each entry point in dbc_symbols, for the call counters. */
enum {
#define DBC_INDEX(name, ret, args) DBC_I_##name,
	DBC_CUDART_REQUIRED(DBC_INDEX)
	DBC_CUDART_POOL(DBC_INDEX)
	DBC_CUDART_KERNEL(DBC_INDEX)
	DBC_CUDART_BATCH(DBC_INDEX)
	DBC_CUDART_IPC(DBC_INDEX)
	DBC_CUDART_ENTRY(DBC_INDEX)
	DBC_CUDA_DRIVER(DBC_INDEX)
#undef DBC_INDEX
	DBC_I_COUNT
};

/* Symbol groups of the table below. */
enum {
	DBC_GROUP_REQUIRED = 0,
	DBC_GROUP_POOL = 1,
	DBC_GROUP_ENTRY = 2,
	DBC_GROUP_DRIVER = 3,
	DBC_GROUP_KERNEL = 4,
	DBC_GROUP_BATCH = 5,
	DBC_GROUP_IPC = 6
};

typedef struct dbc_symbol {
	const char *name;
	size_t offset; /* of the function pointer in dbc_api */
	int group;
} dbc_symbol;

#define DBC_SYM_REQUIRED(name, ret, args) {#name, offsetof(dbc_api, name), DBC_GROUP_REQUIRED},
#define DBC_SYM_POOL(name, ret, args) {#name, offsetof(dbc_api, name), DBC_GROUP_POOL},
#define DBC_SYM_ENTRY(name, ret, args) {#name, offsetof(dbc_api, name), DBC_GROUP_ENTRY},
#define DBC_SYM_DRIVER(name, ret, args) {#name, offsetof(dbc_api, name), DBC_GROUP_DRIVER},
#define DBC_SYM_KERNEL(name, ret, args) {#name, offsetof(dbc_api, name), DBC_GROUP_KERNEL},
#define DBC_SYM_BATCH(name, ret, args) {#name, offsetof(dbc_api, name), DBC_GROUP_BATCH},
#define DBC_SYM_IPC(name, ret, args) {#name, offsetof(dbc_api, name), DBC_GROUP_IPC},

static const dbc_symbol dbc_symbols[] = {
	DBC_CUDART_REQUIRED(DBC_SYM_REQUIRED)
	DBC_CUDART_POOL(DBC_SYM_POOL)
	DBC_CUDART_KERNEL(DBC_SYM_KERNEL)
	DBC_CUDART_BATCH(DBC_SYM_BATCH)
	DBC_CUDART_IPC(DBC_SYM_IPC)
	DBC_CUDART_ENTRY(DBC_SYM_ENTRY)
	DBC_CUDA_DRIVER(DBC_SYM_DRIVER)
};

#define DBC_NUM_SYMBOLS (sizeof(dbc_symbols) / sizeof(dbc_symbols[0]))

#endif
