package devalloc

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/bytesize"
)

// hostBackend keeps memory in host RAM and runs streams on goroutines.
type hostBackend struct {
	pool *hostPool
}

// newHostBackend makes the host backend, its pool capped by
// DISTBUF_HOST_MEMORY when set.
func newHostBackend() (*hostBackend, error) {
	capacity, err := hostMemory()
	if err != nil {
		return nil, err
	}
	h := &hostBackend{pool: newHostPool()}
	h.pool.capacity = capacity
	return h, nil
}

// hostMemory reads DISTBUF_HOST_MEMORY: the size of the host backend's
// device memory, for runs that mean to meet a device's limit on a machine
// without one; 0 (unset, or "none") for the machine's own memory.
func hostMemory() (int64, error) {
	v := strings.TrimSpace(os.Getenv(envHostMemory))
	if v == "" || strings.EqualFold(v, "none") {
		return 0, nil
	}
	n, err := bytesize.Parse(v)
	if err == nil && n <= 0 {
		err = fmt.Errorf("want a positive size, or none")
	}
	if err != nil {
		return 0, &configError{source: envHostMemory, key: "size", value: v, reason: err.Error()}
	}
	return n, nil
}

func (h *hostBackend) kind() backendKind { return kindHost }

func (h *hostBackend) describe() string { return "host memory (mmap pool, goroutine streams)" }

func (h *hostBackend) memInfo() (free, total int64) {
	if c := h.pool.capacity; c > 0 {
		return max(0, c-hostReserved.Load()), c
	}
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return -1, -1
	}
	unit := int64(si.Unit)
	if unit == 0 {
		unit = 1
	}
	return int64(si.Freeram) * unit, int64(si.Totalram) * unit
}

func (h *hostBackend) newStream() (streamImpl, error) { return newHostStream(), nil }

func (h *hostBackend) alloc(size int64, s streamImpl) (uintptr, unsafe.Pointer, error) {
	hs, _ := s.(*hostStream)
	_, ptr, err := h.pool.alloc(size, hs)
	if err != nil {
		return 0, nil, err
	}
	return uintptr(ptr), ptr, nil
}

// freeAsync frees at once when r is idle. Otherwise the free waits in r's
// order, and the memory is meanwhile reusable by allocations on r (see
// hostPool.order).
func (h *hostBackend) freeAsync(addr uintptr, _ int64, r streamImpl) error {
	hs, ok := r.(*hostStream)
	if !ok {
		return fmt.Errorf("host backend: stream of another backend: %w", distbuf.ErrInvalid)
	}
	var err error
	if hs.runNowIfIdle(func() { err = h.pool.free(addr) }) {
		return err
	}
	ticket, err := h.pool.order(addr, hs)
	if err != nil {
		return err
	}
	err = r.enqueue(func() error { return h.pool.freeOrdered(addr, ticket) })
	if errors.Is(err, distbuf.ErrClosed) {
		// A closed stream has run all its work: nothing to wait for.
		return h.pool.freeOrdered(addr, ticket)
	}
	return err
}

func (h *hostBackend) copyAsync(dst, src memRef, n int64, s streamImpl) error {
	if dst.host == nil || src.host == nil {
		return fmt.Errorf("host copy: device memory on the host backend: %w", distbuf.ErrInvalid)
	}
	return s.enqueue(func() error {
		copy(unsafe.Slice((*byte)(dst.host), n), unsafe.Slice((*byte)(src.host), n))
		return nil
	})
}

func (h *hostBackend) memsetAsync(dst memRef, val byte, n int64, s streamImpl) error {
	if dst.host == nil {
		return fmt.Errorf("host memset: device memory on the host backend: %w", distbuf.ErrInvalid)
	}
	return s.enqueue(func() error {
		b := unsafe.Slice((*byte)(dst.host), n)
		if val == 0 {
			clear(b)
			return nil
		}
		b[0] = val
		for filled := 1; filled < len(b); filled *= 2 {
			copy(b[filled:], b[:filled])
		}
		return nil
	})
}

func (h *hostBackend) allocPinned(size int64) (unsafe.Pointer, error) {
	mem, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("host pinned: mmap %s: %v: %w", bytesize.Format(size), err, distbuf.ErrOutOfMemory)
	}
	return unsafe.Pointer(&mem[0]), nil
}

func (h *hostBackend) freePinned(p unsafe.Pointer, size int64) error {
	return syscall.Munmap(unsafe.Slice((*byte)(p), size))
}

func (h *hostBackend) setReleaseThreshold(bytes uint64) error {
	h.pool.setThreshold(bytes)
	return nil
}

func (h *hostBackend) prime(bytes int64, _ streamImpl) error { return h.pool.prime(bytes) }
func (h *hostBackend) trim(keep int64) error                 { return h.pool.trim(keep) }
func (h *hostBackend) reserved() int64                       { return h.pool.usage().reservedCur }
func (h *hostBackend) releaseUnused() error                  { return h.pool.trim(0) }
func (h *hostBackend) syncPoint()                            { h.pool.syncPoint() }
func (h *hostBackend) usage() poolUsage                      { return h.pool.usage() }
func (h *hostBackend) resetHigh()                            { h.pool.resetHigh() }

func (h *hostBackend) close() error {
	h.pool.release()
	return nil
}
