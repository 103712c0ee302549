/*
 * fakecudart: a stand-in for libcudart built by distbuf's tests with gcc
 * (one file: gcc -shared -fPIC -o libcudart-fake.so fakecudart.c -lpthread).
 * It serves every runtime symbol internal/cudart binds, so the CUDA code
 * paths of devalloc, packing, gemm and msg run on machines without a GPU.
 *
 * "Device" memory is host memory, so everything can be checked from Go.
 * Streams are asynchronous like the real ones: each stream runs its
 * operations in order on its own thread, events complete when their stream
 * reaches them, and host functions of all streams run one at a time on a
 * single callback thread (the real runtime may serialise them too, and the
 * tests must survive that). cuStreamWaitValue32 polls the word. cudaFree
 * and cudaFreeHost wait until every stream is idle, as the real ones
 * synchronise the device. The legacy default stream (0, cudaStreamLegacy)
 * and cudaStreamPerThread are streams of their own; distbuf makes only
 * non-blocking streams, so the legacy stream's implicit synchronisation
 * with blocking streams is not modelled.
 *
 * Kernels: cudaLibraryLoadData takes the images of the fake libnvrtc
 * (fakenvrtc.c: "\x7fELFFAKE <arch>\n" and the source), cudaLibraryGetKernel
 * finds a name declared in that source, and cudaLaunchKernel runs host
 * implementations, in stream order, of the kernels distbuf compiles:
 * packing's distbuf_copy_table and gemm's distbuf_gemm_small_{s,d,c,z} and
 * distbuf_gemm_pointers, with the parameters of their CUDA sources. Any
 * other kernel loads but its launch fails with cudaErrorNotSupported. A
 * launch that breaks a kernel's contract (the small GEMM kernel's thread
 * block, or its split of tiny and tiled products) makes a sticky
 * cudaErrorAssert, as a device-side assert would, and prints why.
 *
 * IPC: cudaMalloc memory lives in a memfd mapped shared, so another process
 * can map it: a memory handle carries {magic, pid, fd, serial, size} and
 * cudaIpcOpenMemHandle maps /proc/<pid>/fd/<fd>, after checking the
 * allocation's serial in the header page in front of it. An interprocess
 * event is a shared page holding a record number, taken at cudaEventRecord,
 * and a completion number that the recording stream's thread raises in
 * stream order; a wait (cudaStreamWaitEvent, cudaEventSynchronize) takes
 * the record number at the call and polls until the completion number
 * reaches it. A wait is therefore met by its record or any later one.
 * As the real runtime does, opening a handle in the process that made it
 * fails with cudaErrorDeviceUninitialized, opening a memory handle twice
 * counts a reference, and open flags other than
 * cudaIpcMemLazyEnablePeerAccess are refused; a handle of freed memory
 * fails with cudaErrorInvalidResourceHandle.
 *
 * Each device has a "primary context": cudaSetDevice makes it current to the
 * calling thread and cuCtxGetCurrent reports it (NULL on a thread that never
 * set a device). Streams and pools belong to the device current when they
 * were made, and work enqueued on a stream of another device than the
 * thread's fails with cudaErrorInvalidResourceHandle, so that a call made on
 * the wrong device is caught.
 *
 * Compile-time knobs (-D):
 *   FAKE_DEVICE_COUNT=n          devices reported (default 1)
 *   FAKE_DEVICE_COUNT_ERROR=code cudaGetDeviceCount fails with code
 *   FAKE_POOLS_SUPPORTED=0       cudaDevAttrMemoryPoolsSupported reads 0
 *   FAKE_MPS_ENABLED=1           cudaDevAttrMpsEnabled reads 1 (as under MPS)
 *   FAKE_NO_POOLS                omit the stream-ordered pool functions
 *   FAKE_NO_KERNELS              omit cudaLibraryLoadData/GetKernel, cudaLaunchKernel
 *   FAKE_NO_BATCH                omit cudaMemcpyBatchAsync
 *   FAKE_NO_IPC                  omit the cudaIpc* functions
 *   FAKE_NO_ENTRY_POINT          omit the driver entry-point lookup
 *   FAKE_NO_WAIT_VALUE           the lookup does not find cuStreamWaitValue32
 *   FAKE_NO_CTX_GET_CURRENT      the lookup does not find cuCtxGetCurrent
 *   FAKE_OMIT_cudaMemcpyAsync    omit a required symbol
 *   FAKE_MEMORY=bytes            device memory size (default 8 GiB)
 *   FAKE_RUNTIME_VERSION=v       cudaRuntimeGetVersion's answer (default 13000);
 *                                below 13000 cudaMemcpyBatchAsync takes the
 *                                12.8 prototype (a failIdx before the stream)
 *   FAKE_NO_WORK                 pool allocations, frees, memsets and stream
 *                                synchronisations do nothing (addresses are
 *                                not backed): for profiling the Go side of
 *                                the hot path with real cgo calls
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef FAKE_DEVICE_COUNT
#define FAKE_DEVICE_COUNT 1
#endif
#ifndef FAKE_DEVICE_COUNT_ERROR
#define FAKE_DEVICE_COUNT_ERROR 0
#endif
#ifndef FAKE_MPS_ENABLED
#define FAKE_MPS_ENABLED 0
#endif
#ifndef FAKE_POOLS_SUPPORTED
#define FAKE_POOLS_SUPPORTED 1
#endif
#ifndef FAKE_MEMORY
#define FAKE_MEMORY (8ULL << 30)
#endif
#ifndef FAKE_RUNTIME_VERSION
#define FAKE_RUNTIME_VERSION 13000
#endif

#define API __attribute__((visibility("default")))
#define UNUSED_IF_OMITTED __attribute__((unused)) /* by the FAKE_NO_* knobs */
#define NDEV (FAKE_DEVICE_COUNT > 0 ? FAKE_DEVICE_COUNT : 1)

enum {
	OK = 0,
	E_INVALID_VALUE = 1,
	E_MEMORY_ALLOCATION = 2,
	E_INVALID_CONFIGURATION = 9,
	E_INVALID_MEMCPY_DIRECTION = 21,
	E_INSUFFICIENT_DRIVER = 35,
	E_NO_DEVICE = 100,
	E_INVALID_DEVICE = 101,
	E_INVALID_KERNEL_IMAGE = 200,
	E_DEVICE_UNINITIALIZED = 201,
	E_MAP_BUFFER_OBJECT_FAILED = 205,
	E_INVALID_RESOURCE_HANDLE = 400,
	E_SYMBOL_NOT_FOUND = 500,
	E_NOT_READY = 600,
	E_ASSERT = 710,
	E_NOT_SUPPORTED = 801,
	E_UNKNOWN = 999,
};

