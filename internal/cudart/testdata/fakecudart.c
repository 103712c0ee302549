/*
 * fakecudart: a stand-in for libcudart built by distbuf's tests with gcc.
 *
 * "Device" memory is host memory, so everything the allocator does can be
 * checked from Go. Streams are asynchronous like the real ones: each stream
 * runs its operations in order on its own thread, events complete when their
 * stream reaches them, and host functions of all streams run one at a time
 * on a single callback thread (the real runtime may serialise them too, and
 * the tests must survive that). cuStreamWaitValue32 polls the word. cudaFree
 * and cudaFreeHost wait until every stream is idle, as the real ones
 * synchronise the device.
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
 *   FAKE_NO_POOLS                omit the stream-ordered pool functions
 *   FAKE_NO_ENTRY_POINT          omit the driver entry-point lookup
 *   FAKE_NO_WAIT_VALUE           the lookup does not find cuStreamWaitValue32
 *   FAKE_NO_CTX_GET_CURRENT      the lookup does not find cuCtxGetCurrent
 *   FAKE_OMIT_cudaMemcpyAsync    omit a required symbol
 *   FAKE_MEMORY=bytes            device memory size (default 8 GiB)
 *   FAKE_RUNTIME_VERSION=v       cudaRuntimeGetVersion's answer (default 13000)
 *   FAKE_NO_WORK                 pool allocations, frees, memsets and stream
 *                                synchronisations do nothing (addresses are
 *                                not backed): for profiling the Go side of
 *                                the hot path with real cgo calls
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef FAKE_DEVICE_COUNT
#define FAKE_DEVICE_COUNT 1
#endif
#ifndef FAKE_DEVICE_COUNT_ERROR
#define FAKE_DEVICE_COUNT_ERROR 0
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

enum {
	OK = 0,
	E_INVALID_VALUE = 1,
	E_MEMORY_ALLOCATION = 2,
	E_INSUFFICIENT_DRIVER = 35,
	E_NO_DEVICE = 100,
	E_INVALID_DEVICE = 101,
	E_INVALID_RESOURCE_HANDLE = 400,
	E_NOT_READY = 600,
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
	{E_INSUFFICIENT_DRIVER, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
	{E_NO_DEVICE, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
	{E_INVALID_DEVICE, "cudaErrorInvalidDevice", "invalid device ordinal"},
	{E_INVALID_RESOURCE_HANDLE, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
	{E_NOT_READY, "cudaErrorNotReady", "device not ready"},
	{E_NOT_SUPPORTED, "cudaErrorNotSupported", "operation not supported"},
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static __thread int last_error;
static __thread int current_device;
static __thread int device_set; /* a primary context is current to the thread */
static char primary_ctx[FAKE_DEVICE_COUNT > 0 ? FAKE_DEVICE_COUNT : 1];

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
	case 19: *v = 1; break;                    /* can map host memory */
	case 41: *v = 1; break;                    /* unified addressing */
	case 75: *v = 9; break;                    /* compute capability major */
	case 76: *v = 0; break;                    /* minor */
	case 115: *v = FAKE_POOLS_SUPPORTED; break; /* memory pools supported */
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

static block *new_block(size_t n, pool *owner) {
	if (n == 0) n = 1;
	if (n > FAKE_MEMORY || device_reserved + n > FAKE_MEMORY) return NULL;
	block *b = calloc(1, sizeof *b);
	if (!b) return NULL;
	b->p = malloc(n);
	if (!b->p) { free(b); return NULL; }
	b->size = n;
	b->owner = owner;
	device_reserved += n;
	return b;
}

