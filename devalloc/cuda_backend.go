//go:build cgo

package devalloc

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/bytesize"
	"github.com/distbuf/distbuf/internal/cudart"
)

func init() {
	openCUDA = openCUDABackend
	cudaDeviceCount = countCUDADevices
	cudaDriverCalls = func() map[string]uint64 { return cudart.Calls() }
}

// cudaError carries a CUDA failure and matches the distbuf sentinel of the
// same meaning: out of memory, unavailable (a missing device or library, or
// a call the runtime does not support), invalid.
type cudaError struct {
	op  string
	err error
}

func (e *cudaError) Error() string { return "cuda: " + e.op + ": " + e.err.Error() }
func (e *cudaError) Unwrap() error { return e.err }

func (e *cudaError) Is(target error) bool {
	switch target {
	case distbuf.ErrOutOfMemory:
		return errors.Is(e.err, cudart.ErrOutOfMemory)
	case distbuf.ErrUnavailable:
		return errors.Is(e.err, cudart.ErrUnavailable) || errors.Is(e.err, cudart.ErrNotSupported)
	case distbuf.ErrInvalid:
		return errors.Is(e.err, cudart.ErrInvalid)
	}
	return false
}

func wrapCUDA(op string, err error) error {
	if err == nil {
		return nil
	}
	return &cudaError{op: op, err: err}
}

var errCUDAClosed = fmt.Errorf("cuda backend: %w", distbuf.ErrClosed)

func countCUDADevices() (int, error) {
	rt, err := cudart.Load()
	if err != nil {
		return 0, wrapCUDA("load the runtime", err)
	}
	n, err := rt.DeviceCount()
	if err != nil {
		return 0, wrapCUDA("count devices", err)
	}
	return n, nil
}

type hostWaitMode int

const (
	hostWaitMemop    hostWaitMode = iota + 1 // cuStreamWaitValue32 on mapped pinned words
	hostWaitCallback                         // blocking cudaLaunchHostFunc
)

func (m hostWaitMode) String() string {
	if m == hostWaitMemop {
		return "stream memory operations"
	}
	return "blocking host callbacks"
}

// cudaBackend runs one allocator on one device: a private stream-ordered
// pool, or the cudaMalloc fallback when pools are unsupported or turned off.
type cudaBackend struct {
	rt       *cudart.Runtime
	dev      *cudart.Device
	ordinal  int
	kindV    backendKind
	hostWait hostWaitMode
	info     string // describe()

	pool      cudart.MemPool // kindCUDAPool
	fb        *mallocCache   // kindCUDAMalloc
	threshold atomic.Uint64

	events eventPool
	words  wordSlab

	closed atomic.Bool
	final  poolUsage // usage at close, under statsMu
	// reuse keeps freed blocks for the next allocation of their size on
	// their stream (the pool under Retain; nil on the fallback).
	reuse *streamReuse

	statsMu       sync.Mutex
	lastReserved  int64
	reservedTotal int64
	reservedPeak  int64
}