static const struct {
	int code;
	const char *name, *text;
} names[] = {
	{OK, "cudaSuccess", "no error"},
	{E_INVALID_VALUE, "cudaErrorInvalidValue", "invalid argument"},
	{E_MEMORY_ALLOCATION, "cudaErrorMemoryAllocation", "out of memory"},
	{E_INVALID_CONFIGURATION, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
	{E_INVALID_MEMCPY_DIRECTION, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
	{E_INSUFFICIENT_DRIVER, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
	{E_NO_DEVICE, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
	{E_INVALID_DEVICE, "cudaErrorInvalidDevice", "invalid device ordinal"},
	{E_INVALID_KERNEL_IMAGE, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
	{E_DEVICE_UNINITIALIZED, "cudaErrorDeviceUninitialized", "invalid device context"},
	{E_MAP_BUFFER_OBJECT_FAILED, "cudaErrorMapBufferObjectFailed", "mapping of buffer object failed"},
	{E_INVALID_RESOURCE_HANDLE, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
	{E_SYMBOL_NOT_FOUND, "cudaErrorSymbolNotFound", "named symbol not found"},
	{E_NOT_READY, "cudaErrorNotReady", "device not ready"},
	{E_ASSERT, "cudaErrorAssert", "device-side assert triggered"},
	{E_NOT_SUPPORTED, "cudaErrorNotSupported", "operation not supported"},
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static __thread int last_error;
static __thread int current_device;
static __thread int device_set; /* a primary context is current to the thread */
static char primary_ctx[NDEV];
static int device_fault; /* a sticky error from a kernel, as after a device-side assert */

/* PUSH_LOCKED links node at the head of list, under mu: the lists of
 * handles the API hands out are shared by all threads. */
#define PUSH_LOCKED(list, node)                                                                              \
	do {                                                                                                        \
		pthread_mutex_lock(&mu);                                                                                   \
		(node)->next = (list);                                                                                     \
		(list) = (node);                                                                                           \
		pthread_mutex_unlock(&mu);                                                                                 \
	} while (0)

static int ret(int e) {
	if (e != OK && e != E_NOT_READY) last_error = e;
	return e;
}

API const char *cudaGetErrorName(int e) {
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (names[i].code == e) return names[i].name;
	return "cudaErrorUnknown";
}

API const char *cudaGetErrorString(int e) {
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (names[i].code == e) return names[i].text;
	return "unknown error";
}

API int cudaGetLastError(void) {
	int e = last_error;
	last_error = OK;
	return e;
}

API int cudaDriverGetVersion(int *v) { *v = 13000; return OK; }
API int cudaRuntimeGetVersion(int *v) { *v = FAKE_RUNTIME_VERSION; return OK; }

API int cudaGetDeviceCount(int *n) {
	if (FAKE_DEVICE_COUNT_ERROR != 0) {
		*n = 0;
		return ret(FAKE_DEVICE_COUNT_ERROR);
	}
	*n = FAKE_DEVICE_COUNT;
	return OK;
}

static int bad_device(int d) { return FAKE_DEVICE_COUNT_ERROR != 0 ? FAKE_DEVICE_COUNT_ERROR : (d < 0 || d >= FAKE_DEVICE_COUNT) ? E_INVALID_DEVICE : OK; }

API int cudaSetDevice(int d) {
	int e = bad_device(d);
	if (e) return ret(e);
	current_device = d;
	device_set = 1;
	return OK;
}

API int cudaDeviceGetAttribute(int *v, int attr, int d) {
	int e = bad_device(d);
	if (e) return ret(e);
	switch (attr) {
	case 16: *v = 132; break;                  /* multiprocessor count */
	case 19: *v = 1; break;                    /* can map host memory */
	case 41: *v = 1; break;                    /* unified addressing */
	case 75: *v = 9; break;                    /* compute capability major */
	case 76: *v = 0; break;                    /* minor */
	case 115: *v = FAKE_POOLS_SUPPORTED; break; /* memory pools supported */
	case 133: *v = FAKE_MPS_ENABLED; break;    /* MPS enabled */
	default: return ret(E_INVALID_VALUE);
	}
	return OK;
}

/* ---- memory bookkeeping ---- */

typedef struct pool pool;
typedef struct block {
	char *p;
	size_t size;
	pool *owner; /* NULL for cudaMalloc and pinned memory */
	int pinned;
	int fd;            /* cudaMalloc memory: its memfd; -1 otherwise */
	uint64_t serial;   /* cudaMalloc memory: names it in IPC handles */
	struct block *next;
} block;

struct pool {
	int dev;
	block *free_list;
	unsigned long long reserved, reserved_high, used, used_high, threshold;
	int reuse[4];
	int destroyed;
	pool *next;
};

#define LIVE_BUCKETS 4096
static block *live[LIVE_BUCKETS]; /* allocated blocks, hashed by address */
static pool *pools;
static unsigned long long device_reserved;

static block **live_bucket(const void *p) { return &live[((uintptr_t)p >> 4) % LIVE_BUCKETS]; }

static void add_live(block *b) {
	block **head = live_bucket(b->p);
	b->next = *head;
	*head = b;
}

UNUSED_IF_OMITTED static block *find_live(const void *p) {
	for (block *b = *live_bucket(p); b; b = b->next)
		if (b->p == p) return b;
	return NULL;
}

static block *take_live(void *p, int pinned) {
	for (block **bp = live_bucket(p); *bp; bp = &(*bp)->next)
		if ((*bp)->p == p && (*bp)->pinned == pinned) {
			block *b = *bp;
			*bp = b->next;
			b->next = NULL;
			return b;
		}
	return NULL;
}

UNUSED_IF_OMITTED static block *new_block(size_t n, pool *owner) {
	if (n == 0) n = 1;
	if (n > FAKE_MEMORY || device_reserved + n > FAKE_MEMORY) return NULL;
	block *b = calloc(1, sizeof *b);
	if (!b) return NULL;
	b->p = malloc(n);
	if (!b->p) { free(b); return NULL; }
	b->size = n;
	b->owner = owner;
	b->fd = -1;
	device_reserved += n;
	return b;
}

/* The page in front of a cudaMalloc allocation, read by the processes that
 * open its IPC handle. */
#define MEM_MAGIC 0x314d454d4b464244ULL /* "DBFKMEM1" */
#define PAGE 4096
typedef struct mem_header {
	uint64_t magic, serial, size;
	uint32_t freed;
} mem_header;

static uint64_t next_serial = 1;

/* new_shared_block backs a cudaMalloc allocation with a memfd mapped
 * shared, behind a header page; called with mu held. */
static block *new_shared_block(size_t n) {
	if (n == 0) n = 1;
	if (n > FAKE_MEMORY || device_reserved + n > FAKE_MEMORY) return NULL;
	size_t len = PAGE + (n + PAGE - 1) / PAGE * PAGE;
	block *b = calloc(1, sizeof *b);
	if (!b) return NULL;
	b->fd = memfd_create("distbuf-fake-cudamalloc", MFD_CLOEXEC);
	if (b->fd < 0 || ftruncate(b->fd, (off_t)len) != 0) {
		if (b->fd >= 0) close(b->fd);
		free(b);
		return NULL;
	}
	char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (base == MAP_FAILED) {
		close(b->fd);
		free(b);
		return NULL;
	}
	b->serial = next_serial++;
	mem_header *h = (mem_header *)base;
	h->magic = MEM_MAGIC;
	h->serial = b->serial;
	h->size = n;
	b->p = base + PAGE;
	b->size = n;
	device_reserved += n;
	return b;
}

static void drop_block(block *b) {
	device_reserved -= b->size;
	if (b->fd >= 0) {
		size_t len = PAGE + (b->size + PAGE - 1) / PAGE * PAGE;
		mem_header *h = (mem_header *)(b->p - PAGE);
		__atomic_store_n(&h->freed, 1, __ATOMIC_RELEASE);
		munmap(b->p - PAGE, len);
		close(b->fd);
	} else {
		free(b->p);
	}
	free(b);
}

static void pool_trim(pool *pl, unsigned long long keep) {
	while (pl->reserved > keep && pl->free_list) {
		block *b = pl->free_list;
		pl->free_list = b->next;
		pl->reserved -= b->size;
		drop_block(b);
	}
}

static void apply_thresholds(void) {
	for (pool *pl = pools; pl; pl = pl->next)
		if (!pl->destroyed) pool_trim(pl, pl->threshold);
}

API int cudaMemGetInfo(size_t *f, size_t *t) {
	pthread_mutex_lock(&mu);
	*t = FAKE_MEMORY;
	*f = FAKE_MEMORY - device_reserved;
	pthread_mutex_unlock(&mu);
	return OK;
}

/* ---- interprocess shared pages ---- */

#define EVENT_MAGIC 0x31545645464b4244ULL /* "DBFKEVT1" */

/* The state of an interprocess event, in a page every process that opened
 * it maps. */
typedef struct shared_event {
	uint64_t magic, serial;
	uint64_t recorded;  /* records made, in any process */
	uint64_t completed; /* the highest record a stream has reached */
} shared_event;

/* One process's mapping of a shared event page; operations in flight hold
 * a reference, so destroying the event while a stream waits is safe. */
typedef struct shmap {
	shared_event *sh;
	int fd;
	int refs;
} shmap;

static void shmap_unref(shmap *m) {
	if (m && --m->refs == 0) {
		munmap(m->sh, PAGE);
		close(m->fd);
		free(m);
	}
}

static void raise_completed(shared_event *sh, uint64_t seq) {
	uint64_t cur = __atomic_load_n(&sh->completed, __ATOMIC_ACQUIRE);
	while (cur < seq && !__atomic_compare_exchange_n(&sh->completed, &cur, seq, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
	}
}

static int shared_done(shared_event *sh, uint64_t target) { return __atomic_load_n(&sh->completed, __ATOMIC_ACQUIRE) >= target; }

/* ---- kernels: host implementations ---- */

enum { K_UNKNOWN, K_COPY_TABLE, K_GEMM_S, K_GEMM_D, K_GEMM_C, K_GEMM_Z, K_GEMM_POINTERS };

static const struct {
	const char *name;
	int kind;
} known_kernels[] UNUSED_IF_OMITTED = {
	{"distbuf_copy_table", K_COPY_TABLE},
	{"distbuf_gemm_small_s", K_GEMM_S},
	{"distbuf_gemm_small_d", K_GEMM_D},
	{"distbuf_gemm_small_c", K_GEMM_C},
	{"distbuf_gemm_small_z", K_GEMM_Z},
	{"distbuf_gemm_pointers", K_GEMM_POINTERS},
};

typedef struct library {
	char *source;
	struct library *next;
} library;

typedef struct kernel {
	library *lib;
	int kind;
	char name[64];
	struct kernel *next;
} kernel;

static library *libraries UNUSED_IF_OMITTED;
static kernel *kernels UNUSED_IF_OMITTED;

/* The parameters of a launch, copied at the call as the runtime does. */
typedef struct launch {
	int kind;
	unsigned block;
	uint64_t p[6]; /* pointers and 64-bit values, in parameter order */
	int i[4];      /* int parameters, in parameter order */
	double d[4];   /* double parameters, in parameter order */
} launch;

/* gemm/kernel.go's stack entry: offsets of A, B, C in bytes, then m, n, k,
 * lda, ldb and a zero. */
typedef struct gemm_entry {
	uint64_t a, b, c;
	int32_t m, n, k, lda, ldb, pad;
} gemm_entry;

#define GEMM_THREADS 256 /* THREADS in the kernel's source */
#define GEMM_WARP_MAX 16 /* the largest dimension of a product a warp takes */

static void fault(const char *why, long long p) {
	fprintf(stderr, "fakecudart: device-side assert: %s (%lld)\n", why, p);
	__atomic_store_n(&device_fault, E_ASSERT, __ATOMIC_RELEASE);
}

#define REAL_GEMM(NAME, T)                                                                                   \
	static void NAME(const gemm_entry *e, const char *A, const char *B, char *C, double alpha, double beta,    \
	                 int flags) {                                                                               \
		const T *a = (const T *)(A + e->a), *b = (const T *)(B + e->b);                                         \
		T *c = (T *)(C + e->c);                                                                                 \
		long long ai = (flags & 1) ? 1 : e->lda, al = (flags & 1) ? e->lda : 1;                                 \
		long long bl = (flags & 2) ? 1 : e->ldb, bj = (flags & 2) ? e->ldb : 1;                                 \
		for (long long idx = 0; idx < (long long)e->m * e->n; idx++) {                                          \
			long long i = idx / e->n, j = idx % e->n;                                                           \
			T acc = 0;                                                                                          \
			for (int l = 0; l < e->k; l++) acc += a[i * ai + l * al] * b[l * bl + j * bj];                      \
			T v = (T)alpha * acc;                                                                               \
			if (flags & 4) v += (T)beta * c[idx];                                                               \
			c[idx] = v;                                                                                         \
		}                                                                                                       \
	}

#define COMPLEX_GEMM(NAME, T)                                                                                \
	static void NAME(const gemm_entry *e, const char *A, const char *B, char *C, double are, double aim,       \
	                 double bre, double bim, int flags) {                                                       \
		const T *a = (const T *)(A + e->a), *b = (const T *)(B + e->b);                                         \
		T *c = (T *)(C + e->c);                                                                                 \
		long long ai = (flags & 1) ? 1 : e->lda, al = (flags & 1) ? e->lda : 1;                                 \
		long long bl = (flags & 2) ? 1 : e->ldb, bj = (flags & 2) ? e->ldb : 1;                                 \
		for (long long idx = 0; idx < (long long)e->m * e->n; idx++) {                                          \
			long long i = idx / e->n, j = idx % e->n;                                                           \
			double sr = 0, si = 0;                                                                              \
			for (int l = 0; l < e->k; l++) {                                                                    \
				const T *x = &a[2 * (i * ai + l * al)], *y = &b[2 * (l * bl + j * bj)];                         \
				sr += (double)x[0] * y[0] - (double)x[1] * y[1];                                                \
				si += (double)x[0] * y[1] + (double)x[1] * y[0];                                                \
			}                                                                                                   \
			double vr = are * sr - aim * si, vi = are * si + aim * sr;                                          \
			if (flags & 4) {                                                                                    \
				double cr = c[2 * idx], ci = c[2 * idx + 1];                                                    \
				vr += bre * cr - bim * ci;                                                                      \
				vi += bre * ci + bim * cr;                                                                      \
			}                                                                                                   \
			c[2 * idx] = (T)vr;                                                                                 \
			c[2 * idx + 1] = (T)vi;                                                                             \
		}                                                                                                       \
	}

REAL_GEMM(gemm_s, float)
REAL_GEMM(gemm_d, double)
COMPLEX_GEMM(gemm_c, float)
COMPLEX_GEMM(gemm_z, double)

/* distbuf_gemm_small_*(stack, tiny, count, A, B, C, are, aim, bre, bim,
 * flags): the first tiny entries must be the products whose every dimension
 * is at most GEMM_WARP_MAX, as the plan orders them. */
static void run_gemm_small(const launch *l) {
	const gemm_entry *stack = (const gemm_entry *)(uintptr_t)l->p[0];
	const char *A = (const char *)(uintptr_t)l->p[1], *B = (const char *)(uintptr_t)l->p[2];
	char *C = (char *)(uintptr_t)l->p[3];
	int tiny = l->i[0], count = l->i[1], flags = l->i[2];
	if (tiny < 0 || tiny > count) {
		fault("distbuf_gemm_small: tiny outside [0, count]", tiny);
		return;
	}
	for (int p = 0; p < count; p++) {
		const gemm_entry *e = &stack[p];
		int big = e->m > GEMM_WARP_MAX || e->n > GEMM_WARP_MAX || e->k > GEMM_WARP_MAX;
		if (big == (p < tiny)) {
			fault("distbuf_gemm_small: an entry on the wrong side of the tiny ones", p);
			return;
		}
		if (e->pad != 0) {
			fault("distbuf_gemm_small: a stack entry with nonzero padding", p);
			return;
		}
		switch (l->kind) {
		case K_GEMM_S: gemm_s(e, A, B, C, l->d[0], l->d[2], flags); break;
		case K_GEMM_D: gemm_d(e, A, B, C, l->d[0], l->d[2], flags); break;
		case K_GEMM_C: gemm_c(e, A, B, C, l->d[0], l->d[1], l->d[2], l->d[3], flags); break;
		default: gemm_z(e, A, B, C, l->d[0], l->d[1], l->d[2], l->d[3], flags); break;
		}
	}
}

static void run_kernel(const launch *l) {
	switch (l->kind) {
	case K_COPY_TABLE: { /* (const uint64_t *table, int n, int reverse) */
		const uint64_t *t = (const uint64_t *)(uintptr_t)l->p[0];
		for (int e = 0; e < l->i[0]; e++) {
			char *a = (char *)(uintptr_t)t[3 * e], *b = (char *)(uintptr_t)t[3 * e + 1];
			memmove(l->i[1] ? a : b, l->i[1] ? b : a, t[3 * e + 2]);
		}
		break;
	}
	case K_GEMM_POINTERS: { /* (stack, int count, A, B, C, uint64_t *out) */
		const gemm_entry *stack = (const gemm_entry *)(uintptr_t)l->p[0];
		uint64_t *out = (uint64_t *)(uintptr_t)l->p[4];
		long long n = l->i[0];
		for (long long i = 0; i < n; i++) {
			out[i] = l->p[1] + stack[i].a;
			out[n + i] = l->p[2] + stack[i].b;
			out[2 * n + i] = l->p[3] + stack[i].c;
		}
		break;
	}
	default:
		run_gemm_small(l);
	}
}

/* ---- streams, events, host functions ---- */

enum {
	OP_MEMSET, OP_MEMCPY, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_HOST_FN, OP_FREE_ASYNC,
	OP_KERNEL, OP_RECORD_SHARED, OP_WAIT_SHARED
};

/* Each record is its own instance: a wait made before a re-record keeps
 * waiting for the record it saw, as with the real runtime (events are
 * pooled and re-recorded by the code under test). */
typedef struct rec {
	int done, refs;
	double ms; /* the clock when the stream reached it */
} rec;

typedef struct event {
	rec *last;      /* NULL until recorded (local events) */
	unsigned flags;
	shmap *ipc;     /* interprocess events: the shared page */
} event;

#define EVENT_DISABLE_TIMING 0x02
#define EVENT_INTERPROCESS 0x04

static void unref(rec *r) {
	if (r && --r->refs == 0) free(r);
}

typedef struct op {
	int kind;
	void *dst;
	const void *src;
	size_t n;
	int value;
	rec *r;
	volatile uint32_t *word;
	uint32_t want;
	void (*fn)(void *);
	void *data;
	block *blk;
	launch k;
	shmap *m;
	uint64_t seq;
	struct op *next;
} op;

typedef struct stream {
	int dev;
	pthread_t th;
	op *head, *tail;
	int busy, stop;
	struct stream *next;
} stream;

static stream *streams;
static stream *legacy[NDEV];             /* the legacy default stream of each device */
static __thread stream *per_thread[NDEV]; /* cudaStreamPerThread */

typedef struct job {
	void (*fn)(void *);
	void *data;
	int done;
	struct job *next;
} job;

static job *jobs_head, *jobs_tail;
static pthread_once_t callback_once = PTHREAD_ONCE_INIT;

static void *callback_main(void *arg) {
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!jobs_head) pthread_cond_wait(&cv, &mu);
		job *j = jobs_head;
		jobs_head = j->next;
		if (!jobs_head) jobs_tail = NULL;
		pthread_mutex_unlock(&mu);
		j->fn(j->data);
		pthread_mutex_lock(&mu);
		j->done = 1;
		pthread_cond_broadcast(&cv);
	}
	return NULL;
}

static void start_callback_thread(void) {
	pthread_t th;
	pthread_create(&th, NULL, callback_main, NULL);
	pthread_detach(th);
}

static void timed_wait(void) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 200000;
	if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
	pthread_cond_timedwait(&cv, &mu, &ts);
}

static double now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* run executes one operation; called and returns with mu held. */
static void run(op *o) {
	switch (o->kind) {
	case OP_MEMSET:
		pthread_mutex_unlock(&mu);
		memset(o->dst, o->value, o->n);
		pthread_mutex_lock(&mu);
		break;
	case OP_MEMCPY:
		pthread_mutex_unlock(&mu);
		memmove(o->dst, o->src, o->n);
		pthread_mutex_lock(&mu);
		break;
	case OP_KERNEL:
		pthread_mutex_unlock(&mu);
		if (!__atomic_load_n(&device_fault, __ATOMIC_ACQUIRE)) run_kernel(&o->k);
		pthread_mutex_lock(&mu);
		break;
	case OP_RECORD:
		o->r->ms = now_ms();
		o->r->done = 1;
		unref(o->r);
		break;
	case OP_WAIT_EVENT:
		while (!o->r->done) pthread_cond_wait(&cv, &mu);
		unref(o->r);
		break;
	case OP_RECORD_SHARED:
		raise_completed(o->m->sh, o->seq);
		shmap_unref(o->m);
		break;
	case OP_WAIT_SHARED:
		/* Another process completes the record: poll. */
		while (!shared_done(o->m->sh, o->seq)) timed_wait();
		shmap_unref(o->m);
		break;
	case OP_WAIT_VALUE:
		while ((int32_t)(*o->word - o->want) < 0) timed_wait();
		break;
	case OP_HOST_FN: {
		job j = {o->fn, o->data, 0, NULL};
		pthread_once(&callback_once, start_callback_thread);
		if (jobs_tail) jobs_tail->next = &j; else jobs_head = &j;
		jobs_tail = &j;
		pthread_cond_broadcast(&cv);
		while (!j.done) pthread_cond_wait(&cv, &mu);
		break;
	}
	case OP_FREE_ASYNC: {
		pool *pl = o->blk->owner;
		pl->used -= o->blk->size;
		o->blk->next = pl->free_list;
		pl->free_list = o->blk;
		break;
	}
	}
}

static void *stream_main(void *arg) {
	stream *s = arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!s->head && !s->stop) pthread_cond_wait(&cv, &mu);
		if (!s->head) break;
		op *o = s->head;
		s->head = o->next;
		if (!s->head) s->tail = NULL;
		s->busy = 1;
		run(o);
		free(o);
		s->busy = 0;
		pthread_cond_broadcast(&cv);
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* new_stream makes a stream of device dev; called with mu held. */
static stream *new_stream(int dev) {
	stream *s = calloc(1, sizeof *s);
	if (!s) return NULL;
	s->dev = dev;
	if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
		free(s);
		return NULL;
	}
	s->next = streams;
	streams = s;
	return s;
}

/* resolve maps a stream handle to its stream, the special handles to the
 * current device's legacy or per-thread stream; NULL if it is none.
 * Called with mu held. */
static stream *resolve(void *h) {
	uintptr_t v = (uintptr_t)h;
	if (v == 0 || v == 1) {
		if (!legacy[current_device]) legacy[current_device] = new_stream(current_device);
		return legacy[current_device];
	}
	if (v == 2) {
		if (!per_thread[current_device]) per_thread[current_device] = new_stream(current_device);
		return per_thread[current_device];
	}
	for (stream *t = streams; t; t = t->next)
		if (t == h) return t;
	return NULL;
}

/* push enqueues o on the stream h names; called with mu held. */
static int push(void *h, op *o) {
	if (!o) return E_MEMORY_ALLOCATION;
	stream *s = resolve(h);
	if (!s || s->dev != current_device) { free(o); return E_INVALID_RESOURCE_HANDLE; }
	if (s->tail) s->tail->next = o; else s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&cv);
	return OK;
}

static op *new_op(int kind) {
	op *o = calloc(1, sizeof *o);
	if (o) o->kind = kind;
	return o;
}

static void wait_idle(stream *s) {
	while (s->head || s->busy) pthread_cond_wait(&cv, &mu);
}

static void wait_device_idle(int dev) {
	for (;;) {
		stream *s = streams;
		while (s && ((dev >= 0 && s->dev != dev) || (!s->head && !s->busy))) s = s->next;
		if (!s) return;
		pthread_cond_wait(&cv, &mu);
	}
}

/* push_and_wait enqueues o on h and waits until the stream has run it;
 * called with mu held. */
static int push_and_wait(void *h, op *o) {
	rec *r = calloc(1, sizeof *r);
	op *mark = new_op(OP_RECORD);
	if (!r || !mark) { free(r); free(mark); free(o); return E_MEMORY_ALLOCATION; }
	r->refs = 2;
	mark->r = r;
	int e = push(h, o);
	if (e == OK) e = push(h, mark); else free(mark);
	if (e == OK) {
		while (!r->done) pthread_cond_wait(&cv, &mu);
		unref(r);
	} else {
		free(r);
	}
	return e;
}

static int fault_code(void) { return __atomic_load_n(&device_fault, __ATOMIC_ACQUIRE); }

API int cudaStreamCreateWithFlags(void **out, unsigned flags) {
	(void)flags;
	pthread_mutex_lock(&mu);
	stream *s = new_stream(current_device);
	pthread_mutex_unlock(&mu);
	if (!s) return ret(E_MEMORY_ALLOCATION);
	*out = s;
	return OK;
}

API int cudaStreamSynchronize(void *h) {
#ifdef FAKE_NO_WORK
	(void)h;
	return OK;
#endif
	pthread_mutex_lock(&mu);
	stream *s = resolve(h);
	if (!s) { pthread_mutex_unlock(&mu); return ret(E_INVALID_RESOURCE_HANDLE); }
	wait_idle(s);
	apply_thresholds();
	pthread_mutex_unlock(&mu);
	return ret(fault_code());
}

API int cudaDeviceSynchronize(void) {
	pthread_mutex_lock(&mu);
	wait_device_idle(current_device);
	apply_thresholds();
	pthread_mutex_unlock(&mu);
	return ret(fault_code());
}

API int cudaStreamDestroy(void *h) {
	stream *s = h;
	pthread_mutex_lock(&mu);
	stream **sp = &streams;
	while (*sp && *sp != s) sp = &(*sp)->next;
	if (!*sp || (uintptr_t)h <= 2) { pthread_mutex_unlock(&mu); return ret(E_INVALID_RESOURCE_HANDLE); }
	wait_idle(s);
	s->stop = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	pthread_join(s->th, NULL);
	pthread_mutex_lock(&mu);
	for (sp = &streams; *sp; sp = &(*sp)->next)
		if (*sp == s) { *sp = s->next; break; }
	pthread_mutex_unlock(&mu);
	free(s);
	return OK;
}

/* new_shared_event makes the shared page of an interprocess event. */
static shmap *new_shared_event(void) {
	static uint64_t serials = 1;
	shmap *m = calloc(1, sizeof *m);
	if (!m) return NULL;
	m->fd = memfd_create("distbuf-fake-event", MFD_CLOEXEC);
	if (m->fd < 0 || ftruncate(m->fd, PAGE) != 0) goto fail;
	m->sh = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	if (m->sh == MAP_FAILED) goto fail;
	m->sh->magic = EVENT_MAGIC;
	m->sh->serial = __atomic_fetch_add(&serials, 1, __ATOMIC_RELAXED);
	m->refs = 1;
	return m;
fail:
	if (m->fd >= 0) close(m->fd);
	free(m);
	return NULL;
}

API int cudaEventCreateWithFlags(void **out, unsigned flags) {
	if (flags & ~(unsigned)(EVENT_DISABLE_TIMING | EVENT_INTERPROCESS | 0x01 /* blocking sync */))
		return ret(E_INVALID_VALUE);
	/* An interprocess event must be made without timing. */
	if ((flags & EVENT_INTERPROCESS) && !(flags & EVENT_DISABLE_TIMING)) return ret(E_INVALID_VALUE);
	event *e = calloc(1, sizeof *e);
	if (!e) return ret(E_MEMORY_ALLOCATION);
	e->flags = flags;
	if (flags & EVENT_INTERPROCESS) {
		e->ipc = new_shared_event();
		if (!e->ipc) { free(e); return ret(E_MEMORY_ALLOCATION); }
	}
	*out = e;
	return OK;
}

API int cudaEventRecord(void *ev, void *s) {
	event *e = ev;
	if (e->ipc) {
		pthread_mutex_lock(&mu);
		op *o = new_op(OP_RECORD_SHARED);
		if (o) o->m = e->ipc;
		int res = push(s, o);
		if (res == OK) {
			/* Numbered once queued (the stream cannot run it before mu is
			 * released), so that a failed record leaves no number that
			 * would never complete. */
			o->seq = __atomic_add_fetch(&e->ipc->sh->recorded, 1, __ATOMIC_ACQ_REL);
			e->ipc->refs++;
		}
		pthread_mutex_unlock(&mu);
		return ret(res);
	}
	rec *r = calloc(1, sizeof *r);
	if (!r) return ret(E_MEMORY_ALLOCATION);
	r->refs = 2; /* the event and the record operation */
	pthread_mutex_lock(&mu);
	op *o = new_op(OP_RECORD);
	if (o) o->r = r;
	int res = push(s, o);
	if (res == OK) {
		unref(e->last);
		e->last = r;
	} else {
		free(r);
	}
	pthread_mutex_unlock(&mu);
	return ret(res);
}

API int cudaStreamWaitEvent(void *s, void *ev, unsigned flags) {
	event *e = ev;
	(void)flags;
	pthread_mutex_lock(&mu);
	op *o = NULL;
	if (e->ipc) {
		uint64_t target = __atomic_load_n(&e->ipc->sh->recorded, __ATOMIC_ACQUIRE);
		if (target == 0) { pthread_mutex_unlock(&mu); return OK; } /* never recorded */
		o = new_op(OP_WAIT_SHARED);
		if (o) {
			o->m = e->ipc;
			o->seq = target;
			e->ipc->refs++;
		}
		int took = o != NULL;
		int res = push(s, o);
		if (res != OK && took) e->ipc->refs--;
		pthread_mutex_unlock(&mu);
		return ret(res);
	}
	if (!e->last) { /* never recorded: nothing to wait for */
		pthread_mutex_unlock(&mu);
		return OK;
	}
	o = new_op(OP_WAIT_EVENT);
	if (o) {
		o->r = e->last;
		o->r->refs++;
	}
	int took = o != NULL;
	int res = push(s, o);
	if (res != OK && took) e->last->refs--; /* the operation was not queued */
	pthread_mutex_unlock(&mu);
	return ret(res);
}

API int cudaEventQuery(void *ev) {
	event *e = ev;
	int done;
	pthread_mutex_lock(&mu);
	if (e->ipc)
		done = shared_done(e->ipc->sh, __atomic_load_n(&e->ipc->sh->recorded, __ATOMIC_ACQUIRE));
	else
		done = !e->last || e->last->done;
	pthread_mutex_unlock(&mu);
	return done ? OK : E_NOT_READY;
}

API int cudaEventSynchronize(void *ev) {
	event *e = ev;
	pthread_mutex_lock(&mu);
	if (e->ipc) {
		uint64_t target = __atomic_load_n(&e->ipc->sh->recorded, __ATOMIC_ACQUIRE);
		while (!shared_done(e->ipc->sh, target)) timed_wait();
	} else {
		while (e->last && !e->last->done) pthread_cond_wait(&cv, &mu);
	}
	apply_thresholds();
	pthread_mutex_unlock(&mu);
	return ret(fault_code());
}

API int cudaEventElapsedTime(float *ms, void *a, void *b) {
	event *s = a, *e = b;
	int r = OK;
	pthread_mutex_lock(&mu);
	if ((s->flags | e->flags) & EVENT_DISABLE_TIMING || !s->last || !e->last)
		r = E_INVALID_RESOURCE_HANDLE;
	else if (!s->last->done || !e->last->done)
		r = E_NOT_READY;
	else
		*ms = (float)(e->last->ms - s->last->ms);
	pthread_mutex_unlock(&mu);
	return ret(r);
}

/* Operations already queued hold their record instance (or the shared
 * page), not the event. */
API int cudaEventDestroy(void *ev) {
	event *e = ev;
	pthread_mutex_lock(&mu);
	unref(e->last);
	shmap_unref(e->ipc);
	pthread_mutex_unlock(&mu);
	free(e);
	return OK;
}

API int cudaLaunchHostFunc(void *s, void (*fn)(void *), void *data) {
	pthread_mutex_lock(&mu);
	op *o = new_op(OP_HOST_FN);
	if (o) { o->fn = fn; o->data = data; }
	int r = push(s, o);
	pthread_mutex_unlock(&mu);
	return ret(r);
}

static int memcpy_kind(int kind) { return kind >= 0 && kind <= 4 ? OK : E_INVALID_MEMCPY_DIRECTION; }

#ifndef FAKE_OMIT_cudaMemcpyAsync
API int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s) {
	if (memcpy_kind(kind)) return ret(memcpy_kind(kind));
	pthread_mutex_lock(&mu);
	op *o = new_op(OP_MEMCPY);
	if (o) { o->dst = dst; o->src = src; o->n = n; }
	int r = push(s, o);
	pthread_mutex_unlock(&mu);
	return ret(r);
}
#endif

/* cudaMemcpy runs on the legacy default stream and returns once done. */
API int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
	if (memcpy_kind(kind)) return ret(memcpy_kind(kind));
	pthread_mutex_lock(&mu);
	op *o = new_op(OP_MEMCPY);
	if (o) { o->dst = dst; o->src = src; o->n = n; }
	int r = push_and_wait(NULL, o);
	pthread_mutex_unlock(&mu);
	return ret(r != OK ? r : fault_code());
}

API int cudaMemsetAsync(void *dst, int v, size_t n, void *s) {
#ifdef FAKE_NO_WORK
	(void)dst; (void)v; (void)n; (void)s;
	return OK;
#endif
	pthread_mutex_lock(&mu);
	op *o = new_op(OP_MEMSET);
	if (o) { o->dst = dst; o->value = v; o->n = n; }
	int r = push(s, o);
	pthread_mutex_unlock(&mu);
	return ret(r);
}

API int cudaMalloc(void **out, size_t n) {
	pthread_mutex_lock(&mu);
	block *b = new_shared_block(n);
	if (b) add_live(b);
	pthread_mutex_unlock(&mu);
	if (!b) { *out = NULL; return ret(E_MEMORY_ALLOCATION); }
	*out = b->p;
	return OK;
}

API int cudaFree(void *p) {
	if (!p) return OK;
	pthread_mutex_lock(&mu);
	wait_device_idle(-1);
	block *b = take_live(p, 0);
	if (b && b->owner) { add_live(b); b = NULL; } /* pool memory: not ours to free */
	if (b) drop_block(b);
	pthread_mutex_unlock(&mu);
	return b ? OK : ret(E_INVALID_VALUE);
}

API int cudaHostAlloc(void **out, size_t n, unsigned flags) {
	(void)flags;
	block *b = calloc(1, sizeof *b);
	void *p = NULL;
	if (!b || posix_memalign(&p, 4096, n ? n : 1) != 0) { free(b); *out = NULL; return ret(E_MEMORY_ALLOCATION); }
	b->p = p;
	b->size = n;
	b->pinned = 1;
	b->fd = -1;
	pthread_mutex_lock(&mu);
	add_live(b);
	pthread_mutex_unlock(&mu);
	*out = p;
	return OK;
}

API int cudaFreeHost(void *p) {
	pthread_mutex_lock(&mu);
	wait_device_idle(-1);
	block *b = take_live(p, 1);
	pthread_mutex_unlock(&mu);
	if (!b) return ret(E_INVALID_VALUE);
	free(b->p);
	free(b);
	return OK;
}

API int cudaHostGetDevicePointer(void **d, void *p, unsigned flags) {
	(void)flags;
	*d = p;
	return OK;
}

/* ---- batched copies ---- */
#ifndef FAKE_NO_BATCH
typedef struct {
	int srcAccessOrder;
	int srcLocType, srcLocId, dstLocType, dstLocId;
	unsigned flags;
} memcpy_attributes;

static int memcpy_batch(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count,
                        memcpy_attributes *attrs, size_t *idxs, size_t nattrs, void *s) {
	/* The legacy default stream is refused; so are attributes other than
	 * one, in stream order, for every copy. */
	if ((uintptr_t)s <= 1 || count == 0 || !attrs || !idxs || nattrs != 1 || idxs[0] != 0 || attrs[0].srcAccessOrder != 1)
		return ret(E_INVALID_VALUE);
	pthread_mutex_lock(&mu);
	int r = OK;
	for (size_t i = 0; i < count && r == OK; i++) {
		op *o = new_op(OP_MEMCPY);
		if (o) { o->dst = dsts[i]; o->src = srcs[i]; o->n = sizes[i]; }
		r = push(s, o);
	}
	pthread_mutex_unlock(&mu);
	return ret(r);
}

#if FAKE_RUNTIME_VERSION >= 13000
API int cudaMemcpyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count,
                             memcpy_attributes *attrs, size_t *idxs, size_t nattrs, void *s) {
	return memcpy_batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, s);
}
#else
API int cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count, memcpy_attributes *attrs,
                             size_t *idxs, size_t nattrs, size_t *fail, void *s) {
	if (!fail) return ret(E_INVALID_VALUE);
	*fail = (size_t)-1;
	return memcpy_batch(dsts, (const void *const *)srcs, sizes, count, attrs, idxs, nattrs, s);
}
#endif
#endif

