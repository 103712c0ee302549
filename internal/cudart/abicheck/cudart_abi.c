/*
 * cudart_abi: proves that the hand-written declarations in ../cudart_decl.h
 * match the installed CUDA toolkit. Built and run by scripts/check-cuda-abi.sh
 * on the GPU machine:
 *
 *   cc -I/usr/local/cuda/include -Iinternal/cudart cudart_abi.c -ldl
 *
 * It compares every constant, the size and field offsets of every struct
 * (the IPC handles included), and the prototype of every function (with the
 * toolkit's own types substituted for the opaque ones distbuf uses), checks
 * that no runtime function distbuf looks up by name is renamed by a header
 * macro, and that the runtime library exports the required symbols and
 * every optional group (pools, kernel launch, batched copies, IPC). It
 * prints each mismatch and exits 1 if there is any.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DBC_USE_REAL_CUDA_TYPES 1
#include "cudart_decl.h"

static int checks, mismatches;

static void check_eq(const char *what, long long ours, long long theirs) {
	checks++;
	if (ours != theirs) {
		mismatches++;
		printf("MISMATCH %s: declared %lld, toolkit %lld\n", what, ours, theirs);
	}
}

#define EQ(ours, theirs) check_eq(#ours " == " #theirs, (long long)(ours), (long long)(theirs))
#define SIZE(ours, theirs) check_eq("sizeof(" #ours ") == sizeof(" #theirs ")", (long long)sizeof(ours), (long long)sizeof(theirs))
#define OFFSET(ours, theirs, field) \
	check_eq("offsetof(" #theirs ", " #field ")", (long long)offsetof(ours, field), (long long)offsetof(theirs, field))

#define STR(x) #x
#define XSTR(x) STR(x)

/* The prototype of name, as the toolkit declares it, must be the one in
 * cudart_decl.h once the toolkit's types replace the opaque ones. */