func openCUDABackend(device int, cfg Config) (backend, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, wrapCUDA("load the runtime", err)
	}
	n, err := rt.DeviceCount()
	if err != nil {
		return nil, wrapCUDA("count devices", err)
	}
	if device >= n {
		return nil, fmt.Errorf("cuda: device %d not present (%d device(s)): %w", device, n, distbuf.ErrUnavailable)
	}
	d := rt.Device(device)
	// The first call on the device creates its context: driver problems
	// surface here rather than at the first allocation.
	_, total, err := d.MemGetInfo()
	if err != nil {
		return nil, wrapCUDA(fmt.Sprintf("initialise device %d", device), err)
	}
	be := &cudaBackend{rt: rt, dev: d, ordinal: device}
	be.events.dev = d
	be.words.dev = d
	be.threshold.Store(math.MaxUint64)
	if be.hostWait, err = chooseHostWait(d); err != nil {
		return nil, err
	}

	caps := rt.Capabilities()
	pools, _ := d.Attribute(cudart.AttrMemoryPoolsSupported)
	noPool := ""
	switch {
	case cfg.NoPool || cudaTestPoolOff:
		noPool = "pool:off"
	case !caps.MemoryPools:
		noPool = "the runtime lacks the stream-ordered pool functions"
	case pools != 1:
		noPool = "the device does not support memory pools"
	}
	var mode string
	if noPool == "" {
		if be.pool, err = d.MemPoolCreate(); err != nil {
			return nil, wrapCUDA("create the memory pool", err)
		}
		// A pool may otherwise make an allocation on one stream wait for a
		// free still pending on another (the reclamation stream, which may be
		// waiting for an outside agent): an allocation must never block on
		// work it does not depend on. Reuse after completed frees
		// (opportunistic) and along real event dependencies stays on.
		if err := d.MemPoolSetInt(be.pool, cudart.PoolReuseAllowInternalDependencies, 0); err != nil {
			_ = d.MemPoolDestroy(be.pool)
			return nil, wrapCUDA("configure the memory pool", err)
		}
		be.kindV = kindCUDAPool
		limit := cfg.Cache
		if limit == 0 {
			limit = defaultCache
		}
		be.reuse = newStreamReuse(limit, func(addr uintptr, s *cudaStream) error {
			return wrapCUDA("free to the pool", be.dev.FreeAsync(addr, s.h))
		})
		be.reuse.mark = func(s *cudaStream) (cudart.Event, error) {
			ev, err := be.events.get()
			if err != nil {
				return 0, err
			}
			if err := be.dev.EventRecord(ev, s.h); err != nil {
				be.events.put(ev)
				return 0, wrapCUDA("record an event", err)
			}
			return ev, nil
		}
		be.reuse.reached = func(ev cudart.Event) bool {
			done, err := be.dev.EventQuery(ev)
			return err == nil && done
		}
		be.reuse.recycle = be.events.put
		mode = "private stream-ordered pool"
		if be.reuse.limit > 0 {
			mode += fmt.Sprintf(" (reuse of freed blocks up to %s)", bytesize.Format(be.reuse.limit))
		}
	} else {
		be.fb = newMallocCache(d, &be.events, cfg.Cache)
		be.kindV = kindCUDAMalloc
		cache := "no cache"
		if be.fb.limit > 0 {
			cache = bytesize.Format(be.fb.limit) + " cache"
		}
		mode = fmt.Sprintf("cudaMalloc fallback (%s; %s)", noPool, cache)
	}

	name, err := d.Name()
	if err != nil {
		name = "unnamed"
	}
	major, _ := d.Attribute(cudart.AttrComputeCapabilityMajor)
	minor, _ := d.Attribute(cudart.AttrComputeCapabilityMinor)
	be.info = fmt.Sprintf("CUDA device %d (%s, sm_%d%d, %s): %s, host waits by %s; %s (runtime %s, driver %s)",
		device, name, major, minor, bytesize.Format(total), mode, be.hostWait,
		rt.Path(), cudart.FormatVersion(rt.RuntimeVersion()), cudart.FormatVersion(rt.DriverVersion()))
	return be, nil
}

func chooseHostWait(d *cudart.Device) (hostWaitMode, error) {
	mapped, _ := d.Attribute(cudart.AttrCanMapHostMemory)
	canMemop := d.Runtime().Capabilities().StreamWaitValue && mapped == 1
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(envCUDAHostWait))); v {
	case "", "auto":
		if canMemop {
			return hostWaitMemop, nil
		}
		return hostWaitCallback, nil
	case "memop":
		if !canMemop {
			return 0, &configError{source: envCUDAHostWait, key: "hostwait", value: v,
				reason: "cuStreamWaitValue32 or mapped pinned memory is not available on this device"}
		}
		return hostWaitMemop, nil
	case "callback":
		return hostWaitCallback, nil
	default:
		return 0, &configError{source: envCUDAHostWait, key: "hostwait", value: v, reason: "want auto, memop or callback"}
	}
}