/* ---- kernel images and launches ---- */
#ifndef FAKE_NO_KERNELS
typedef struct { unsigned x, y, z; } dim3;

#define IMAGE_MAGIC "\x7f" "ELFFAKE"

API int cudaLibraryLoadData(void **lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv, unsigned nl) {
	(void)jo; (void)jv; (void)lo; (void)lv;
	int e = bad_device(current_device);
	if (e) return ret(e);
	if (!lib || !code) return ret(E_INVALID_VALUE);
	if (nj || nl) return ret(E_INVALID_VALUE); /* the fake takes no options */
	if (memcmp(code, IMAGE_MAGIC, 8) != 0) return ret(E_INVALID_KERNEL_IMAGE);
	library *l = calloc(1, sizeof *l);
	if (!l || !(l->source = strdup((const char *)code + 8))) { free(l); return ret(E_MEMORY_ALLOCATION); }
	PUSH_LOCKED(libraries, l);
	*lib = l;
	return OK;
}

static int ident(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/* declares reports whether source names name as a whole identifier. */
static int declares(const char *source, const char *name) {
	size_t n = strlen(name);
	for (const char *p = strstr(source, name); p; p = strstr(p + 1, name))
		if ((p == source || !ident(p[-1])) && !ident(p[n])) return 1;
	return 0;
}

API int cudaLibraryGetKernel(void **k, void *lib, const char *name) {
	library *l;
	pthread_mutex_lock(&mu);
	for (l = libraries; l && l != lib; l = l->next) {
	}
	pthread_mutex_unlock(&mu);
	if (!l || !k || !name) return ret(l ? E_INVALID_VALUE : E_INVALID_RESOURCE_HANDLE);
	if (strlen(name) >= sizeof ((kernel *)0)->name || !declares(l->source, name)) return ret(E_SYMBOL_NOT_FOUND);
	kernel *kn = calloc(1, sizeof *kn);
	if (!kn) return ret(E_MEMORY_ALLOCATION);
	kn->lib = l;
	strcpy(kn->name, name);
	for (size_t i = 0; i < sizeof known_kernels / sizeof known_kernels[0]; i++)
		if (strcmp(name, known_kernels[i].name) == 0) kn->kind = known_kernels[i].kind;
	PUSH_LOCKED(kernels, kn);
	*k = kn;
	return OK;
}

#define P(i) (*(const uint64_t *)args[i])
#define I(i) (*(const int *)args[i])
#define D(i) (*(const double *)args[i])

API int cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shmem, void *s) {
	kernel *kn;
	int e = bad_device(current_device);
	if (e) return ret(e);
	pthread_mutex_lock(&mu);
	for (kn = kernels; kn && kn != f; kn = kn->next) {
	}
	pthread_mutex_unlock(&mu);
	if (!kn) return ret(E_INVALID_RESOURCE_HANDLE);
	if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || (unsigned long long)block.x * block.y * block.z > 1024 ||
	    grid.y > 65535 || grid.z > 65535)
		return ret(E_INVALID_CONFIGURATION);
	if (kn->kind == K_UNKNOWN) {
		fprintf(stderr, "fakecudart: kernel %s has no host implementation: cudaErrorNotSupported\n", kn->name);
		return ret(E_NOT_SUPPORTED);
	}
	if (!args || shmem != 0) return ret(E_INVALID_VALUE); /* distbuf's kernels take no dynamic shared memory */
	op *o = new_op(OP_KERNEL);
	if (!o) return ret(E_MEMORY_ALLOCATION);
	launch *l = &o->k;
	l->kind = kn->kind;
	l->block = block.x;
	switch (kn->kind) {
	case K_COPY_TABLE:
		l->p[0] = P(0), l->i[0] = I(1), l->i[1] = I(2);
		break;
	case K_GEMM_POINTERS:
		l->p[0] = P(0), l->i[0] = I(1), l->p[1] = P(2), l->p[2] = P(3), l->p[3] = P(4), l->p[4] = P(5);
		break;
	default: /* (stack, tiny, count, A, B, C, are, aim, bre, bim, flags) */
		if (block.x != GEMM_THREADS || block.y != 1 || block.z != 1) {
			/* The kernel's warps and tiles assume THREADS threads. */
			fprintf(stderr, "fakecudart: %s launched with %u threads, the kernel needs %d\n", kn->name, block.x, GEMM_THREADS);
			free(o);
			return ret(E_INVALID_CONFIGURATION);
		}
		l->p[0] = P(0), l->i[0] = I(1), l->i[1] = I(2), l->p[1] = P(3), l->p[2] = P(4), l->p[3] = P(5);
		l->d[0] = D(6), l->d[1] = D(7), l->d[2] = D(8), l->d[3] = D(9), l->i[2] = I(10);
	}
	pthread_mutex_lock(&mu);
	int r = push(s, o);
	pthread_mutex_unlock(&mu);
	return ret(r);
}
#undef P
#undef I
#undef D
#endif

