//go:build cgo

package main

import (
	"errors"
	"fmt"
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
	rt, err := cudart.Load()
	if err != nil {
		return nil, err
	}
	dev := rt.Device(device)
	s, err := dev.StreamCreate()
	if err != nil {
		return nil, err
	}
	return &rawCUDA{dev: dev, s: s}, nil
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

// cycle allocates every size, touches each with a memset, frees each, and
// synchronises once.
func (r *rawCUDA) cycle(sizes []int64, val byte) (err error) {
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
		if err := r.dev.MemsetAsync(p, val, sizes[i], r.s); err != nil {
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
