//go:build !cgo

package cublas

import "fmt"

var errNoCgo = fmt.Errorf("%w: built without cgo", ErrUnavailable)

// Lib is unavailable without cgo.
type Lib struct{}

// Handle is unavailable without cgo.
type Handle struct{}

// Load always fails without cgo.
func Load() (*Lib, error) { return nil, errNoCgo }

func (l *Lib) Library() string                               { return "" }
func (l *Lib) HasGrouped() bool                              { return false }
func (l *Lib) NewHandle(int, uintptr, bool) (*Handle, error) { return nil, errNoCgo }
func (h *Handle) Destroy() error                             { return errNoCgo }
func (h *Handle) Gemm(DType, Op, Op, int, int, int, complex128, uintptr, int, uintptr, int, complex128, uintptr, int) error {
	return errNoCgo
}
func (h *Handle) GemmStrided(DType, Op, Op, int, int, int, complex128, uintptr, int, int64, uintptr, int, int64, complex128, uintptr, int, int64, int) error {
	return errNoCgo
}
func (h *Handle) GemmBatched(DType, Op, Op, int, int, int, complex128, uintptr, int, uintptr, int, complex128, uintptr, int, int) error {
	return errNoCgo
}
func (h *Handle) GemmGrouped(DType, []Group, uintptr, uintptr, uintptr) error { return errNoCgo }
