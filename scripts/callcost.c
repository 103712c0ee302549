// callcost: what single CUDA runtime and driver calls cost the calling
// thread on this machine, from C, through the libraries a distbuf rank
// loads (dlopen, as internal/cudart does): the floor under devalloc's
// per-call overhead. Each figure is the mean over a loop of calls on one
// non-blocking stream, printed three times.
//
//   gcc -O2 -o callcost scripts/callcost.c -ldl && ./callcost
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *need(void *lib, const char *name) {
	void *f = dlsym(lib, name);
	if (f == NULL) fprintf(stderr, "callcost: %s missing\n", name);
	return f;
}

int main(void) {
	void *rt = dlopen("libcudart.so", RTLD_NOW | RTLD_GLOBAL);
	if (rt == NULL) rt = dlopen("/usr/local/cuda/lib64/libcudart.so", RTLD_NOW | RTLD_GLOBAL);
	void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (rt == NULL || cu == NULL) {
		fprintf(stderr, "callcost: %s\n", dlerror());
		return 1;
	}
	int (*set_device)(int) = need(rt, "cudaSetDevice");
	int (*get_device)(int *) = need(rt, "cudaGetDevice");
	int (*ctx_current)(void **) = need(cu, "cuCtxGetCurrent");
	int (*stream_create)(void **, unsigned) = need(rt, "cudaStreamCreateWithFlags");
	int (*malloc_async)(void **, size_t, void *) = need(rt, "cudaMallocAsync");
	int (*free_async)(void *, void *) = need(rt, "cudaFreeAsync");
	int (*memset_async)(void *, int, size_t, void *) = need(rt, "cudaMemsetAsync");
	int (*stream_sync)(void *) = need(rt, "cudaStreamSynchronize");
	if (!set_device || !get_device || !ctx_current || !stream_create || !malloc_async || !free_async || !memset_async || !stream_sync)
		return 1;
	void *s, *p, *ctx;
	int dev;
	if (set_device(0) || stream_create(&s, 1) || malloc_async(&p, 1 << 20, s) || stream_sync(s)) {
		fprintf(stderr, "callcost: no usable device\n");
		return 1;
	}
	const int n = 200000, m = 20000;
	for (int round = 0; round < 3; round++) {
		double t = now_ns();
		for (int i = 0; i < n; i++) ctx_current(&ctx);
		printf("cuCtxGetCurrent %.1f ns\n", (now_ns() - t) / n);
		t = now_ns();
		for (int i = 0; i < n; i++) get_device(&dev);
		printf("cudaGetDevice %.1f ns\n", (now_ns() - t) / n);
		t = now_ns();
		for (int i = 0; i < n; i++) set_device(0);
		printf("cudaSetDevice %.1f ns\n", (now_ns() - t) / n);
		t = now_ns();
		for (int i = 0; i < m; i++) memset_async(p, 0, 4096, s);
		printf("cudaMemsetAsync (4 KiB) %.1f ns\n", (now_ns() - t) / m);
		stream_sync(s);
		t = now_ns();
		for (int i = 0; i < m; i++) {
			ctx_current(&ctx);
			memset_async(p, 0, 4096, s);
		}
		printf("cuCtxGetCurrent + cudaMemsetAsync %.1f ns\n", (now_ns() - t) / m);
		stream_sync(s);
		t = now_ns();
		for (int i = 0; i < m; i++) {
			void *q;
			malloc_async(&q, 4096, s);
			free_async(q, s);
		}
		printf("cudaMallocAsync + cudaFreeAsync (4 KiB) %.1f ns\n", (now_ns() - t) / m);
		stream_sync(s);
	}
	return 0;
}
