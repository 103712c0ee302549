//go:build cgo

package allocbench

/*
#cgo CFLAGS: -I${SRCDIR}/../../internal/cudart
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include "cudart_decl.h"

// The alloc benchmark's cycle and alloc+free pair written in plain C, as a C
// program makes them: through the function table of the libcudart that
// distbuf's loader opened, with no Go in between (one cgo call runs a whole
// cycle or a batch of pairs). Each returns 0, or the first failing call's
// cudaError_t with the entry point's index in *failed; calls[] counts the
// calls made, by entry point (the indices of cudart_decl.h).

#define CB_CALL(name, args) (calls[DBC_I_##name]++, a->name args)

static int64_t cb_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cb_fail(dbc_api *a, uint64_t *calls, int e, int op, int *failed) {
	if (e != DBC_SUCCESS && *failed < 0) {
		*failed = op;
		(void)CB_CALL(cudaGetLastError, ());
	}
	return e;
}

// cb_cycle allocates every size from the pool on s, sets the first touch[i]
// bytes of buffer i and frees it, buffer by buffer, and synchronises s once:
// devalloc's solve cycle, call for call. phase_ns gets the time of its three
// phases as devalloc's cycle clocks them: allocating (cudaSetDevice
// included), touching and freeing, synchronising.
static int cb_cycle(dbc_api *a, int dev, uintptr_t pool, uintptr_t s, const int64_t *sizes, const int64_t *touch,
                    int n, int val, void **ptrs, uint64_t *calls, int64_t *phase_ns, int *failed) {
	int e, f, i, k;
	int64_t t0 = cb_now(), t1, t2;
	*failed = -1;
	e = cb_fail(a, calls, CB_CALL(cudaSetDevice, (dev)), DBC_I_cudaSetDevice, failed);
	if (e) return e;
	for (i = 0; i < n; i++) {
		e = cb_fail(a, calls, CB_CALL(cudaMallocFromPoolAsync, (&ptrs[i], (size_t)sizes[i], (void *)pool, (void *)s)),
		            DBC_I_cudaMallocFromPoolAsync, failed);
		if (e) break;
	}
	t1 = cb_now();
	for (k = 0; k < i; k++) {
		if (e == 0) e = cb_fail(a, calls, CB_CALL(cudaMemsetAsync, (ptrs[k], val, (size_t)touch[k], (void *)s)), DBC_I_cudaMemsetAsync, failed);
		f = cb_fail(a, calls, CB_CALL(cudaFreeAsync, (ptrs[k], (void *)s)), DBC_I_cudaFreeAsync, failed);
		if (e == 0) e = f;
	}
	t2 = cb_now();
	f = cb_fail(a, calls, CB_CALL(cudaStreamSynchronize, ((void *)s)), DBC_I_cudaStreamSynchronize, failed);
	phase_ns[0] = t1 - t0;
	phase_ns[1] = t2 - t1;
	phase_ns[2] = cb_now() - t2;
	return e ? e : f;
}

// cb_pairs makes n pairs of an allocation of size bytes from the pool on s
// and its free. With sync, a synchronisation of s ends each pair and each
// pair's time goes to ns[i]; without, the n pairs are timed together into
// ns[0] and s is synchronised after them, untimed.
static int cb_pairs(dbc_api *a, int dev, uintptr_t pool, uintptr_t s, int64_t size, int n, int sync,
                    int64_t *ns, uint64_t *calls, int *failed) {
	int e, i;
	void *p = NULL;
	int64_t t0 = 0;
	*failed = -1;
	e = cb_fail(a, calls, CB_CALL(cudaSetDevice, (dev)), DBC_I_cudaSetDevice, failed);
	if (e) return e;
	if (!sync) t0 = cb_now();
	for (i = 0; i < n; i++) {
		if (sync) t0 = cb_now();
		e = cb_fail(a, calls, CB_CALL(cudaMallocFromPoolAsync, (&p, (size_t)size, (void *)pool, (void *)s)), DBC_I_cudaMallocFromPoolAsync, failed);
		if (e) return e;
		e = cb_fail(a, calls, CB_CALL(cudaFreeAsync, (p, (void *)s)), DBC_I_cudaFreeAsync, failed);
		if (e) return e;
		if (sync) {
			e = cb_fail(a, calls, CB_CALL(cudaStreamSynchronize, ((void *)s)), DBC_I_cudaStreamSynchronize, failed);
			if (e) return e;
			ns[i] = cb_now() - t0;
		}
	}
	if (!sync) {
		ns[0] = cb_now() - t0;
		e = cb_fail(a, calls, CB_CALL(cudaStreamSynchronize, ((void *)s)), DBC_I_cudaStreamSynchronize, failed);
	}
	return e;
}

static const char *cb_symbol(int i) { return dbc_symbols[i].name; }
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf/internal/cudart"
)

// cPool runs the C baseline on a private pool retained at threshold
// UINT64_MAX, with a stream of its own: the configuration of devalloc's
// retained pool.
type cPool struct {
	dev     *cudart.Device
	table   *C.dbc_api
	s       cudart.Stream
	pool    cudart.MemPool
	ptrs    unsafe.Pointer // C scratch for a cycle's pointers
	ptrsCap int
}

func openCPool(device int) (*cPool, error) {
	r, err := openRawPool(device, true)
	if err != nil {
		return nil, err
	}
	rt, err := cudart.Load()
	if err != nil {
		return nil, errors.Join(err, r.close())
	}
	return &cPool{dev: r.dev, table: (*C.dbc_api)(rt.Table()), s: r.s, pool: r.pool}, nil
}

func (c *cPool) close() error {
	C.free(c.ptrs)
	c.ptrs = nil
	return (&rawPool{dev: c.dev, s: c.s, pool: c.pool}).close()
}

// counts turns the C side's counters into counts by entry point.
func cCounts(raw *[C.DBC_I_COUNT]C.uint64_t) cudart.Counts {
	out := cudart.Counts{}
	for i, n := range raw {
		if n != 0 {
			out[C.GoString(C.cb_symbol(C.int(i)))] = uint64(n)
		}
	}
	return out
}

func (c *cPool) fail(what string, code C.int, failed C.int) error {
	op := "?"
	if failed >= 0 {
		op = C.GoString(C.cb_symbol(failed))
	}
	return fmt.Errorf("allocbench: the C baseline %s: %s failed with cudaError_t %d", what, op, int(code))
}

// cCyclePhases is where a C cycle's time went, in microseconds: the
// phases devalloc's cycle reports as alloc, touch and sync.
type cCyclePhases struct{ alloc, touch, sync float64 }

// cycle runs one cycle of the C baseline and returns its time in
// microseconds, its phases and its calls.
func (c *cPool) cycle(sizes, touch []int64, val byte) (float64, cCyclePhases, cudart.Counts, error) {
	n := len(sizes)
	if n == 0 || len(touch) != n {
		return 0, cCyclePhases{}, nil, fmt.Errorf("allocbench: the C baseline cycle: %d sizes and %d touches", n, len(touch))
	}
	if n > c.ptrsCap {
		C.free(c.ptrs)
		if c.ptrs = C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0)))); c.ptrs == nil {
			c.ptrsCap = 0
			return 0, cCyclePhases{}, nil, errors.New("allocbench: the C baseline cycle: out of host memory")
		}
		c.ptrsCap = n
	}
	var calls [C.DBC_I_COUNT]C.uint64_t
	var phaseNS [3]C.int64_t
	var failed C.int
	start := time.Now()
	code := C.cb_cycle(c.table, C.int(c.dev.Ordinal()), C.uintptr_t(c.pool), C.uintptr_t(c.s),
		(*C.int64_t)(unsafe.Pointer(&sizes[0])), (*C.int64_t)(unsafe.Pointer(&touch[0])), C.int(n), C.int(val),
		(*unsafe.Pointer)(c.ptrs), &calls[0], &phaseNS[0], &failed)
	t := us(time.Since(start))
	if code != 0 {
		return 0, cCyclePhases{}, nil, c.fail("cycle", code, failed)
	}
	ph := cCyclePhases{alloc: float64(phaseNS[0]) / 1e3, touch: float64(phaseNS[1]) / 1e3, sync: float64(phaseNS[2]) / 1e3}
	return t, ph, cCounts(&calls), nil
}

// pairs runs n alloc+free pairs of size bytes in C. With sync it returns
// each pair's time (a synchronisation ends each); without, one time per
// pair, the batch's mean.
func (c *cPool) pairs(size int64, n int, sync bool) ([]float64, cudart.Counts, error) {
	ns := make([]int64, max(n, 1))
	var calls [C.DBC_I_COUNT]C.uint64_t
	var failed C.int
	s := C.int(0)
	if sync {
		s = 1
	}
	code := C.cb_pairs(c.table, C.int(c.dev.Ordinal()), C.uintptr_t(c.pool), C.uintptr_t(c.s), C.int64_t(size), C.int(n), s,
		(*C.int64_t)(unsafe.Pointer(&ns[0])), &calls[0], &failed)
	if code != 0 {
		return nil, nil, c.fail("pairs", code, failed)
	}
	if !sync {
		return []float64{float64(ns[0]) / 1e3 / float64(n)}, cCounts(&calls), nil
	}
	out := make([]float64, n)
	for i, v := range ns {
		out[i] = float64(v) / 1e3
	}
	return out, cCounts(&calls), nil
}
