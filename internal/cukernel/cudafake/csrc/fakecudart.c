/* A CPU stand-in for the libcudart subset that internal/cukernel binds, for
 * tests on machines without a GPU: "device" memory is host memory, copies
 * are memcpy, events read the clock, and the one kernel it knows (loaded
 * from a fake image) runs the copy-table semantics on the CPU. It checks
 * the arguments the real runtime would reject. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK 0
#define ERR_INVALID_VALUE 1
#define ERR_INVALID_DEVICE 101
#define ERR_INVALID_IMAGE 200
#define ERR_NOT_FOUND 500

typedef struct { unsigned x, y, z; } dim3;
typedef struct {
	int srcAccessOrder;
	int srcLocType, srcLocId, dstLocType, dstLocId;
	unsigned flags;
} attrs_t;

static __thread int current = -1;
static void *allocs[4096];

int cudaSetDevice(int d) {
	if (d != 0) return ERR_INVALID_DEVICE;
	current = d;
	return OK;
}
static int need_device(void) { return current == 0 ? OK : ERR_INVALID_DEVICE; }

const char *cudaGetErrorString(int e) {
	switch (e) {
	case ERR_INVALID_VALUE: return "invalid argument (fake)";
	case ERR_INVALID_DEVICE: return "invalid device ordinal (fake)";
	case ERR_INVALID_IMAGE: return "device kernel image is invalid (fake)";
	case ERR_NOT_FOUND: return "named symbol not found (fake)";
	}
	return "unknown error (fake)";
}

int cudaRuntimeGetVersion(int *v) { *v = 13000; return OK; }

int cudaDeviceGetAttribute(int *v, int attr, int dev) {
	if (dev != 0) return ERR_INVALID_DEVICE;
	switch (attr) {
	case 75: *v = 9; return OK;
	case 76: *v = 0; return OK;
	case 16: *v = 132; return OK;
	}
	return ERR_INVALID_VALUE;
}

int cudaMalloc(void **p, size_t n) {
	if (need_device()) return need_device();
	for (int i = 0; i < 4096; i++) {
		if (!allocs[i]) {
			allocs[i] = *p = calloc(1, n ? n : 1);
			return OK;
		}
	}
	return 2;
}

int cudaFree(void *p) {
	for (int i = 0; i < 4096; i++) {
		if (allocs[i] && allocs[i] == p) {
			free(p);
			allocs[i] = 0;
			return OK;
		}
	}
	return ERR_INVALID_VALUE;
}

int cudaMemcpy(void *d, const void *s, size_t n, int kind) {
	if (need_device()) return need_device();
	if (kind != 4) return ERR_INVALID_VALUE; /* only cudaMemcpyDefault is used */
	memmove(d, s, n);
	return OK;
}

int cudaMemcpyAsync(void *d, const void *s, size_t n, int kind, void *stream) {
	(void)stream;
	return cudaMemcpy(d, s, n, kind);
}

int cudaMemcpyBatchAsync(const void **dsts, const void **srcs, const size_t *sizes, size_t count,
		attrs_t *attrs, size_t *idxs, size_t nattrs, void *stream) {
	(void)stream;
	if (need_device()) return need_device();
	if (!attrs || !idxs || nattrs != 1 || idxs[0] != 0 || attrs[0].srcAccessOrder != 1 || count == 0) return ERR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) memmove((void *)dsts[i], srcs[i], sizes[i]);
	return OK;
}

typedef struct { double t; } event_t;
static double now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
int cudaEventCreate(void **e) {
	if (need_device()) return need_device();
	*e = calloc(1, sizeof(event_t));
	return OK;
}
int cudaEventRecord(void *e, void *stream) { (void)stream; ((event_t *)e)->t = now_ms(); return OK; }
int cudaEventSynchronize(void *e) { return e ? OK : ERR_INVALID_VALUE; }
int cudaEventElapsedTime(float *ms, void *a, void *b) { *ms = (float)(((event_t *)b)->t - ((event_t *)a)->t); return OK; }
int cudaEventDestroy(void *e) { free(e); return OK; }
int cudaDeviceSynchronize(void) { return need_device(); }
int cudaStreamSynchronize(void *s) { (void)s; return need_device(); }

/* A fake image is "\x7fELFFAKE" followed by anything; it holds one kernel,
 * distbuf_copy_table(const uint64_t *table, int n, int reverse). */
static int fake_library, fake_kernel;
int cudaLibraryLoadData(void **lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv, unsigned nl) {
	(void)jo; (void)jv; (void)lo; (void)lv;
	if (need_device()) return need_device();
	if (nj || nl || memcmp(code, "\x7f" "ELFFAKE", 8) != 0) return ERR_INVALID_IMAGE;
	*lib = &fake_library;
	return OK;
}
int cudaLibraryGetKernel(void **k, void *lib, const char *name) {
	if (lib != &fake_library) return ERR_INVALID_VALUE;
	if (strcmp(name, "distbuf_copy_table") != 0) return ERR_NOT_FOUND;
	*k = &fake_kernel;
	return OK;
}
int cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
	(void)stream;
	if (need_device()) return need_device();
	if (f != &fake_kernel || grid.x == 0 || grid.y != 1 || grid.z != 1 || block.x == 0 || block.x > 1024 || block.y != 1 || block.z != 1 || shmem) return ERR_INVALID_VALUE;
	const uint64_t *table = *(const uint64_t **)args[0];
	int n = *(int *)args[1], reverse = *(int *)args[2];
	for (int e = 0; e < n; e++) {
		char *a = (char *)(uintptr_t)table[3 * e], *b = (char *)(uintptr_t)table[3 * e + 1];
		memmove(reverse ? a : b, reverse ? b : a, table[3 * e + 2]);
	}
	return OK;
}
