package devalloc

import (
	"unsafe"
)

// backendKind is the allocator a backend runs: Info reports it as a
// Backend and, on CUDA, whether the pool is in use.
type backendKind int

const (
	kindHost       backendKind = iota + 1 // host memory (no GPU)
	kindCUDAPool                          // CUDA stream-ordered pool: cudaMallocFromPoolAsync on a private cudaMemPool
	kindCUDAMalloc                        // CUDA fallback: cudaMalloc/cudaFree with stream order kept by the ledger
)

func (k backendKind) String() string {
	switch k {
	case kindHost:
		return "host"
	case kindCUDAPool:
		return "cuda-pool"
	case kindCUDAMalloc:
		return "cuda-malloc"
	}
	return "unknown"
}

// Location says where a buffer's memory lives.
type Location int

const (
	OnHost   Location = iota + 1 // host-backend memory: ordinary, off the Go heap
	OnDevice                     // GPU memory: not addressable from Go
	Pinned                       // page-locked host memory for staging
)

func (l Location) String() string {
	switch l {
	case OnHost:
		return "host"
	case OnDevice:
		return "device"
	case Pinned:
		return "pinned"
	}
	return "unknown"
}

// HostAccessible reports whether Go code may read and write the memory.
func (l Location) HostAccessible() bool { return l == OnHost || l == Pinned }

// memRef is a byte address inside a buffer: addr always, host when Go may
// address it.
type memRef struct {
	addr uintptr
	host unsafe.Pointer
}

// poolUsage is what the backend's pool reports about itself.
type poolUsage struct {
	reservedCur, reservedHigh, reservedTotal int64
	usedCur, usedHigh                        int64
	reuseKept, reuseHits                     int64
}

// backend is one memory and execution backend. The Allocator owns it and
// serialises nothing: implementations are safe for concurrent use.
type backend interface {
	kind() backendKind
	describe() string
	// memInfo reports free and total memory of the device (or host); -1 if unknown.
	memInfo() (free, total int64)

	newStream() (streamImpl, error)

	// alloc returns size bytes (a multiple of allocAlign) usable in the order
	// of s. hostPtr is non-nil when Go may address the memory. An out-of-memory
	// failure matches distbuf.ErrOutOfMemory so the ladder can retry it.
	alloc(size int64, s streamImpl) (addr uintptr, hostPtr unsafe.Pointer, err error)
	// freeAsync releases memory in the order of the reclamation stream r,
	// which has already been made to wait on every completion of the buffer.
	// It never blocks the host.
	freeAsync(addr uintptr, size int64, r streamImpl) error

	// copyAsync and memsetAsync enqueue on s; the ledger has already ordered s.
	copyAsync(dst, src memRef, n int64, s streamImpl) error
	memsetAsync(dst memRef, val byte, n int64, s streamImpl) error

	// allocPinned and freePinned manage page-locked host memory; they are slow
	// and called only by the pinned staging pool.
	allocPinned(size int64) (unsafe.Pointer, error)
	freePinned(p unsafe.Pointer, size int64) error

	setReleaseThreshold(bytes uint64) error
	// prime reserves bytes in the pool using stream s and returns once reserved.
	prime(bytes int64, s streamImpl) error
	// trim releases unused pool memory until at most keep bytes stay reserved.
	trim(keep int64) error
	// reserved is the pool's reservation now, read without sampling the
	// statistics: one pool query at most.
	reserved() int64
	// releaseUnused gives back the unused memory whose frees have run,
	// without waiting for any stream and leaving kept blocks alone: the
	// cheap trim Auto makes when an allocation grew a pool that had memory
	// to spare.
	releaseUnused() error
	// syncPoint runs after the allocator's streams were synchronised; a backend
	// that models release-at-sync does it here.
	syncPoint()
	usage() poolUsage
	resetHigh()
	close() error
}

// streamImpl is a backend's in-order work queue.
type streamImpl interface {
	handle() uintptr
	record() (eventImpl, error)
	wait(e eventImpl) error
	// waitHost orders later work after ch is closed by a host agent.
	waitHost(ch <-chan struct{}) error
	// abandonHostWaits makes waits for host agents, present and future,
	// give up; each one abandoned fails the stream's next synchronize with
	// errHoldAbandoned. Close calls it first.
	abandonHostWaits()
	enqueue(fn func() error) error
	synchronize() error
	// hostFunctionsSeen makes what the stream's Enqueue functions wrote
	// visible to Go's memory model in the caller, once an event recorded
	// after them has completed: the driver orders the two, Go cannot see
	// that order by itself.
	hostFunctionsSeen()
	destroy() error
}

// eventImpl marks a point in a stream.
type eventImpl interface {
	query() (bool, error)
	synchronize() error
	destroy() error
}

// allocAlign is the granularity of every allocation and of the budget.
const allocAlign = 256

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// openCUDA is set by the CUDA backend when it is compiled in.
var openCUDA func(device int, cfg Config) (backend, error)