func (be *cudaBackend) kind() backendKind { return be.kindV }
func (be *cudaBackend) describe() string  { return be.info }

func (be *cudaBackend) memInfo() (free, total int64) {
	f, t, err := be.dev.MemGetInfo()
	if err != nil {
		return -1, -1
	}
	return f, t
}

func (be *cudaBackend) stream(s streamImpl) (*cudaStream, error) {
	cs, ok := s.(*cudaStream)
	if !ok || cs.be != be {
		return nil, fmt.Errorf("cuda backend: stream of another backend: %w", distbuf.ErrInvalid)
	}
	return cs, nil
}

func (be *cudaBackend) alloc(size int64, s streamImpl) (uintptr, unsafe.Pointer, error) {
	if be.closed.Load() {
		return 0, nil, errCUDAClosed
	}
	cs, err := be.stream(s)
	if err != nil {
		return 0, nil, err
	}
	if be.fb != nil {
		addr, err := be.fb.alloc(size, cs)
		return addr, nil, err
	}
	var addr uintptr
	err = cs.use(func() error {
		if a, ok := be.reuse.take(cs, size); ok {
			addr = a
			return nil
		}
		var err error
		addr, err = be.dev.MallocFromPoolAsync(size, be.pool, cs.h)
		err = wrapCUDA("allocate from the pool", err)
		if errors.Is(err, distbuf.ErrOutOfMemory) {
			// The ladder synchronises and retries next: the kept blocks
			// are free memory by then.
			err = errors.Join(err, be.reuse.drain(nil))
		}
		return err
	})
	return addr, nil, err
}

func (be *cudaBackend) freeAsync(addr uintptr, size int64, r streamImpl) error {
	if be.closed.Load() {
		return errCUDAClosed
	}
	cs, err := be.stream(r)
	if err != nil {
		return err
	}
	if be.fb != nil {
		return be.fb.free(addr, cs)
	}
	return cs.use(func() error {
		if kept, err := be.reuse.put(cs, size, addr); kept {
			return err
		}
		return wrapCUDA("free to the pool", be.dev.FreeAsync(addr, cs.h))
	})
}

func (be *cudaBackend) copyAsync(dst, src memRef, n int64, s streamImpl) error {
	if n == 0 {
		return nil
	}
	cs, err := be.stream(s)
	if err != nil {
		return err
	}
	if dst.host != nil && src.host != nil {
		// The runtime performs host-to-host copies synchronously with the
		// calling thread, after the stream drains: a stream waiting for an
		// outside agent would block the caller. A host operation keeps it
		// in stream order without blocking.
		return cs.enqueue(func() error {
			copy(unsafe.Slice((*byte)(dst.host), n), unsafe.Slice((*byte)(src.host), n))
			return nil
		})
	}
	return cs.use(func() error { return wrapCUDA("copy", be.dev.MemcpyAsync(dst.addr, src.addr, n, cs.h)) })
}

func (be *cudaBackend) memsetAsync(dst memRef, val byte, n int64, s streamImpl) error {
	if n == 0 {
		return nil
	}
	cs, err := be.stream(s)
	if err != nil {
		return err
	}
	return cs.use(func() error { return wrapCUDA("memset", be.dev.MemsetAsync(dst.addr, val, n, cs.h)) })
}

// allocPinned returns portable (usable with every device) and mapped
// (addressable by the device, so memset and copies work on it) memory.
func (be *cudaBackend) allocPinned(size int64) (unsafe.Pointer, error) {
	if be.closed.Load() {
		return nil, errCUDAClosed
	}
	p, err := be.dev.HostAlloc(size, cudart.HostAllocPortable|cudart.HostAllocMapped)
	return p, wrapCUDA("allocate pinned memory", err)
}

func (be *cudaBackend) freePinned(p unsafe.Pointer, _ int64) error {
	return wrapCUDA("free pinned memory", be.dev.FreeHost(p))
}

