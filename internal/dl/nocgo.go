//go:build !cgo

package dl

import "unsafe"

// Library is an open shared library (unavailable without cgo).
type Library struct{ Name string }

// Open always fails without cgo.
func Open(envOverride string, candidates ...string) (*Library, error) { return nil, ErrNoCgo }

// Sym always fails without cgo.
func (l *Library) Sym(name string) (unsafe.Pointer, error) { return nil, ErrNoCgo }

// Bind always fails without cgo.
func (l *Library) Bind(table []Symbol) ([]string, error) { return nil, ErrNoCgo }

// Close does nothing without cgo.
func (l *Library) Close() error { return nil }
