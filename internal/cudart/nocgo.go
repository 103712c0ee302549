//go:build !cgo

package cudart

import "github.com/distbuf/distbuf/internal/dl"

// Runtime is a loaded libcudart; without cgo none can be loaded.
type Runtime struct{}

// Load always fails without cgo: shared libraries cannot be opened.
func Load() (*Runtime, error) { return nil, &LoadError{Cause: dl.ErrNoCgo} }

// Calls is empty without cgo: no runtime is ever called.
func Calls() Counts { return Counts{} }
