//go:build cgo

/*
 * The C side of package cudart: per-thread call counters and one trampoline
 * per runtime call. Each trampoline makes the device current (skipping
 * cudaSetDevice when cuCtxGetCurrent shows its primary context already
 * current to the thread), counts and makes the call, and on failure clears
 * the thread's last error. The Go files call these through cudart_calls.h.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cudart_calls.h"

// Call counters, one block per OS thread so that counting costs a plain
// increment (no locked instruction, no shared cache line); a snapshot sums
// the blocks. Blocks are never freed: a thread's calls stay counted after
// it exits. With timing on, each block also sums the nanoseconds spent in
// each entry point.
typedef struct dbc_thread_calls {
	uint64_t n[DBC_I_COUNT];
	uint64_t ns[DBC_I_COUNT];
	struct dbc_thread_calls *next;
} dbc_thread_calls;

// dbc_timing turns the clock reads around each call on. It costs two
// clock_gettime calls per entry point called, so it is off unless asked for.
static int dbc_timing;

void dbc_set_timing(int on) { __atomic_store_n(&dbc_timing, on, __ATOMIC_RELAXED); }

static inline uint64_t dbc_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static __thread dbc_thread_calls *dbc_my_calls;
static dbc_thread_calls *dbc_all_calls;
static dbc_thread_calls dbc_lost_calls; // where a thread counts when calloc fails
static pthread_mutex_t dbc_calls_mu = PTHREAD_MUTEX_INITIALIZER;

static dbc_thread_calls *dbc_register_thread(void) {
	dbc_thread_calls *c = calloc(1, sizeof *c);
	if (c == NULL) return &dbc_lost_calls;
	pthread_mutex_lock(&dbc_calls_mu);
	c->next = dbc_all_calls;
	__atomic_store_n(&dbc_all_calls, c, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&dbc_calls_mu);
	dbc_my_calls = c;
	return c;
}

static inline dbc_thread_calls *dbc_count(int i) {
	dbc_thread_calls *c = dbc_my_calls;
	if (c == NULL) c = dbc_register_thread();
	__atomic_store_n(&c->n[i], __atomic_load_n(&c->n[i], __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
	return c;
}

static inline uint64_t dbc_clock_start(void) { return __atomic_load_n(&dbc_timing, __ATOMIC_RELAXED) ? dbc_now() : 0; }

static inline void dbc_clock_stop(dbc_thread_calls *c, int i, uint64_t start) {
	if (start != 0) __atomic_store_n(&c->ns[i], __atomic_load_n(&c->ns[i], __ATOMIC_RELAXED) + (dbc_now() - start), __ATOMIC_RELAXED);
}

// dbc_calls_snapshot sums the counters into n and, when ns is not NULL, the
// nanoseconds into ns (each DBC_I_COUNT long).
void dbc_calls_snapshot(uint64_t *n, uint64_t *ns) {
	memset(n, 0, sizeof(uint64_t) * DBC_I_COUNT);
	if (ns != NULL) memset(ns, 0, sizeof(uint64_t) * DBC_I_COUNT);
	pthread_mutex_lock(&dbc_calls_mu);
	for (dbc_thread_calls *c = dbc_all_calls; c != NULL; c = c->next)
		for (int i = 0; i < DBC_I_COUNT; i++) {
			n[i] += __atomic_load_n(&c->n[i], __ATOMIC_RELAXED);
			if (ns != NULL) ns[i] += __atomic_load_n(&c->ns[i], __ATOMIC_RELAXED);
		}
	pthread_mutex_unlock(&dbc_calls_mu);
}

// DBC_CALL counts a call to an entry point, makes it and, with timing on,
// adds its duration.
#define DBC_CALL(a, name, args) __extension__({ \
	dbc_thread_calls *c_ = dbc_count(DBC_I_##name); \
	uint64_t t_ = dbc_clock_start(); \
	__typeof__((a)->name args) r_ = (a)->name args; \
	dbc_clock_stop(c_, DBC_I_##name, t_); \
	r_; \
})

// A failure clears the thread's last error so later, unrelated checks of
// cudaGetLastError (cuBLAS, kernel launches) do not report it again.
static int dbc_done(dbc_api *a, int e) {
	if (e != DBC_SUCCESS && e != DBC_ERROR_NOT_READY) (void)DBC_CALL(a, cudaGetLastError, ());
	return e;
}

// dbc_set_device makes dev current to the calling thread. The runtime's
// current device is per OS thread and the calling goroutine may have moved
// since its last call, so every trampoline calls it first. cudaSetDevice
// makes the device's primary context current; when that context already is
// (cuCtxGetCurrent, a read of the thread's state in the driver), the call
// is skipped: runtime calls act on the thread's current context.
static int dbc_set_device(dbc_api *a, int dev) {
	void *cur = NULL, *want = NULL;
	int e;
	int known = dev >= 0 && dev < DBC_MAX_DEVICES && a->cuCtxGetCurrent != NULL && !a->set_device_always;
	if (known) {
		want = __atomic_load_n(&a->primary_ctx[dev], __ATOMIC_RELAXED);
		if (want != NULL && DBC_CALL(a, cuCtxGetCurrent, (&cur)) == DBC_CU_SUCCESS && cur == want) return DBC_SUCCESS;
	}
	e = DBC_CALL(a, cudaSetDevice, (dev));
	if (e == DBC_SUCCESS && known && want == NULL && DBC_CALL(a, cuCtxGetCurrent, (&cur)) == DBC_CU_SUCCESS && cur != NULL)
		__atomic_store_n(&a->primary_ctx[dev], cur, __ATOMIC_RELAXED);
	return e;
}

#define DBC_ON(a, dev, call) do { \
	int e_ = dbc_set_device((a), (dev)); \
	if (e_ == DBC_SUCCESS) e_ = (int)(call); \
	return dbc_done((a), e_); \
} while (0)

const char *dbc_error_name(dbc_api *a, int e) { return DBC_CALL(a, cudaGetErrorName, (e)); }
const char *dbc_error_string(dbc_api *a, int e) { return DBC_CALL(a, cudaGetErrorString, (e)); }

int dbc_runtime_version(dbc_api *a, int *v) { return dbc_done(a, DBC_CALL(a, cudaRuntimeGetVersion, (v))); }
int dbc_driver_version(dbc_api *a, int *v) { return dbc_done(a, DBC_CALL(a, cudaDriverGetVersion, (v))); }
int dbc_device_count(dbc_api *a, int *n) { return dbc_done(a, DBC_CALL(a, cudaGetDeviceCount, (n))); }

int dbc_attribute(dbc_api *a, int dev, int attr, int *v) {
	DBC_ON(a, dev, DBC_CALL(a, cudaDeviceGetAttribute, (v, attr, dev)));
}

int dbc_mem_info(dbc_api *a, int dev, size_t *free_b, size_t *total_b) {
	DBC_ON(a, dev, DBC_CALL(a, cudaMemGetInfo, (free_b, total_b)));
}

int dbc_stream_create(dbc_api *a, int dev, uintptr_t *out) {
	void *s = NULL;
	int e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaStreamCreateWithFlags, (&s, DBC_STREAM_NON_BLOCKING));
	*out = (uintptr_t)s;
	return dbc_done(a, e);
}
int dbc_stream_destroy(dbc_api *a, int dev, uintptr_t s) { DBC_ON(a, dev, DBC_CALL(a, cudaStreamDestroy, ((void *)s))); }
int dbc_stream_sync(uintptr_t api, int dev, uintptr_t s) {
	dbc_api *a = DBC_TABLE(api);
	DBC_ON(a, dev, DBC_CALL(a, cudaStreamSynchronize, ((void *)s)));
}
int dbc_stream_wait_event(uintptr_t api, int dev, uintptr_t s, uintptr_t ev) {
	dbc_api *a = DBC_TABLE(api);
	DBC_ON(a, dev, DBC_CALL(a, cudaStreamWaitEvent, ((void *)s, (void *)ev, 0)));
}

int dbc_event_create(dbc_api *a, int dev, unsigned flags, uintptr_t *out) {
	void *ev = NULL;
	int e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaEventCreateWithFlags, (&ev, flags));
	*out = (uintptr_t)ev;
	return dbc_done(a, e);
}
int dbc_event_record(uintptr_t api, int dev, uintptr_t ev, uintptr_t s) {
	dbc_api *a = DBC_TABLE(api);
	DBC_ON(a, dev, DBC_CALL(a, cudaEventRecord, ((void *)ev, (void *)s)));
}
int dbc_event_query(uintptr_t api, int dev, uintptr_t ev) {
	dbc_api *a = DBC_TABLE(api);
	DBC_ON(a, dev, DBC_CALL(a, cudaEventQuery, ((void *)ev)));
}
int dbc_event_sync(dbc_api *a, int dev, uintptr_t ev) { DBC_ON(a, dev, DBC_CALL(a, cudaEventSynchronize, ((void *)ev))); }
int dbc_event_destroy(dbc_api *a, int dev, uintptr_t ev) { DBC_ON(a, dev, DBC_CALL(a, cudaEventDestroy, ((void *)ev))); }

extern void distbufCudartHostFn(uintptr_t);
static void dbc_host_trampoline(void *data) { distbufCudartHostFn((uintptr_t)data); }
int dbc_launch_host_func(dbc_api *a, int dev, uintptr_t s, uintptr_t handle) {
	DBC_ON(a, dev, DBC_CALL(a, cudaLaunchHostFunc, ((void *)s, dbc_host_trampoline, (void *)handle)));
}

int dbc_malloc(dbc_api *a, int dev, uintptr_t *out, size_t n) {
	void *p = NULL;
	int e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaMalloc, (&p, n));
	*out = (uintptr_t)p;
	return dbc_done(a, e);
}
int dbc_free(dbc_api *a, int dev, uintptr_t p) { DBC_ON(a, dev, DBC_CALL(a, cudaFree, ((void *)p))); }

int dbc_memcpy_async(uintptr_t api, int dev, uintptr_t dst, uintptr_t src, size_t n, uintptr_t s) {
	dbc_api *a = DBC_TABLE(api);
	DBC_ON(a, dev, DBC_CALL(a, cudaMemcpyAsync, ((void *)dst, (const void *)src, n, DBC_MEMCPY_DEFAULT, (void *)s)));
}
int dbc_memset_async(uintptr_t api, int dev, uintptr_t dst, int v, size_t n, uintptr_t s) {
	dbc_api *a = DBC_TABLE(api);
	DBC_ON(a, dev, DBC_CALL(a, cudaMemsetAsync, ((void *)dst, v, n, (void *)s)));
}

int dbc_host_alloc(dbc_api *a, int dev, void **out, size_t n, unsigned flags) {
	DBC_ON(a, dev, DBC_CALL(a, cudaHostAlloc, (out, n, flags)));
}
int dbc_free_host(dbc_api *a, int dev, void *p) { DBC_ON(a, dev, DBC_CALL(a, cudaFreeHost, (p))); }
int dbc_host_device_pointer(dbc_api *a, int dev, uintptr_t *out, void *p) {
	void *d = NULL;
	int e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaHostGetDevicePointer, (&d, p, 0));
	*out = (uintptr_t)d;
	return dbc_done(a, e);
}

int dbc_pool_create(dbc_api *a, int dev, uintptr_t *out) {
	struct dbc_mem_pool_props props;
	void *pool = NULL;
	memset(&props, 0, sizeof props);
	props.allocType = DBC_MEM_ALLOCATION_TYPE_PINNED;
	props.handleTypes = DBC_MEM_HANDLE_TYPE_NONE;
	props.location.type = DBC_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = dev;
	int e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaMemPoolCreate, (&pool, &props));
	*out = (uintptr_t)pool;
	return dbc_done(a, e);
}
int dbc_pool_destroy(dbc_api *a, int dev, uintptr_t pool) { DBC_ON(a, dev, DBC_CALL(a, cudaMemPoolDestroy, ((void *)pool))); }
int dbc_pool_set_u64(dbc_api *a, int dev, uintptr_t pool, int attr, uint64_t v) {
	DBC_ON(a, dev, DBC_CALL(a, cudaMemPoolSetAttribute, ((void *)pool, attr, &v)));
}
int dbc_pool_set_int(dbc_api *a, int dev, uintptr_t pool, int attr, int v) {
	DBC_ON(a, dev, DBC_CALL(a, cudaMemPoolSetAttribute, ((void *)pool, attr, &v)));
}
int dbc_pool_get_u64(dbc_api *a, int dev, uintptr_t pool, int attr, uint64_t *v) {
	DBC_ON(a, dev, DBC_CALL(a, cudaMemPoolGetAttribute, ((void *)pool, attr, v)));
}
int dbc_pool_get_int(dbc_api *a, int dev, uintptr_t pool, int attr, int *v) {
	DBC_ON(a, dev, DBC_CALL(a, cudaMemPoolGetAttribute, ((void *)pool, attr, v)));
}
int dbc_pool_trim(dbc_api *a, int dev, uintptr_t pool, size_t keep) {
	DBC_ON(a, dev, DBC_CALL(a, cudaMemPoolTrimTo, ((void *)pool, keep)));
}
dbc_pool_alloc dbc_malloc_from_pool(uintptr_t api, int dev, size_t n, uintptr_t pool, uintptr_t s) {
	dbc_api *a = DBC_TABLE(api);
	void *p = NULL;
	int e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaMallocFromPoolAsync, (&p, n, (void *)pool, (void *)s));
	dbc_pool_alloc r = {(uintptr_t)p, dbc_done(a, e)};
	return r;
}
int dbc_free_async(uintptr_t api, int dev, uintptr_t p, uintptr_t s) {
	dbc_api *a = DBC_TABLE(api);
	DBC_ON(a, dev, DBC_CALL(a, cudaFreeAsync, ((void *)p, (void *)s)));
}

// Driver functions return CUresult, not cudaError_t; their codes are
// reported as such by the Go side.
int dbc_cu_wait_value32(dbc_api *a, int dev, uintptr_t s, uintptr_t addr, uint32_t v) {
	int e = dbc_set_device(a, dev);
	if (e != DBC_SUCCESS) return dbc_done(a, e);
	return -(int)DBC_CALL(a, cuStreamWaitValue32, ((void *)s, (unsigned long long)addr, v, DBC_CU_STREAM_WAIT_VALUE_GEQ));
}
int dbc_cu_device_name(dbc_api *a, int dev, char *buf, int len) {
	int d = 0, r;
	int e = dbc_set_device(a, dev); // initialises the driver for the calls below
	if (e != DBC_SUCCESS) return dbc_done(a, e);
	r = (int)DBC_CALL(a, cuDeviceGet, (&d, dev));
	if (r != DBC_CU_SUCCESS) return -r;
	return -(int)DBC_CALL(a, cuDeviceGetName, (buf, len, d));
}

int dbc_cu_address_range(dbc_api *a, int dev, uintptr_t p, uintptr_t *base, size_t *size) {
	unsigned long long b = 0;
	size_t n = 0;
	int e = dbc_set_device(a, dev);
	if (e != DBC_SUCCESS) return dbc_done(a, e);
	int r = (int)DBC_CALL(a, cuMemGetAddressRange, (&b, &n, (unsigned long long)p));
	*base = (uintptr_t)b;
	*size = n;
	return -r;
}

// dbc_set_device_for is the device setter other loaders (cuBLAS, NCCL)
// call before each of their calls, through SetDeviceFunc: the same skip,
// counting and error clearing as this package's own calls.
static int dbc_set_device_for(void *a, int dev) { return dbc_done((dbc_api *)a, dbc_set_device((dbc_api *)a, dev)); }

void dbc_init_setter(dbc_api *a) {
	a->setter.fn = dbc_set_device_for;
	a->setter.table = a;
}

int dbc_device_sync(dbc_api *a, int dev) { DBC_ON(a, dev, DBC_CALL(a, cudaDeviceSynchronize, ())); }

int dbc_memcpy(dbc_api *a, int dev, uintptr_t dst, uintptr_t src, size_t n) {
	DBC_ON(a, dev, DBC_CALL(a, cudaMemcpy, ((void *)dst, (const void *)src, n, DBC_MEMCPY_DEFAULT)));
}

int dbc_event_elapsed(dbc_api *a, int dev, uintptr_t start, uintptr_t end, float *ms) {
	DBC_ON(a, dev, DBC_CALL(a, cudaEventElapsedTime, (ms, (void *)start, (void *)end)));
}

// dbc_load_kernels loads an image once and looks up n kernels in it. The
// library is never unloaded: its kernels live as long as the process.
int dbc_load_kernels(dbc_api *a, int dev, const void *image, const char *const *names, int n, uintptr_t *kernels) {
	void *lib = NULL;
	int e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaLibraryLoadData, (&lib, image, NULL, NULL, 0, NULL, NULL, 0));
	for (int i = 0; e == DBC_SUCCESS && i < n; i++) {
		void *k = NULL;
		e = DBC_CALL(a, cudaLibraryGetKernel, (&k, lib, names[i]));
		kernels[i] = (uintptr_t)k;
	}
	return dbc_done(a, e);
}

// dbc_launch passes every parameter in an 8-byte slot: pointers, 64-bit
// integers and doubles fill it, and a 32-bit int is read from its first
// four bytes, which on a little-endian host hold its value.
int dbc_launch(dbc_api *a, int dev, uintptr_t kernel, unsigned gx, unsigned gy, unsigned bx, size_t shmem,
               uintptr_t stream, uint64_t *slots, int n) {
	void *args[DBC_MAX_LAUNCH_ARGS];
	dbc_dim3_t grid = {gx, gy, 1}, block = {bx, 1, 1};
	if (n < 0 || n > DBC_MAX_LAUNCH_ARGS) return DBC_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) args[i] = &slots[i];
	DBC_ON(a, dev, DBC_CALL(a, cudaLaunchKernel, ((const void *)kernel, grid, block, args, shmem, (void *)stream)));
}

// dbc_memcpy_each enqueues one cudaMemcpyAsync per entry, in order, and
// stops at the first failure.
int dbc_memcpy_each(dbc_api *a, int dev, uintptr_t stream, const uintptr_t *dsts, const uintptr_t *srcs,
                    const uintptr_t *sizes, size_t n) {
	int e = dbc_set_device(a, dev);
	for (size_t i = 0; e == DBC_SUCCESS && i < n; i++)
		e = DBC_CALL(a, cudaMemcpyAsync, ((void *)dsts[i], (const void *)srcs[i], sizes[i], DBC_MEMCPY_DEFAULT, (void *)stream));
	return dbc_done(a, e);
}

// dbc_memcpy_batch is one cudaMemcpyBatchAsync in stream order, with the
// prototype of CUDA 13 (v13) or of 12.8 and 12.9.
int dbc_memcpy_batch(dbc_api *a, int dev, int v13, uintptr_t stream, const uintptr_t *dsts, const uintptr_t *srcs,
                     const uintptr_t *sizes, size_t n) {
	dbc_memcpy_attributes_t attrs;
	size_t idx = 0, fail = 0;
	int e;
	memset(&attrs, 0, sizeof attrs);
	attrs.srcAccessOrder = DBC_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	e = dbc_set_device(a, dev);
	if (e == DBC_SUCCESS && v13)
		e = DBC_CALL(a, cudaMemcpyBatchAsync, ((void *const *)dsts, (const void *const *)srcs, (const size_t *)sizes, n,
		                                       &attrs, &idx, 1, (void *)stream));
	else if (e == DBC_SUCCESS) {
		dbc_thread_calls *c = dbc_count(DBC_I_cudaMemcpyBatchAsync);
		uint64_t t = dbc_clock_start();
		e = ((dbc_memcpy_batch_async12_fn)(void *)a->cudaMemcpyBatchAsync)((void **)dsts, (void **)srcs, (size_t *)sizes, n,
		                                                                  &attrs, &idx, 1, &fail, (void *)stream);
		dbc_clock_stop(c, DBC_I_cudaMemcpyBatchAsync, t);
	}
	return dbc_done(a, e);
}

// IPC: handles cross this boundary as 64 bytes, copied in and out.
// DBC_IPC_GET makes a handle of type type with the runtime's fn from arg
// and copies it out.
#define DBC_IPC_GET(type, fn, arg) \
	type h; \
	int e = dbc_set_device(a, dev); \
	memset(&h, 0, sizeof h); \
	if (e == DBC_SUCCESS) e = DBC_CALL(a, fn, (&h, (void *)(arg))); \
	memcpy(out, &h, DBC_IPC_HANDLE_SIZE); \
	return dbc_done(a, e)

int dbc_ipc_get_mem_handle(dbc_api *a, int dev, uintptr_t p, char *out) {
	DBC_IPC_GET(dbc_ipc_mem_handle_t, cudaIpcGetMemHandle, p);
}

int dbc_ipc_open_mem_handle(dbc_api *a, int dev, const char *in, unsigned flags, uintptr_t *out) {
	dbc_ipc_mem_handle_t h;
	void *p = NULL;
	int e = dbc_set_device(a, dev);
	memcpy(&h, in, DBC_IPC_HANDLE_SIZE);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaIpcOpenMemHandle, (&p, h, flags));
	*out = (uintptr_t)p;
	return dbc_done(a, e);
}

int dbc_ipc_close_mem_handle(dbc_api *a, int dev, uintptr_t p) { DBC_ON(a, dev, DBC_CALL(a, cudaIpcCloseMemHandle, ((void *)p))); }

int dbc_ipc_get_event_handle(dbc_api *a, int dev, uintptr_t ev, char *out) {
	DBC_IPC_GET(dbc_ipc_event_handle_t, cudaIpcGetEventHandle, ev);
}

int dbc_ipc_open_event_handle(dbc_api *a, int dev, const char *in, uintptr_t *out) {
	dbc_ipc_event_handle_t h;
	void *ev = NULL;
	int e = dbc_set_device(a, dev);
	memcpy(&h, in, DBC_IPC_HANDLE_SIZE);
	if (e == DBC_SUCCESS) e = DBC_CALL(a, cudaIpcOpenEventHandle, (&ev, h));
	*out = (uintptr_t)ev;
	return dbc_done(a, e);
}

// dbc_resolve_driver fills the driver function pointers through the runtime's
// entry-point lookup; a pointer it cannot get stays NULL.
void dbc_resolve_driver(dbc_api *a) {
	size_t i;
	for (i = 0; i < DBC_NUM_SYMBOLS; i++) {
		const dbc_symbol *s = &dbc_symbols[i];
		void **slot;
		void *fn = NULL;
		int status = -1, e;
		if (s->group != DBC_GROUP_DRIVER) continue;
		slot = (void **)((char *)a + s->offset);
		*slot = NULL;
		if (a->cudaGetDriverEntryPointByVersion != NULL)
			e = DBC_CALL(a, cudaGetDriverEntryPointByVersion, (s->name, &fn, DBC_DRIVER_ABI_VERSION, DBC_ENABLE_DEFAULT, &status));
		else if (a->cudaGetDriverEntryPoint != NULL)
			e = DBC_CALL(a, cudaGetDriverEntryPoint, (s->name, &fn, DBC_ENABLE_DEFAULT, &status));
		else
			return;
		if (e == DBC_SUCCESS && status == DBC_DRIVER_ENTRY_POINT_SUCCESS && fn != NULL)
			*slot = fn;
		else
			(void)dbc_done(a, e == DBC_SUCCESS ? DBC_ERROR_NOT_SUPPORTED : e);
	}
}

const dbc_symbol *dbc_symbol_at(size_t i) { return &dbc_symbols[i]; }
size_t dbc_num_symbols(void) { return DBC_NUM_SYMBOLS; }