/* ---- interprocess memory and events ---- */
#ifndef FAKE_NO_IPC
#define IPC_LAZY_ENABLE_PEER_ACCESS 0x01

typedef struct { char reserved[64]; } ipc_handle;

/* The layout of both kinds of handle. */
typedef struct ipc_fields {
	uint64_t magic;
	int32_t pid, fd;
	uint64_t serial, size;
	int32_t device;
} ipc_fields;

/* An opened memory handle. */
typedef struct import {
	int32_t pid;
	uint64_t serial;
	char *base; /* the header page */
	size_t len;
	int refs;
	struct import *next;
} import;

static import *imports;

static ipc_fields fields(const ipc_handle *h) {
	ipc_fields f;
	memcpy(&f, h->reserved, sizeof f);
	return f;
}

API int cudaIpcGetMemHandle(ipc_handle *h, void *p) {
	if (!h) return ret(E_INVALID_VALUE);
	pthread_mutex_lock(&mu);
	block *b = find_live(p);
	/* Only the start of a cudaMalloc allocation can be exported. */
	int r = b && b->fd >= 0 && !b->owner && !b->pinned ? OK : E_INVALID_VALUE;
	if (r == OK) {
		ipc_fields f = {MEM_MAGIC, (int32_t)getpid(), b->fd, b->serial, b->size, current_device};
		memset(h, 0, sizeof *h);
		memcpy(h->reserved, &f, sizeof f);
	}
	pthread_mutex_unlock(&mu);
	return ret(r);
}

