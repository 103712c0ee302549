//go:build !cgo

package allocbench

import (
	"errors"

	"github.com/distbuf/distbuf/internal/cudart"
)

type rawCUDA struct{}

func openRawCUDA(int) (*rawCUDA, error) {
	return nil, errors.New("the raw cudaMalloc baseline needs cgo")
}

func (r *rawCUDA) close() error                     { return nil }
func (r *rawCUDA) pair(int64) (float64, error)      { return 0, nil }
func (r *rawCUDA) cycle([]int64, byte, int64) error { return nil }

type rawPool struct{}

func openRawPool(int, bool) (*rawPool, error) {
	return nil, errors.New("the raw pool baseline needs cgo")
}

func (r *rawPool) close() error                     { return nil }
func (r *rawPool) cycle([]int64, byte, int64) error { return nil }

type cPool struct{}

func openCPool(int) (*cPool, error) {
	return nil, errors.New("the C baseline needs cgo")
}

func (c *cPool) close() error { return nil }
func (c *cPool) cycle([]int64, []int64, byte) (float64, cCyclePhases, cudart.Counts, error) {
	return 0, cCyclePhases{}, nil, nil
}

type cCyclePhases struct{ alloc, touch, sync float64 }

func (c *cPool) pairs(int64, int, bool) ([]float64, cudart.Counts, error) { return nil, nil, nil }
