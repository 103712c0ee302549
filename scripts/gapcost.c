// gapcost: whether CUDA runtime calls cost more when the calling thread
// does other work between them, as a Go caller does (devalloc's bookkeeping
// and the cgo transition), than when they run back to back.
//
// It runs the alloc benchmark's large-only cycle-touch from C: 20 buffers
// of 16-64 MiB (log-uniform, fixed seed) from a private pool whose release
// threshold is UINT64_MAX, the first 4 KiB of each set by cudaMemsetAsync
// and freed with cudaFreeAsync, one cudaStreamSynchronize. After every
// runtime call the thread spends a gap of G ns: spinning on the clock
// ("spin"), or spinning while it walks a 1 MiB buffer ("walk"), which
// evicts what the runtime left in the first-level caches as Go code would.
// It prints, for each gap, the median cycle and the median of the cycle
// less its gaps: the runtime's own time. Without a cost of gaps both stay
// at the G=0 figure. With the argument "nodeps" the pool is configured as
// devalloc configures its own: cudaMemPoolReuseAllowInternalDependencies 0.
//
//   gcc -O2 -o gapcost scripts/gapcost.c -ldl -lm && ./gapcost [nodeps]
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { buffers = 20, cycles = 400, touch = 4096, walk_bytes = 1 << 20 };

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static volatile unsigned char *walk;
static unsigned walk_at;

// gap spends about ns nanoseconds and returns what it spent.
static int64_t gap(int64_t ns, int walking) {
	if (ns == 0) return 0;
	int64_t t0 = now_ns(), t;
	do {
		if (walking) {
			for (int i = 0; i < 16; i++) {
				walk[walk_at] += 1;
				walk_at = (walk_at + 64) % walk_bytes;
			}
		}
		t = now_ns();
	} while (t - t0 < ns);
	return t - t0;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void *need(void *lib, const char *name) {
	void *f = dlsym(lib, name);
	if (f == NULL) fprintf(stderr, "gapcost: %s missing\n", name);
	return f;
}

int main(int argc, char **argv) {
	void *rt = dlopen("libcudart.so", RTLD_NOW | RTLD_GLOBAL);
	if (rt == NULL) rt = dlopen("/usr/local/cuda/lib64/libcudart.so", RTLD_NOW | RTLD_GLOBAL);
	if (rt == NULL) {
		fprintf(stderr, "gapcost: %s\n", dlerror());
		return 1;
	}
	int (*set_device)(int) = need(rt, "cudaSetDevice");
	int (*stream_create)(void **, unsigned) = need(rt, "cudaStreamCreateWithFlags");
	int (*pool_create)(void **, const void *) = need(rt, "cudaMemPoolCreate");
	int (*pool_set)(void *, int, void *) = need(rt, "cudaMemPoolSetAttribute");
	int (*malloc_pool)(void **, size_t, void *, void *) = need(rt, "cudaMallocFromPoolAsync");
	int (*free_async)(void *, void *) = need(rt, "cudaFreeAsync");
	int (*memset_async)(void *, int, size_t, void *) = need(rt, "cudaMemsetAsync");
	int (*stream_sync)(void *) = need(rt, "cudaStreamSynchronize");
	if (!set_device || !stream_create || !pool_create || !pool_set || !malloc_pool || !free_async || !memset_async || !stream_sync)
		return 1;
	// cudaMemPoolProps: allocType pinned (1), handleTypes none (0), location
	// device (1) 0; the rest zero. 88 bytes in CUDA 13's headers.
	int props[22];
	memset(props, 0, sizeof props);
	props[0] = 1;
	props[2] = 1;
	props[3] = 0;
	void *s, *pool, *ptr[buffers];
	uint64_t keep = UINT64_MAX;
	if (set_device(0) || stream_create(&s, 1) || pool_create(&pool, props) || pool_set(pool, 4 /* ReleaseThreshold */, &keep)) {
		fprintf(stderr, "gapcost: no usable device or pool\n");
		return 1;
	}
	int deps = 0;
	if (argc > 1 && strcmp(argv[1], "nodeps") == 0 && pool_set(pool, 3 /* ReuseAllowInternalDependencies */, &deps)) {
		fprintf(stderr, "gapcost: cannot configure the pool\n");
		return 1;
	}
	walk = calloc(walk_bytes, 1);
	size_t sizes[buffers];
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	const int64_t gaps[] = {0, 100, 250, 500, 1000, 0};
	double total[cycles], runtime[cycles];
	for (int walking = 0; walking < 2; walking++) {
		for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
			for (int c = 0; c < cycles + 20; c++) {
				for (int i = 0; i < buffers; i++) {
					seed = seed * 6364136223846793005ull + 1442695040888963407ull;
					double u = (double)(seed >> 11) / 9007199254740992.0;
					sizes[i] = ((size_t)(exp(log(16.0) + u * log(4.0)) * (1 << 20)) + 255) & ~(size_t)255;
				}
				int64_t spent = 0, t0 = now_ns();
				for (int i = 0; i < buffers; i++) {
					if (malloc_pool(&ptr[i], sizes[i], pool, s)) return 2;
					spent += gap(gaps[g], walking);
				}
				for (int i = 0; i < buffers; i++) {
					if (memset_async(ptr[i], c & 0xff, touch, s)) return 3;
					spent += gap(gaps[g], walking);
					if (free_async(ptr[i], s)) return 4;
					spent += gap(gaps[g], walking);
				}
				if (stream_sync(s)) return 5;
				int64_t t = now_ns() - t0;
				if (c >= 20) {
					total[c - 20] = t / 1e3;
					runtime[c - 20] = (t - spent) / 1e3;
				}
			}
			qsort(total, cycles, sizeof total[0], cmp);
			qsort(runtime, cycles, sizeof runtime[0], cmp);
			printf("%s gap %5lld ns: cycle %7.1f us, runtime alone %7.1f us\n", walking ? "walk" : "spin",
			       (long long)gaps[g], total[cycles / 2], runtime[cycles / 2]);
		}
	}
	return 0;
}