#define PROTO(name, ret, args)                                                          \
	checks++;                                                                           \
	if (!__builtin_types_compatible_p(ret(*) args, __typeof__(&name))) {              \
		mismatches++;                                                                   \
		printf("MISMATCH prototype of %s: declared " #ret " " #args "\n", #name);      \
	}

/* Runtime functions are found with dlsym under their own name: a header that
 * maps the name to another symbol would make distbuf call the wrong ABI. */
#define NOT_RENAMED(name, ret, args)                                                    \
	checks++;                                                                           \
	if (strcmp(#name, XSTR(name)) != 0) {                                               \
		mismatches++;                                                                   \
		printf("MISMATCH %s is renamed to %s by the headers\n", #name, XSTR(name));   \
	}

/* Driver functions are looked up by their base name and a CUDA version, so a
 * versioned alias (cuStreamWaitValue32 -> _v2) is expected; report it. */
#define DRIVER_ALIAS(name, ret, args) \
	if (strcmp(#name, XSTR(name)) != 0) printf("info: %s resolves to %s at version %d\n", #name, XSTR(name), DBC_DRIVER_ABI_VERSION);

static const char *group_name(int g) {
	switch (g) {
	case DBC_GROUP_REQUIRED: return "required";
	case DBC_GROUP_POOL: return "pool function";
	case DBC_GROUP_KERNEL: return "kernel launch function";
	case DBC_GROUP_BATCH: return "batched copy function";
	case DBC_GROUP_IPC: return "IPC function";
	}
	return "function";
}

static void check_symbols(void) {
	const char *env = getenv("DISTBUF_CUDART");
	const char *candidates[] = {"libcudart.so.13", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so.13",
	                            "/usr/local/cuda/lib64/libcudart.so.12"};
	void *h = NULL;
	const char *opened = NULL;
	size_t i;
	if (env != NULL && env[0] != 0) {
		h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
		opened = env;
	} else {
		for (i = 0; i < sizeof candidates / sizeof candidates[0] && h == NULL; i++) {
			h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
			opened = candidates[i];
		}
	}
	checks++;
	if (h == NULL) {
		mismatches++;
		printf("MISMATCH cannot dlopen the CUDA runtime: %s\n", dlerror());
		return;
	}
	printf("info: symbols checked in %s\n", opened);
	for (i = 0; i < DBC_NUM_SYMBOLS; i++) {
		const dbc_symbol *s = &dbc_symbols[i];
		if (s->group == DBC_GROUP_DRIVER) continue;
		checks++;
		if (dlsym(h, s->name) == NULL) {
			/* The entry-point lookup has two forms, either serves. The
			 * others must all be in a CUDA 12.8+ runtime: a group that is
			 * missing here would silently turn a capability off. */
			if (s->group == DBC_GROUP_ENTRY) {
				printf("info: optional %s is not exported\n", s->name);
				continue;
			}
			mismatches++;
			printf("MISMATCH %s %s is not exported\n", group_name(s->group), s->name);
		}
	}
}

int main(void) {
	/* cudaError_t */
	EQ(DBC_SUCCESS, cudaSuccess);
	EQ(DBC_ERROR_INVALID_VALUE, cudaErrorInvalidValue);
	EQ(DBC_ERROR_MEMORY_ALLOCATION, cudaErrorMemoryAllocation);
	EQ(DBC_ERROR_INITIALIZATION, cudaErrorInitializationError);
	EQ(DBC_ERROR_INVALID_CONFIGURATION, cudaErrorInvalidConfiguration);
	EQ(DBC_ERROR_STUB_LIBRARY, cudaErrorStubLibrary);
	EQ(DBC_ERROR_INSUFFICIENT_DRIVER, cudaErrorInsufficientDriver);
	EQ(DBC_ERROR_DEVICES_UNAVAILABLE, cudaErrorDevicesUnavailable);
	EQ(DBC_ERROR_NO_DEVICE, cudaErrorNoDevice);
	EQ(DBC_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice);
	EQ(DBC_ERROR_INVALID_KERNEL_IMAGE, cudaErrorInvalidKernelImage);
	EQ(DBC_ERROR_DEVICE_UNINITIALIZED, cudaErrorDeviceUninitialized);
	EQ(DBC_ERROR_MAP_BUFFER_OBJECT_FAILED, cudaErrorMapBufferObjectFailed);
	EQ(DBC_ERROR_INVALID_RESOURCE_HANDLE, cudaErrorInvalidResourceHandle);
	EQ(DBC_ERROR_SYMBOL_NOT_FOUND, cudaErrorSymbolNotFound);
	EQ(DBC_ERROR_NOT_READY, cudaErrorNotReady);
	EQ(DBC_ERROR_NOT_SUPPORTED, cudaErrorNotSupported);
	EQ(DBC_ERROR_SYSTEM_DRIVER_MISMATCH, cudaErrorSystemDriverMismatch);
	EQ(DBC_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, cudaErrorCompatNotSupportedOnDevice);

	/* enum cudaDeviceAttr */
	EQ(DBC_DEV_ATTR_MULTIPROCESSOR_COUNT, cudaDevAttrMultiProcessorCount);
	EQ(DBC_DEV_ATTR_CAN_MAP_HOST_MEMORY, cudaDevAttrCanMapHostMemory);
	EQ(DBC_DEV_ATTR_UNIFIED_ADDRESSING, cudaDevAttrUnifiedAddressing);
	EQ(DBC_DEV_ATTR_COMPUTE_CAPABILITY_MAJOR, cudaDevAttrComputeCapabilityMajor);
	EQ(DBC_DEV_ATTR_COMPUTE_CAPABILITY_MINOR, cudaDevAttrComputeCapabilityMinor);
	EQ(DBC_DEV_ATTR_MEMORY_POOLS_SUPPORTED, cudaDevAttrMemoryPoolsSupported);
	EQ(DBC_DEV_ATTR_MPS_ENABLED, cudaDevAttrMpsEnabled);

	/* enum cudaMemPoolAttr */
	EQ(DBC_MEMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES, cudaMemPoolReuseFollowEventDependencies);
	EQ(DBC_MEMPOOL_REUSE_ALLOW_OPPORTUNISTIC, cudaMemPoolReuseAllowOpportunistic);
	EQ(DBC_MEMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES, cudaMemPoolReuseAllowInternalDependencies);
	EQ(DBC_MEMPOOL_ATTR_RELEASE_THRESHOLD, cudaMemPoolAttrReleaseThreshold);
	EQ(DBC_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, cudaMemPoolAttrReservedMemCurrent);
	EQ(DBC_MEMPOOL_ATTR_RESERVED_MEM_HIGH, cudaMemPoolAttrReservedMemHigh);
	EQ(DBC_MEMPOOL_ATTR_USED_MEM_CURRENT, cudaMemPoolAttrUsedMemCurrent);
	EQ(DBC_MEMPOOL_ATTR_USED_MEM_HIGH, cudaMemPoolAttrUsedMemHigh);

	/* other enums and flag macros */
	EQ(DBC_MEM_ALLOCATION_TYPE_PINNED, cudaMemAllocationTypePinned);
	EQ(DBC_MEM_HANDLE_TYPE_NONE, cudaMemHandleTypeNone);
	EQ(DBC_MEM_LOCATION_TYPE_DEVICE, cudaMemLocationTypeDevice);
	EQ(DBC_MEMCPY_DEFAULT, cudaMemcpyDefault);
	EQ(DBC_DRIVER_ENTRY_POINT_SUCCESS, cudaDriverEntryPointSuccess);
	EQ(DBC_MEMCPY_SRC_ACCESS_ORDER_STREAM, cudaMemcpySrcAccessOrderStream);
	EQ(DBC_STREAM_NON_BLOCKING, cudaStreamNonBlocking);
	EQ(DBC_EVENT_DEFAULT, cudaEventDefault);
	EQ(DBC_EVENT_DISABLE_TIMING, cudaEventDisableTiming);
	EQ(DBC_EVENT_INTERPROCESS, cudaEventInterprocess);
	EQ(DBC_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, cudaIpcMemLazyEnablePeerAccess);
	EQ(DBC_IPC_HANDLE_SIZE, CUDA_IPC_HANDLE_SIZE);
	EQ(DBC_HOST_ALLOC_PORTABLE, cudaHostAllocPortable);
	EQ(DBC_HOST_ALLOC_MAPPED, cudaHostAllocMapped);
	EQ(DBC_ENABLE_DEFAULT, cudaEnableDefault);
	EQ(DBC_CU_SUCCESS, CUDA_SUCCESS);
	EQ(DBC_CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ);

	/* The opaque Go-side types must have the size of the real ones. */
	SIZE(int, cudaError_t);
	SIZE(int, enum cudaDeviceAttr);
	SIZE(int, enum cudaMemPoolAttr);
	SIZE(int, enum cudaMemcpyKind);
	SIZE(int, enum cudaDriverEntryPointQueryResult);
	SIZE(int, enum cudaMemAllocationType);
	SIZE(int, enum cudaMemAllocationHandleType);
	SIZE(int, enum cudaMemLocationType);
	SIZE(int, CUresult);
	SIZE(int, CUdevice);
	SIZE(void *, cudaStream_t);
	SIZE(void *, cudaEvent_t);
	SIZE(void *, cudaMemPool_t);
	SIZE(unsigned long long, CUdeviceptr);
	SIZE(void *, CUcontext);
	SIZE(uint32_t, cuuint32_t);
	SIZE(uint64_t, cuuint64_t);
	SIZE(void *, cudaLibrary_t);
	SIZE(void *, cudaKernel_t);
	SIZE(int, enum cudaJitOption);
	SIZE(int, enum cudaLibraryOption);
	SIZE(int, enum cudaMemcpySrcAccessOrder);

	/* struct layouts */
	SIZE(struct dbc_mem_location, struct cudaMemLocation);
	OFFSET(struct dbc_mem_location, struct cudaMemLocation, type);
	OFFSET(struct dbc_mem_location, struct cudaMemLocation, id);
	SIZE(struct dbc_mem_pool_props, struct cudaMemPoolProps);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, allocType);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, handleTypes);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, location);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, location.type);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, location.id);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, win32SecurityAttributes);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, maxSize);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, usage);
	OFFSET(struct dbc_mem_pool_props, struct cudaMemPoolProps, reserved);
	SIZE(struct dbc_memcpy_attributes, struct cudaMemcpyAttributes);
	OFFSET(struct dbc_memcpy_attributes, struct cudaMemcpyAttributes, srcAccessOrder);
	OFFSET(struct dbc_memcpy_attributes, struct cudaMemcpyAttributes, srcLocHint);
	OFFSET(struct dbc_memcpy_attributes, struct cudaMemcpyAttributes, dstLocHint);
	OFFSET(struct dbc_memcpy_attributes, struct cudaMemcpyAttributes, flags);
	SIZE(struct dbc_dim3, dim3);
	OFFSET(struct dbc_dim3, dim3, x);
	OFFSET(struct dbc_dim3, dim3, y);
	OFFSET(struct dbc_dim3, dim3, z);
	/* The IPC handles: Go's IpcMemHandle and IpcEventHandle are [64]byte. */
	SIZE(struct dbc_ipc_mem_handle, cudaIpcMemHandle_t);
	SIZE(struct dbc_ipc_event_handle, cudaIpcEventHandle_t);
	EQ(sizeof(cudaIpcMemHandle_t), 64);
	EQ(sizeof(cudaIpcEventHandle_t), 64);

	/* prototypes */
	DBC_CUDART_REQUIRED(PROTO)
	DBC_CUDART_POOL(PROTO)
	DBC_CUDART_KERNEL(PROTO)