// setReleaseThreshold sets the pool's cudaMemPoolAttrReleaseThreshold: the
// driver keeps up to that many unused bytes reserved at each
// synchronisation and returns the rest.
func (be *cudaBackend) setReleaseThreshold(bytes uint64) error {
	if be.closed.Load() {
		return errCUDAClosed
	}
	be.threshold.Store(bytes)
	if be.fb != nil {
		be.fb.setThreshold(bytes)
		return nil
	}
	// Blocks are kept for reuse under Retain only: a lower threshold asks
	// for memory back, which kept blocks would withhold.
	retain := bytes == math.MaxUint64
	be.reuse.setOn(retain)
	var err error
	if !retain {
		err = be.reuse.drain(nil)
	}
	return errors.Join(err, wrapCUDA("set the release threshold", be.dev.MemPoolSetUint64(be.pool, cudart.PoolAttrReleaseThreshold, bytes)))
}

// prime allocates bytes from the pool on s, frees them on s and waits for
// s: the memory stays reserved as long as the release threshold allows.
func (be *cudaBackend) prime(bytes int64, s streamImpl) error {
	if be.closed.Load() {
		return errCUDAClosed
	}
	if be.fb != nil {
		return be.fb.prime(bytes)
	}
	cs, err := be.stream(s)
	if err != nil {
		return err
	}
	err = cs.use(func() error {
		p, err := be.dev.MallocFromPoolAsync(bytes, be.pool, cs.h)
		if err != nil {
			return wrapCUDA("prime: allocate", err)
		}
		if err := be.dev.FreeAsync(p, cs.h); err != nil {
			return wrapCUDA("prime: free", err)
		}
		return wrapCUDA("prime: synchronize", be.dev.StreamSynchronize(cs.h))
	})
	be.sample()
	return err
}

// trim is cudaMemPoolTrimTo; memory backing live allocations is never
// released. The caller has drained pending frees.
func (be *cudaBackend) trim(keep int64) error {
	if be.closed.Load() {
		return errCUDAClosed
	}
	if be.fb != nil {
		return be.fb.trim(keep)
	}
	// The kept blocks go back first, and their streams run their frees, so
	// that the trim can release them.
	streams, err := be.reuse.drainStreams()
	for _, s := range streams {
		if serr := s.use(func() error { return wrapCUDA("synchronize", be.dev.StreamSynchronize(s.h)) }); serr != nil && !errors.Is(serr, distbuf.ErrClosed) {
			err = errors.Join(err, serr)
		}
	}
	be.sample()
	return errors.Join(err, wrapCUDA("trim the pool", be.dev.MemPoolTrimTo(be.pool, keep)))
}

func (be *cudaBackend) reserved() int64 {
	if be.closed.Load() {
		return be.final.reservedCur
	}
	if be.fb != nil {
		return be.fb.usage().reservedCur
	}
	v, err := be.dev.MemPoolGetUint64(be.pool, cudart.PoolAttrReservedMemCurrent)
	if err != nil {
		return 0
	}
	return int64(v)
}

// releaseUnused is cudaMemPoolTrimTo(0) alone: memory whose frees have not
// run yet and the blocks kept for reuse stay; the fallback gives back its
// cache (cudaFree, which synchronises the device).
func (be *cudaBackend) releaseUnused() error {
	if be.closed.Load() {
		return errCUDAClosed
	}
	if be.fb != nil {
		return be.fb.trim(0)
	}
	return wrapCUDA("trim the pool", be.dev.MemPoolTrimTo(be.pool, 0))
}

// syncPoint: the driver applies the pool's release threshold by itself at
// synchronisations. Under a low threshold the reservation may have grown
// and shrunk since the last look, so sample it now (see sample).
func (be *cudaBackend) syncPoint() {
	if be.closed.Load() {
		return
	}
	if be.fb != nil {
		be.fb.syncPoint()
		return
	}
	if be.threshold.Load() != math.MaxUint64 {
		be.sample()
	}
}

