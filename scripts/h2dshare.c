// h2dshare: how ranks sharing one GPU share its host-to-device link. N
// processes each upload B bytes from pinned memory every iteration, as the
// main job's ranks upload their operands each solve, in K chunks over K
// streams of their own, all starting together. It prints the per-process
// median of one upload and the aggregate rate (every process's bytes over
// the slowest one's wall time). Run it under MPS (nvidia-cuda-mps-control
// -d) to see the ranks of an MPS job.
//
//   gcc -O2 -o h2dshare scripts/h2dshare.c -ldl && ./h2dshare N K [BYTES [ITERATIONS]]
//
// BYTES defaults to one solve's A and B at the default workload
// (1183232), ITERATIONS to 300; K is 1 to 8.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { maxStreams = 8, maxProcs = 64, hostToDevice = 1, nonBlocking = 1, disableTiming = 2, portableMapped = 3 };

static double now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

// shared is what the processes report through shared memory.
struct shared {
	int ready, failed;
	double median_us[maxProcs], wall_us[maxProcs];
};

static int upload(struct shared *sh, int me, int procs, int k, size_t bytes, int iters) {
	void *rt = dlopen("libcudart.so", RTLD_NOW);
	if (rt == NULL) rt = dlopen("/usr/local/cuda/lib64/libcudart.so", RTLD_NOW);
	if (rt == NULL) return fprintf(stderr, "h2dshare: %s\n", dlerror()), 1;
	int (*set_device)(int) = dlsym(rt, "cudaSetDevice");
	int (*host_alloc)(void **, size_t, unsigned) = dlsym(rt, "cudaHostAlloc");
	int (*dev_alloc)(void **, size_t) = dlsym(rt, "cudaMalloc");
	int (*stream_create)(void **, unsigned) = dlsym(rt, "cudaStreamCreateWithFlags");
	int (*copy)(void *, const void *, size_t, int, void *) = dlsym(rt, "cudaMemcpyAsync");
	int (*stream_sync)(void *) = dlsym(rt, "cudaStreamSynchronize");
	int (*event_create)(void **, unsigned) = dlsym(rt, "cudaEventCreateWithFlags");
	int (*event_record)(void *, void *) = dlsym(rt, "cudaEventRecord");
	int (*stream_wait)(void *, void *, unsigned) = dlsym(rt, "cudaStreamWaitEvent");
	if (!set_device || !host_alloc || !dev_alloc || !stream_create || !copy || !stream_sync || !event_create || !event_record || !stream_wait)
		return fprintf(stderr, "h2dshare: a runtime entry point is missing\n"), 1;
	void *host, *dev, *s[maxStreams], *ev[maxStreams];
	if (set_device(0) || host_alloc(&host, bytes, portableMapped) || dev_alloc(&dev, bytes))
		return fprintf(stderr, "h2dshare: no device memory\n"), 1;
	memset(host, 1, bytes);
	for (int i = 0; i < k; i++)
		if (stream_create(&s[i], nonBlocking) || event_create(&ev[i], disableTiming)) return 1;
	if (copy(dev, host, bytes, hostToDevice, s[0]) || stream_sync(s[0])) return 1;
	__sync_fetch_and_add(&sh->ready, 1);
	while (__atomic_load_n(&sh->ready, __ATOMIC_ACQUIRE) < procs)
		;
	double *t = malloc(sizeof(double) * iters), start = now_us();
	size_t per = (bytes + k - 1) / k;
	for (int it = 0; it < iters; it++) {
		double a = now_us();
		// The chunks' streams start after stream 0's point and stream 0
		// waits for them, as a split upload inside one solve would.
		if (k > 1) {
			event_record(ev[0], s[0]);
			for (int i = 1; i < k; i++) stream_wait(s[i], ev[0], 0);
		}
		for (int i = 0; i < k; i++) {
			size_t off = i * per, n = off + per > bytes ? bytes - off : per;
			if (copy((char *)dev + off, (char *)host + off, n, hostToDevice, s[i])) return 1;
		}
		for (int i = 1; i < k; i++) {
			event_record(ev[i], s[i]);
			stream_wait(s[0], ev[i], 0);
		}
		if (stream_sync(s[0])) return 1;
		t[it] = now_us() - a;
	}
	sh->wall_us[me] = now_us() - start;
	qsort(t, iters, sizeof(double), by_value);
	sh->median_us[me] = t[iters / 2];
	return 0;
}

int main(int argc, char **argv) {
	if (argc < 3) return fprintf(stderr, "usage: h2dshare N K [BYTES [ITERATIONS]]\n"), 2;
	int procs = atoi(argv[1]), k = atoi(argv[2]);
	size_t bytes = argc > 3 ? strtoull(argv[3], NULL, 10) : 1183232;
	int iters = argc > 4 ? atoi(argv[4]) : 300;
	if (procs < 1 || procs > maxProcs || k < 1 || k > maxStreams || bytes < (size_t)k || iters < 1)
		return fprintf(stderr, "h2dshare: N in [1, %d], K in [1, %d], BYTES >= K, ITERATIONS >= 1\n", maxProcs, maxStreams), 2;
	struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) return perror("h2dshare: mmap"), 1;
	memset(sh, 0, sizeof *sh);
	for (int p = 0; p < procs; p++)
		if (fork() == 0) {
			int rc = upload(sh, p, procs, k, bytes, iters);
			if (rc) {
				__sync_fetch_and_add(&sh->failed, 1);
				__sync_fetch_and_add(&sh->ready, procs); // release the others
			}
			_exit(rc);
		}
	for (int p = 0; p < procs; p++) wait(NULL);
	if (sh->failed) return fprintf(stderr, "h2dshare: %d process(es) failed\n", sh->failed), 1;
	double median = 0, wall = 0;
	for (int p = 0; p < procs; p++) {
		median += sh->median_us[p] / procs;
		if (sh->wall_us[p] > wall) wall = sh->wall_us[p];
	}
	printf("N=%d K=%d B=%zu: per-rank median upload %.1f us, aggregate %.1f GB/s\n", procs, k, bytes, median,
	       (double)procs * bytes * iters / wall / 1e3);
	return 0;
}
