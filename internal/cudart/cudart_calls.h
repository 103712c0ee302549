/*
 * The trampolines of cudart_calls.c, for the Go files of package cudart.
 * Each takes the runtime's function table and, where the call is on a
 * device, the device ordinal; each returns a cudaError_t (the driver
 * functions return -CUresult, see dbc_cu_wait_value32).
 */
#ifndef DISTBUF_CUDART_CALLS_H
#define DISTBUF_CUDART_CALLS_H

#include <stdint.h>
#include "cudart_decl.h"

/* The most parameters dbc_launch passes to a kernel. */
#define DBC_MAX_LAUNCH_ARGS 16

/*
 * The calls of a stream's hot path (pool allocation and free, copy, memset,
 * event record and query, stream wait and synchronisation) take the
 * function table as an integer, DBC_TABLE turning it back, and the pool
 * allocation returns its address by value: cgo checks each pointer
 * argument of every call for Go memory, a fifth of such a call's cost from
 * Go when the driver returns at once.
 */
#define DBC_TABLE(api) ((dbc_api *)(api))
typedef struct {
	uintptr_t ptr;
	int err;
} dbc_pool_alloc;

void dbc_calls_snapshot(uint64_t *n, uint64_t *ns);
void dbc_set_timing(int on);
const char *dbc_error_name(dbc_api *a, int e);
const char *dbc_error_string(dbc_api *a, int e);
int dbc_runtime_version(dbc_api *a, int *v);
int dbc_driver_version(dbc_api *a, int *v);
int dbc_device_count(dbc_api *a, int *n);
int dbc_attribute(dbc_api *a, int dev, int attr, int *v);
int dbc_mem_info(dbc_api *a, int dev, size_t *free_b, size_t *total_b);
int dbc_stream_create(dbc_api *a, int dev, uintptr_t *out);
int dbc_stream_destroy(dbc_api *a, int dev, uintptr_t s);
int dbc_stream_sync(uintptr_t api, int dev, uintptr_t s);
int dbc_stream_wait_event(uintptr_t api, int dev, uintptr_t s, uintptr_t ev);
int dbc_event_create(dbc_api *a, int dev, unsigned flags, uintptr_t *out);
int dbc_event_record(uintptr_t api, int dev, uintptr_t ev, uintptr_t s);
int dbc_event_query(uintptr_t api, int dev, uintptr_t ev);
int dbc_event_sync(dbc_api *a, int dev, uintptr_t ev);
int dbc_event_destroy(dbc_api *a, int dev, uintptr_t ev);
int dbc_launch_host_func(dbc_api *a, int dev, uintptr_t s, uintptr_t handle);
int dbc_malloc(dbc_api *a, int dev, uintptr_t *out, size_t n);
int dbc_free(dbc_api *a, int dev, uintptr_t p);
int dbc_memcpy_async(uintptr_t api, int dev, uintptr_t dst, uintptr_t src, size_t n, uintptr_t s);
int dbc_memset_async(uintptr_t api, int dev, uintptr_t dst, int v, size_t n, uintptr_t s);
int dbc_host_alloc(dbc_api *a, int dev, void **out, size_t n, unsigned flags);
int dbc_free_host(dbc_api *a, int dev, void *p);
int dbc_host_device_pointer(dbc_api *a, int dev, uintptr_t *out, void *p);
int dbc_pool_create(dbc_api *a, int dev, uintptr_t *out);
int dbc_pool_destroy(dbc_api *a, int dev, uintptr_t pool);
int dbc_pool_set_u64(dbc_api *a, int dev, uintptr_t pool, int attr, uint64_t v);
int dbc_pool_set_int(dbc_api *a, int dev, uintptr_t pool, int attr, int v);
int dbc_pool_get_u64(dbc_api *a, int dev, uintptr_t pool, int attr, uint64_t *v);
int dbc_pool_get_int(dbc_api *a, int dev, uintptr_t pool, int attr, int *v);
int dbc_pool_trim(dbc_api *a, int dev, uintptr_t pool, size_t keep);
dbc_pool_alloc dbc_malloc_from_pool(uintptr_t api, int dev, size_t n, uintptr_t pool, uintptr_t s);
int dbc_free_async(uintptr_t api, int dev, uintptr_t p, uintptr_t s);
int dbc_cu_wait_value32(dbc_api *a, int dev, uintptr_t s, uintptr_t addr, uint32_t v);
int dbc_cu_device_name(dbc_api *a, int dev, char *buf, int len);
int dbc_cu_address_range(dbc_api *a, int dev, uintptr_t p, uintptr_t *base, size_t *size);
void dbc_resolve_driver(dbc_api *a);
const dbc_symbol *dbc_symbol_at(size_t i);
size_t dbc_num_symbols(void);
void dbc_init_setter(dbc_api *a);
int dbc_device_sync(dbc_api *a, int dev);
int dbc_memcpy(dbc_api *a, int dev, uintptr_t dst, uintptr_t src, size_t n);
int dbc_event_elapsed(dbc_api *a, int dev, uintptr_t start, uintptr_t end, float *ms);
int dbc_load_kernels(dbc_api *a, int dev, const void *image, const char *const *names, int n, uintptr_t *kernels);
int dbc_launch(dbc_api *a, int dev, uintptr_t kernel, unsigned gx, unsigned gy, unsigned bx, size_t shmem,
               uintptr_t stream, uint64_t *slots, int n);
int dbc_memcpy_each(dbc_api *a, int dev, uintptr_t stream, const uintptr_t *dsts, const uintptr_t *srcs,
                    const uintptr_t *sizes, size_t n);
int dbc_memcpy_batch(dbc_api *a, int dev, int v13, uintptr_t stream, const uintptr_t *dsts, const uintptr_t *srcs,
                     const uintptr_t *sizes, size_t n);
int dbc_ipc_get_mem_handle(dbc_api *a, int dev, uintptr_t p, char *out);
int dbc_ipc_open_mem_handle(dbc_api *a, int dev, const char *in, unsigned flags, uintptr_t *out);
int dbc_ipc_close_mem_handle(dbc_api *a, int dev, uintptr_t p);
int dbc_ipc_get_event_handle(dbc_api *a, int dev, uintptr_t ev, char *out);
int dbc_ipc_open_event_handle(dbc_api *a, int dev, const char *in, uintptr_t *out);

#endif