/* open_peer_fd opens another process's descriptor through /proc. */
static int open_peer_fd(int32_t pid, int32_t fd) {
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)fd);
	return open(path, O_RDWR | O_CLOEXEC);
}

API int cudaIpcOpenMemHandle(void **out, ipc_handle h, unsigned flags) {
	ipc_fields f = fields(&h);
	if (!out) return ret(E_INVALID_VALUE);
	*out = NULL;
	if (flags != IPC_LAZY_ENABLE_PEER_ACCESS || f.magic != MEM_MAGIC || f.size == 0) return ret(E_INVALID_VALUE);
	if (f.pid == (int32_t)getpid()) return ret(E_DEVICE_UNINITIALIZED);
	pthread_mutex_lock(&mu);
	for (import *im = imports; im; im = im->next)
		if (im->pid == f.pid && im->serial == f.serial) {
			im->refs++;
			*out = im->base + PAGE;
			pthread_mutex_unlock(&mu);
			return OK;
		}
	pthread_mutex_unlock(&mu);
	int fd = open_peer_fd(f.pid, f.fd);
	if (fd < 0) return ret(E_INVALID_RESOURCE_HANDLE); /* freed, or its process is gone */
	size_t len = PAGE + (f.size + PAGE - 1) / PAGE * PAGE;
	char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (base == MAP_FAILED) return ret(E_INVALID_RESOURCE_HANDLE);
	mem_header *hd = (mem_header *)base;
	if (hd->magic != MEM_MAGIC || hd->serial != f.serial || hd->size != f.size || __atomic_load_n(&hd->freed, __ATOMIC_ACQUIRE)) {
		munmap(base, len);
		return ret(E_INVALID_RESOURCE_HANDLE); /* the descriptor now names other memory */
	}
	import *im = calloc(1, sizeof *im);
	if (!im) { munmap(base, len); return ret(E_MEMORY_ALLOCATION); }
	im->pid = f.pid;
	im->serial = f.serial;
	im->base = base;
	im->len = len;
	im->refs = 1;
	PUSH_LOCKED(imports, im);
	*out = base + PAGE;
	return OK;
}

