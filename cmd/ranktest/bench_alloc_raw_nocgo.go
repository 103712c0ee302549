//go:build !cgo

package main

import "errors"

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
