package peermem

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"unsafe"
)

// ErrUnavailable matches a read that this system or architecture cannot
// make at all.
var ErrUnavailable = errors.New("peermem: process_vm_readv unavailable")

// Probe is a word of this process's memory, holding a value only this
// process knows, that a peer reads back before it trusts its reads of this
// process (CheckProbe): a wrong process id, another PID namespace or a
// refused read all show there, before any message is read that way.
type Probe struct {
	word uint64
	pin  runtime.Pinner // the word's address goes out as a number: it must not move
}

// NewProbe makes a probe with a fresh non-zero value.
func NewProbe() *Probe {
	p := &Probe{word: rand.Uint64() | 1}
	p.pin.Pin(&p.word)
	return p
}

// Addr is where the probe's word lies in this process.
func (p *Probe) Addr() uintptr { return uintptr(unsafe.Pointer(&p.word)) }

// Value is what the word holds.
func (p *Probe) Value() uint64 { return p.word }

// Close lets the word go; no peer may read it afterwards.
func (p *Probe) Close() { p.pin.Unpin() }

// CheckProbe reads the 8-byte word at addr in process pid and reports
// whether it holds want: nil when it does, else why not.
func CheckProbe(pid int, addr uintptr, want uint64) error {
	if pid <= 0 {
		return fmt.Errorf("peermem: process %d: %w", pid, errBadPID)
	}
	var got uint64
	if err := Read(pid, unsafe.Pointer(&got), addr, 8); err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("process %d holds another value there: not the process that made the probe (another PID namespace?)", pid)
	}
	return nil
}

var errBadPID = errors.New("no such process id")