API int cudaIpcCloseMemHandle(void *p) {
	pthread_mutex_lock(&mu);
	import **ip = &imports;
	while (*ip && (*ip)->base + PAGE != p) ip = &(*ip)->next;
	import *im = *ip;
	if (im && --im->refs == 0) {
		*ip = im->next;
		munmap(im->base, im->len);
		free(im);
	}
	pthread_mutex_unlock(&mu);
	return im ? OK : ret(E_INVALID_VALUE);
}

API int cudaIpcGetEventHandle(ipc_handle *h, void *ev) {
	event *e = ev;
	if (!h || !e) return ret(E_INVALID_VALUE);
	if (!e->ipc) return ret(E_INVALID_RESOURCE_HANDLE); /* not made with cudaEventInterprocess */
	ipc_fields f = {EVENT_MAGIC, (int32_t)getpid(), e->ipc->fd, e->ipc->sh->serial, PAGE, current_device};
	memset(h, 0, sizeof *h);
	memcpy(h->reserved, &f, sizeof f);
	return OK;
}

API int cudaIpcOpenEventHandle(void **out, ipc_handle h) {
	ipc_fields f = fields(&h);
	if (!out) return ret(E_INVALID_VALUE);
	*out = NULL;
	if (f.magic != EVENT_MAGIC) return ret(E_INVALID_VALUE);
	if (f.pid == (int32_t)getpid()) return ret(E_DEVICE_UNINITIALIZED);
	int fd = open_peer_fd(f.pid, f.fd);
	if (fd < 0) return ret(E_MAP_BUFFER_OBJECT_FAILED);
	shared_event *sh = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (sh == MAP_FAILED) { close(fd); return ret(E_MAP_BUFFER_OBJECT_FAILED); }
	if (sh->magic != EVENT_MAGIC || sh->serial != f.serial) {
		munmap(sh, PAGE);
		close(fd);
		return ret(E_INVALID_VALUE);
	}
	event *e = calloc(1, sizeof *e);
	shmap *m = calloc(1, sizeof *m);
	if (!e || !m) { free(e); free(m); munmap(sh, PAGE); close(fd); return ret(E_MEMORY_ALLOCATION); }
	m->sh = sh;
	m->fd = fd; /* kept, so that this process can export the event again */
	m->refs = 1;
	e->ipc = m;
	e->flags = EVENT_INTERPROCESS | EVENT_DISABLE_TIMING;
	*out = e;
	return OK;
}
#endif