static void drop_block(block *b) {
	device_reserved -= b->size;
	free(b->p);
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

/* ---- streams, events, host functions ---- */

enum { OP_MEMSET, OP_MEMCPY, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_HOST_FN, OP_FREE_ASYNC };

/* Each record is its own instance: a wait made before a re-record keeps
 * waiting for the record it saw, as with the real runtime (events are
 * pooled and re-recorded by the code under test). */
typedef struct rec {
	int done, refs;
} rec;

typedef struct event {
	rec *last; /* NULL until recorded */
} event;

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
	case OP_RECORD:
		o->r->done = 1;
		unref(o->r);
		break;
	case OP_WAIT_EVENT:
		while (!o->r->done) pthread_cond_wait(&cv, &mu);
		unref(o->r);
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

static int find_stream(stream *s) {
	for (stream *t = streams; t; t = t->next)
		if (t == s) return 1;
	return 0;
}

/* push enqueues o on s; called with mu held. */
static int push(stream *s, op *o) {
	if (!o) return E_MEMORY_ALLOCATION;
	if (!find_stream(s) || s->dev != current_device) { free(o); return E_INVALID_RESOURCE_HANDLE; }
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

static void wait_device_idle(void) {
	for (;;) {
		stream *s = streams;
		while (s && !s->head && !s->busy) s = s->next;
		if (!s) return;
		pthread_cond_wait(&cv, &mu);
	}
}

API int cudaStreamCreateWithFlags(void **out, unsigned flags) {
	(void)flags;
	stream *s = calloc(1, sizeof *s);
	if (!s) return ret(E_MEMORY_ALLOCATION);
	s->dev = current_device;
	pthread_mutex_lock(&mu);
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&mu);
	pthread_create(&s->th, NULL, stream_main, s);
	*out = s;
	return OK;
}

API int cudaStreamSynchronize(void *h) {
	stream *s = h;
#ifdef FAKE_NO_WORK
	(void)s;
	return OK;
#endif
	pthread_mutex_lock(&mu);
	if (!find_stream(s)) { pthread_mutex_unlock(&mu); return ret(E_INVALID_RESOURCE_HANDLE); }
	wait_idle(s);
	apply_thresholds();
	pthread_mutex_unlock(&mu);
	return OK;
}

API int cudaStreamDestroy(void *h) {
	stream *s = h;
	pthread_mutex_lock(&mu);
	if (!find_stream(s)) { pthread_mutex_unlock(&mu); return ret(E_INVALID_RESOURCE_HANDLE); }
	wait_idle(s);
	s->stop = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	pthread_join(s->th, NULL);
	pthread_mutex_lock(&mu);
	for (stream **sp = &streams; *sp; sp = &(*sp)->next)
		if (*sp == s) { *sp = s->next; break; }
	pthread_mutex_unlock(&mu);
	free(s);
	return OK;
}

API int cudaEventCreateWithFlags(void **out, unsigned flags) {
	(void)flags;
	event *e = calloc(1, sizeof *e);
	if (!e) return ret(E_MEMORY_ALLOCATION);
	*out = e;
	return OK;
}

API int cudaEventRecord(void *ev, void *s) {
	event *e = ev;
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
	if (!e->last) { /* never recorded: nothing to wait for */
		pthread_mutex_unlock(&mu);
		return OK;
	}
	op *o = new_op(OP_WAIT_EVENT);
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
	pthread_mutex_lock(&mu);
	int done = !e->last || e->last->done;
	pthread_mutex_unlock(&mu);
	return done ? OK : E_NOT_READY;
}

API int cudaEventSynchronize(void *ev) {
	event *e = ev;
	pthread_mutex_lock(&mu);
	while (e->last && !e->last->done) pthread_cond_wait(&cv, &mu);
	apply_thresholds();
	pthread_mutex_unlock(&mu);
	return OK;
}

/* Operations already queued hold their record instance, not the event. */
API int cudaEventDestroy(void *ev) {
	event *e = ev;
	pthread_mutex_lock(&mu);
	unref(e->last);
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

#ifndef FAKE_OMIT_cudaMemcpyAsync
API int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s) {
	if (kind != 4) return ret(E_INVALID_VALUE);
	pthread_mutex_lock(&mu);
	op *o = new_op(OP_MEMCPY);
	if (o) { o->dst = dst; o->src = src; o->n = n; }
	int r = push(s, o);
	pthread_mutex_unlock(&mu);
	return ret(r);
}
#endif

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
	block *b = new_block(n, NULL);
	if (b) add_live(b);
	pthread_mutex_unlock(&mu);
	if (!b) { *out = NULL; return ret(E_MEMORY_ALLOCATION); }
	*out = b->p;
	return OK;
}

API int cudaFree(void *p) {
	if (!p) return OK;
	pthread_mutex_lock(&mu);
	wait_device_idle();
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
	pthread_mutex_lock(&mu);
	add_live(b);
	pthread_mutex_unlock(&mu);
	*out = p;
	return OK;
}

API int cudaFreeHost(void *p) {
	pthread_mutex_lock(&mu);
	wait_device_idle();
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

/* ---- stream-ordered pools ---- */
#ifndef FAKE_NO_POOLS
API int cudaMemPoolCreate(void **out, const void *props) {
	pool *pl = calloc(1, sizeof *pl);
	if (!pl) return ret(E_MEMORY_ALLOCATION);
	pl->dev = ((const int *)props)[3]; /* location.id */
	pl->reuse[1] = pl->reuse[2] = pl->reuse[3] = 1;
	pthread_mutex_lock(&mu);
	pl->next = pools;
	pools = pl;
	pthread_mutex_unlock(&mu);
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
	if (!find_stream(s) || ((stream *)s)->dev != current_device || pl->dev != current_device) {
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

#ifndef FAKE_NO_ENTRY_POINT
API int cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned version, unsigned long long flags, int *status) {
	(void)version;
	(void)flags;
	*fn = NULL;
	if (strcmp(sym, "cuDeviceGet") == 0) *fn = (void *)cu_device_get;
	if (strcmp(sym, "cuDeviceGetName") == 0) *fn = (void *)cu_device_get_name;
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