#if CUDART_VERSION >= 13000
	DBC_CUDART_BATCH(PROTO)
#else
	/* 12.8 and 12.9: the form with failIdx, which the runtime version picks. */
	checks++;
	if (!__builtin_types_compatible_p(dbc_memcpy_batch_async12_fn, __typeof__(&cudaMemcpyBatchAsync))) {
		mismatches++;
		printf("MISMATCH prototype of cudaMemcpyBatchAsync (CUDA 12 form)\n");
	}
#endif
	DBC_CUDART_IPC(PROTO)
	DBC_CUDART_ENTRY(PROTO)
	DBC_CUDA_DRIVER(PROTO)
	DBC_CUDART_REQUIRED(NOT_RENAMED)
	DBC_CUDART_POOL(NOT_RENAMED)
	DBC_CUDART_KERNEL(NOT_RENAMED)
	DBC_CUDART_BATCH(NOT_RENAMED)
	DBC_CUDART_IPC(NOT_RENAMED)
	DBC_CUDART_ENTRY(NOT_RENAMED)
	DBC_CUDA_DRIVER(DRIVER_ALIAS)

	check_symbols();

	printf("cudart_abi: CUDA headers %d (cuda.h %d): %d checks, %d mismatches\n", CUDART_VERSION, CUDA_VERSION, checks, mismatches);
	return mismatches == 0 ? 0 : 1;
}