/* ---- stream-ordered pools ---- */
#ifndef FAKE_NO_POOLS
API int cudaMemPoolCreate(void **out, const void *props) {
	pool *pl = calloc(1, sizeof *pl);
	if (!pl) return ret(E_MEMORY_ALLOCATION);
	pl->dev = ((const int *)props)[3]; /* location.id */
	pl->reuse[1] = pl->reuse[2] = pl->reuse[3] = 1;
	PUSH_LOCKED(pools, pl);
	*out = pl;
	return OK;
}

API int cudaMemPoolDestroy(void *h) {
	pool *pl = h;
	pthread_mutex_lock(&mu);
	pool_trim(pl, 0);
	pl->destroyed = 1;
	pthread_mutex_unlock(&mu);
	return OK;
}

API int cudaMemPoolSetAttribute(void *h, int attr, void *v) {
	pool *pl = h;
	int r = OK;
	pthread_mutex_lock(&mu);
	switch (attr) {
	case 1: case 2: case 3: pl->reuse[attr] = *(int *)v; break;
	case 4: pl->threshold = *(unsigned long long *)v; break;
	case 6: if (*(unsigned long long *)v) r = E_INVALID_VALUE; else pl->reserved_high = pl->reserved; break;
	case 8: if (*(unsigned long long *)v) r = E_INVALID_VALUE; else pl->used_high = pl->used; break;
	default: r = E_INVALID_VALUE;
	}
	pthread_mutex_unlock(&mu);
	return ret(r);
}

