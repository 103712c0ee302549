//go:build !linux

package peermem

import "unsafe"

// Unavailable says why this process cannot read its peers' memory:
// process_vm_readv is Linux's.
func Unavailable() string { return "process_vm_readv is Linux's" }

// AllowReaders does nothing: no process reads this one's memory.
func AllowReaders() {}

// Read fails: process_vm_readv is Linux's.
func Read(pid int, local unsafe.Pointer, remote uintptr, n int64) error { return ErrUnavailable }

// IsFault reports false: no read is ever made.
func IsFault(error) bool { return false }