// sample folds the pool's reservation since the last sample into the
// cumulative ReservedTotal and the peak. The driver only reports the current
// reservation and a high-water mark, so ReservedTotal counts, per sampling
// interval, the growth up to that interval's high-water mark: growth and
// release repeated within one interval (between two Stats calls, trims or
// synchronisations under AggressiveFree) is counted once. The driver's mark
// is reset after each sample; ReservedPeak is kept here.
func (be *cudaBackend) sample() {
	be.statsMu.Lock()
	defer be.statsMu.Unlock()
	be.sampleLocked()
}

func (be *cudaBackend) sampleLocked() (cur int64) {
	high, err1 := be.dev.MemPoolGetUint64(be.pool, cudart.PoolAttrReservedMemHigh)
	c, err2 := be.dev.MemPoolGetUint64(be.pool, cudart.PoolAttrReservedMemCurrent)
	if err1 != nil || err2 != nil {
		return be.lastReserved
	}
	h, cur := int64(high), int64(c)
	be.reservedPeak = max(be.reservedPeak, h, cur)
	if h > be.lastReserved {
		be.reservedTotal += h - be.lastReserved
	}
	if cur > h { // grew between the two reads
		be.reservedTotal += cur - max(h, be.lastReserved)
	}
	_ = be.dev.MemPoolSetUint64(be.pool, cudart.PoolAttrReservedMemHigh, 0) // resets it to the current value
	be.lastReserved = cur
	return cur
}

func (be *cudaBackend) usage() poolUsage {
	be.statsMu.Lock()
	defer be.statsMu.Unlock()
	if be.closed.Load() {
		return be.final
	}
	return be.usageLocked()
}

func (be *cudaBackend) usageLocked() poolUsage {
	if be.fb != nil {
		return be.fb.usage()
	}
	cur := be.sampleLocked()
	used, _ := be.dev.MemPoolGetUint64(be.pool, cudart.PoolAttrUsedMemCurrent)
	usedHigh, _ := be.dev.MemPoolGetUint64(be.pool, cudart.PoolAttrUsedMemHigh)
	kept, hits := be.reuse.stats()
	return poolUsage{
		reservedCur: cur, reservedHigh: be.reservedPeak, reservedTotal: be.reservedTotal,
		usedCur: int64(used), usedHigh: max(int64(usedHigh), int64(used)),
		reuseKept: kept, reuseHits: hits,
	}
}

func (be *cudaBackend) resetHigh() {
	if be.closed.Load() {
		return
	}
	if be.fb != nil {
		be.fb.resetHigh()
		return
	}
	be.statsMu.Lock()
	defer be.statsMu.Unlock()
	be.reservedPeak = be.sampleLocked()
	_ = be.dev.MemPoolSetUint64(be.pool, cudart.PoolAttrUsedMemHigh, 0)
}

func (be *cudaBackend) newStream() (streamImpl, error) {
	if be.closed.Load() {
		return nil, errCUDAClosed
	}
	h, err := be.dev.StreamCreate()
	if err != nil {
		return nil, wrapCUDA("create a stream", err)
	}
	return newCUDAStream(be, h), nil
}

// close keeps the final usage for Stats, then releases the pool (memory of
// leaked buffers stays allocated until the process ends), the pooled events
// and the host words. The allocator has destroyed every stream already.
func (be *cudaBackend) close() error {
	be.statsMu.Lock()
	if be.closed.Load() {
		be.statsMu.Unlock()
		return nil
	}
	be.final = be.usageLocked()
	be.closed.Store(true)
	be.statsMu.Unlock()

	var errs []error
	if be.fb != nil {
		errs = append(errs, be.fb.release())
	} else {
		errs = append(errs, wrapCUDA("destroy the memory pool", be.dev.MemPoolDestroy(be.pool)))
	}
	errs = append(errs, be.events.close(), be.words.close())
	return errors.Join(errs...)
}