API int cudaMemPoolGetAttribute(void *h, int attr, void *v) {
	pool *pl = h;
	int r = OK;
	pthread_mutex_lock(&mu);
	switch (attr) {
	case 1: case 2: case 3: *(int *)v = pl->reuse[attr]; break;
	case 4: *(unsigned long long *)v = pl->threshold; break;
	case 5: *(unsigned long long *)v = pl->reserved; break;
	case 6: *(unsigned long long *)v = pl->reserved_high; break;
	case 7: *(unsigned long long *)v = pl->used; break;
	case 8: *(unsigned long long *)v = pl->used_high; break;
	default: r = E_INVALID_VALUE;
	}
	pthread_mutex_unlock(&mu);
	return ret(r);
}

API int cudaMemPoolTrimTo(void *h, size_t keep) {
	pthread_mutex_lock(&mu);
	pool_trim(h, keep);
	pthread_mutex_unlock(&mu);
	return OK;
}

API int cudaMallocFromPoolAsync(void **out, size_t n, void *h, void *s) {
	pool *pl = h;
	block *b = NULL;
#ifdef FAKE_NO_WORK
	static uintptr_t next = 1 << 20;
	(void)pl; (void)b; (void)s;
	*out = (void *)__atomic_fetch_add(&next, (n + 255) / 256 * 256, __ATOMIC_RELAXED);
	return OK;
#endif
	pthread_mutex_lock(&mu);
	stream *st = resolve(s);
	if (!st || st->dev != current_device || pl->dev != current_device) {
		pthread_mutex_unlock(&mu);
		*out = NULL;
		return ret(E_INVALID_RESOURCE_HANDLE);
	}
	/* The best fit of at most twice the size: blocks are never split, so a
	 * larger one would waste host memory. */
	block **best = NULL;
	for (block **bp = &pl->free_list; *bp; bp = &(*bp)->next)
		if ((*bp)->size >= n && (*bp)->size / 2 <= n && (!best || (*bp)->size < (*best)->size)) best = bp;
	if (best) {
		b = *best;
		*best = b->next;
		b->next = NULL;
	}
	if (!b) {
		b = new_block(n, pl);
		if (b) {
			pl->reserved += b->size;
			if (pl->reserved > pl->reserved_high) pl->reserved_high = pl->reserved;
		}
	}
	if (b) {
		pl->used += b->size;
		if (pl->used > pl->used_high) pl->used_high = pl->used;
		add_live(b);
	}
	pthread_mutex_unlock(&mu);
	if (!b) { *out = NULL; return ret(E_MEMORY_ALLOCATION); }
	*out = b->p;
	return OK;
}

API int cudaFreeAsync(void *p, void *s) {
#ifdef FAKE_NO_WORK
	(void)p; (void)s;
	return OK;
#endif
	pthread_mutex_lock(&mu);
	block *b = take_live(p, 0);
	if (b && !b->owner) { add_live(b); b = NULL; }
	int r = E_INVALID_VALUE;
	if (b) {
		op *o = new_op(OP_FREE_ASYNC);
		if (o) o->blk = b;
		r = push(s, o);
		if (r != OK) add_live(b);
	}
	pthread_mutex_unlock(&mu);
	return ret(r);
}
#endif

/* ---- driver functions and their lookup ---- */

static int cu_device_get(int *d, int ordinal) {
	if (ordinal < 0 || ordinal >= FAKE_DEVICE_COUNT) return 101; /* CUDA_ERROR_INVALID_DEVICE */
	*d = ordinal;
	return 0;
}

static int cu_device_get_name(char *buf, int len, int d) {
	(void)d;
	if (len <= 0) return 1;
	strncpy(buf, "Fake CUDA Device", (size_t)len);
	buf[len - 1] = 0;
	return 0;
}

static int cu_ctx_get_current(void **ctx) {
	*ctx = device_set ? &primary_ctx[current_device] : NULL;
	return 0;
}

static int cu_stream_wait_value32(void *s, unsigned long long addr, uint32_t value, unsigned flags) {
	if (flags != 0) return 1; /* only GEQ is emulated */
	pthread_mutex_lock(&mu);
	op *o = new_op(OP_WAIT_VALUE);
	if (o) { o->word = (volatile uint32_t *)(uintptr_t)addr; o->want = value; }
	int r = push(s, o);
	pthread_mutex_unlock(&mu);
	return r == OK ? 0 : 400; /* CUDA_ERROR_INVALID_HANDLE */
}

/* cuMemGetAddressRange: the allocation holding p, among this process's
 * cudaMalloc and pool memory and the memory it opened through IPC. */
static int cu_mem_get_address_range(unsigned long long *base, size_t *size, unsigned long long dptr) {
	char *p = (char *)(uintptr_t)dptr;
	int r = 1; /* CUDA_ERROR_INVALID_VALUE */
	pthread_mutex_lock(&mu);
	for (int i = 0; i < LIVE_BUCKETS && r != 0; i++)
		for (block *b = live[i]; b; b = b->next)
			if (!b->pinned && p >= b->p && p < b->p + b->size) {
				*base = (uintptr_t)b->p;
				*size = b->size;
				r = 0;
				break;
			}
#ifndef FAKE_NO_IPC
	for (import *im = imports; im && r != 0; im = im->next) {
		mem_header *hd = (mem_header *)im->base;
		char *start = im->base + PAGE;
		if (p >= start && p < start + hd->size) {
			*base = (uintptr_t)start;
			*size = hd->size;
			r = 0;
		}
	}
#endif
	pthread_mutex_unlock(&mu);
	return r;
}

#ifndef FAKE_NO_ENTRY_POINT
API int cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned version, unsigned long long flags, int *status) {
	(void)version;
	(void)flags;
	*fn = NULL;
	if (strcmp(sym, "cuDeviceGet") == 0) *fn = (void *)cu_device_get;
	if (strcmp(sym, "cuDeviceGetName") == 0) *fn = (void *)cu_device_get_name;
	if (strcmp(sym, "cuMemGetAddressRange") == 0) *fn = (void *)cu_mem_get_address_range;
#ifndef FAKE_NO_CTX_GET_CURRENT
	if (strcmp(sym, "cuCtxGetCurrent") == 0) *fn = (void *)cu_ctx_get_current;
#endif
#ifndef FAKE_NO_WAIT_VALUE
	if (strcmp(sym, "cuStreamWaitValue32") == 0) *fn = (void *)cu_stream_wait_value32;
#endif
	if (status) *status = *fn ? 0 : 1;
	return OK;
}
#endif
