//go:build cgo

package allocbench

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/distbuf/distbuf/internal/cudart"
)

// rawCUDA is the baseline without a pool: cudaMalloc for every buffer and a
// cudaFree for every free, as code that allocates naively does. cudaFree
// waits for the device, which is the cost the pool removes.
type rawCUDA struct {
	dev *cudart.Device
	s   cudart.Stream
}

func openRawCUDA(device int) (*rawCUDA, error) {
	dev, s, err := rawStream(device)
	if err != nil {
		return nil, err
	}
	return &rawCUDA{dev: dev, s: s}, nil
}

// rawStream is device's handle and a stream of its own on it.
func rawStream(device int) (*cudart.Device, cudart.Stream, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, 0, err
	}
	dev := rt.Device(device)
	s, err := dev.StreamCreate()
	return dev, s, err
}

func (r *rawCUDA) close() error { return r.dev.StreamDestroy(r.s) }

// pair times cudaMalloc, cudaFree and a stream synchronisation.
func (r *rawCUDA) pair(size int64) (float64, error) {
	start := time.Now()
	p, err := r.dev.Malloc(size)
	if err != nil {
		return 0, err
	}
	if err := r.dev.Free(p); err != nil {
		return 0, err
	}
	if err := r.dev.StreamSynchronize(r.s); err != nil {
		return 0, err
	}
	return us(time.Since(start)), nil
}

// cycle allocates every size, touches each with a memset (of its first
// touch bytes, or all of it for 0), frees each, and synchronises once.
func (r *rawCUDA) cycle(sizes []int64, val byte, touch int64) (err error) {
	ptrs := make([]uintptr, 0, len(sizes))
	defer func() {
		for _, p := range ptrs {
			err = errors.Join(err, r.dev.Free(p))
		}
	}()
	for _, n := range sizes {
		p, err := r.dev.Malloc(n)
		if err != nil {
			return fmt.Errorf("cudaMalloc of %d bytes: %w", n, err)
		}
		ptrs = append(ptrs, p)
	}
	for i, p := range ptrs {
		if err := r.dev.MemsetAsync(p, val, touched(sizes[i], touch), r.s); err != nil {
			return err
		}
	}
	for len(ptrs) > 0 {
		if err := r.dev.Free(ptrs[0]); err != nil {
			return err
		}
		ptrs = ptrs[1:]
	}
	return r.dev.StreamSynchronize(r.s)
}

// rawPool is the solve cycle on a private cudaMemPool called directly:
// cudaMallocFromPoolAsync, cudaMemsetAsync and cudaFreeAsync on one stream,
// no ledger, no events. It is the floor under any allocator on the pool.
type rawPool struct {
	dev  *cudart.Device
	s    cudart.Stream
	pool cudart.MemPool
}

// openRawPool makes the pool retained (release threshold UINT64_MAX) or
// releasing at every synchronisation (threshold 0, the driver's default).
func openRawPool(device int, retained bool) (*rawPool, error) {
	dev, s, err := rawStream(device)
	if err != nil {
		return nil, err
	}
	pool, err := dev.MemPoolCreate()
	if err != nil {
		return nil, errors.Join(err, dev.StreamDestroy(s))
	}
	threshold := uint64(0)
	if retained {
		threshold = math.MaxUint64
	}
	if err := dev.MemPoolSetUint64(pool, cudart.PoolAttrReleaseThreshold, threshold); err != nil {
		return nil, errors.Join(err, dev.MemPoolDestroy(pool), dev.StreamDestroy(s))
	}
	return &rawPool{dev: dev, s: s, pool: pool}, nil
}

func (r *rawPool) close() error {
	return errors.Join(r.dev.StreamSynchronize(r.s), r.dev.MemPoolDestroy(r.pool), r.dev.StreamDestroy(r.s))
}

// cycle is the devalloc cycle's sequence of calls on the pool, stream-ordered
// throughout: every allocation, then each buffer's memset followed by its
// free, then one synchronisation.
func (r *rawPool) cycle(sizes []int64, val byte, touch int64) error {
	ptrs := make([]uintptr, 0, len(sizes))
	var err error
	for _, n := range sizes {
		var p uintptr
		if p, err = r.dev.MallocFromPoolAsync(n, r.pool, r.s); err != nil {
			err = fmt.Errorf("cudaMallocFromPoolAsync of %d bytes: %w", n, err)
			break
		}
		ptrs = append(ptrs, p)
	}
	for i, p := range ptrs {
		if err == nil {
			err = r.dev.MemsetAsync(p, val, touched(sizes[i], touch), r.s)
		}
		err = errors.Join(err, r.dev.FreeAsync(p, r.s))
	}
	return errors.Join(err, r.dev.StreamSynchronize(r.s))
}
