package cluster

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/distbuf/distbuf"
)

// Memory is a region that MPI may hold past the call that posts a request:
// C-owned, mmap'd, CUDA or pinned Go memory, never an ordinary Go slice.
// *devalloc.Buffer implements it; so do *PinnedBytes and Sub.
//
// Region reports the address and length, and whether the address is
// device memory (accepted only by a CUDA-aware MPI). It is called once when
// a request is posted; the region must stay valid until the request
// completes, which Request.Attach arranges for devalloc buffers.
type Memory interface {
	Region() (addr uintptr, size int64, device bool, err error)
}

// Releaser is what Request.Attach releases when the request completes: a
// *devalloc.Hold, a *PinnedBytes, or anything else with that method.
type Releaser interface {
	Release() error
}

// PinnedBytes is a Go byte slice pinned with runtime.Pinner so MPI may hold
// its address until the requests using it complete. Release unpins it; a
// released PinnedBytes is no longer usable as Memory.
type PinnedBytes struct {
	mu     sync.Mutex
	b      []byte
	pinner runtime.Pinner
	live   bool
}

// PinBytes pins b (its whole backing array) and returns it as Memory. Call
// Release once every request using it has completed, or attach it to the
// last such request with Request.Attach. A PinnedBytes dropped while pinned
// is reported by the Go runtime as a leaked pin.
func PinBytes(b []byte) *PinnedBytes {
	p := &PinnedBytes{b: b, live: true}
	if cap(b) > 0 {
		p.pinner.Pin(unsafe.SliceData(b))
	}
	return p
}

// Bytes is the pinned slice.
func (p *PinnedBytes) Bytes() []byte { return p.b }

// Region implements Memory.
func (p *PinnedBytes) Region() (addr uintptr, size int64, device bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live {
		return 0, 0, false, fmt.Errorf("cluster: PinnedBytes used after Release: %w", distbuf.ErrFreed)
	}
	if len(p.b) == 0 {
		return 0, 0, false, nil
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(p.b))), int64(len(p.b)), false, nil
}

// Release unpins the slice. A second Release is an error.
func (p *PinnedBytes) Release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live {
		return fmt.Errorf("cluster: PinnedBytes released twice: %w", distbuf.ErrInvalid)
	}
	p.live = false
	p.pinner.Unpin()
	return nil
}

// Sub is the part of m from byte off, n bytes long. Bounds are checked when
// the region is used, against m's size at that time.
func Sub(m Memory, off, n int64) Memory { return subRegion{m: m, off: off, n: n} }

type subRegion struct {
	m      Memory
	off, n int64
}

func (s subRegion) Region() (uintptr, int64, bool, error) {
	if s.m == nil {
		return 0, 0, false, fmt.Errorf("cluster: Sub of nil Memory: %w", distbuf.ErrInvalid)
	}
	addr, size, dev, err := s.m.Region()
	if err != nil {
		return 0, 0, false, err
	}
	if s.off < 0 || s.n < 0 || s.off > size || s.n > size-s.off {
		return 0, 0, false, fmt.Errorf("cluster: Sub(off=%d, n=%d) outside a region of %d bytes: %w", s.off, s.n, size, distbuf.ErrInvalid)
	}
	return addr + uintptr(s.off), s.n, dev, nil
}

// region is a validated Memory region about to be handed to MPI.
type region struct {
	addr uintptr
	size int64
}

func checkMemory(m Memory, op string) (region, error) {
	if m == nil {
		return region{}, fmt.Errorf("cluster: %s: nil Memory: %w", op, distbuf.ErrInvalid)
	}
	addr, size, device, err := m.Region()
	if err != nil {
		return region{}, fmt.Errorf("cluster: %s: memory not usable by MPI: %w", op, err)
	}
	if size < 0 || (addr == 0 && size > 0) {
		return region{}, fmt.Errorf("cluster: %s: region %#x+%d is not memory MPI can use: %w", op, addr, size, distbuf.ErrInvalid)
	}
	if device {
		aware, err := CUDAAware()
		if err != nil {
			return region{}, fmt.Errorf("cluster: %s: %w", op, err)
		}
		if !aware {
			return region{}, fmt.Errorf("cluster: %s: %d bytes at device address %#x (stage through pinned host memory or set %s=1 for a CUDA-aware MPI): %w",
				op, size, addr, envCUDAAware, distbuf.ErrUnavailable)
		}
	}
	return region{addr: addr, size: size}, nil
}
