//go:build cgo

package devalloc

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"sync"

	"github.com/distbuf/distbuf/internal/cudart"
)

// mallocCache is the CUDA fallback when stream-ordered pools are
// unavailable or turned off: cudaMalloc and cudaFree, with the stream order
// kept by events and a small cache so the hot path calls neither.
//
// A freed block is not reusable until the reclamation stream has passed
// every completion the ledger recorded for it: free records an event on
// that stream, and the block stays pending until the event has completed.
// Completion is queried, never waited for. Completed blocks go to a cache
// of size classes (four per power of two, so a block is at most 25% larger
// than asked) and are handed out again for requests of their class or up to
// four classes below (less than 2x).
//
// cudaFree waits for the whole device, so it is only called where the host
// waits anyway: at synchronisation points (Stream.Synchronize, Allocator.Sync,
// the out-of-memory ladder), Trim, phase boundaries and Close. There the
// cache is cut down to its bound and blocks that did not fit are freed.
//
// The bound is Config.FallbackCache (256 MiB by default; -1 keeps no cache,
// so every free is a cudaFree and every allocation a cudaMalloc), raised to
// the bytes primed (Prime allocates with cudaMalloc and caches the block),
// and lowered to the release threshold under AggressiveFree. Trim(keep)
// frees cached blocks, largest first, until at most keep bytes stay
// reserved, and lowers the primed amount to keep.
type mallocCache struct {
	dev    *cudart.Device
	events *eventPool
	limit  int64 // -1: no cache

	mu        sync.Mutex
	threshold uint64
	primed    int64
	live      map[uintptr]int64 // allocated blocks and their class size
	pending   []pendingFree     // freed, not yet known to be complete; in free order
	cached    map[int64][]uintptr
	cachedN   int64
	toFree    []pendingFree // complete, not kept: cudaFree at the next sync point

	liveBytes, pendingBytes               int64
	reserved, reservedHigh, reservedTotal int64
	usedHigh                              int64
}

type pendingFree struct {
	addr uintptr
	size int64
	ev   cudart.Event
}

func newMallocCache(d *cudart.Device, events *eventPool, limit int64) *mallocCache {
	if limit == 0 {
		limit = defaultFallbackCache
	}
	return &mallocCache{
		dev: d, events: events, limit: limit, threshold: math.MaxUint64,
		live: make(map[uintptr]int64), cached: make(map[int64][]uintptr),
	}
}

// mallocClass rounds n up to its size class: 512 bytes, then four classes
// per power of two.
func mallocClass(n int64) int64 {
	if n <= 512 {
		return 512
	}
	e := bits.Len64(uint64(n - 1)) // n is in (2^(e-1), 2^e]
	step := int64(1) << (e - 3)
	return (n + step - 1) / step * step
}

func (c *mallocCache) capacityLocked() int64 {
	capacity := max(c.limit, c.primed, 0)
	if c.threshold < math.MaxInt64 {
		capacity = min(capacity, int64(c.threshold))
	}
	return capacity
}

func (c *mallocCache) noteUseLocked() {
	c.usedHigh = max(c.usedHigh, c.liveBytes+c.pendingBytes)
	c.reservedHigh = max(c.reservedHigh, c.reserved)
}

func (c *mallocCache) alloc(size int64) (uintptr, error) {
	class := mallocClass(size)
	c.mu.Lock()
	c.reapLocked()
	for i, cl := 0, class; i <= 4; i, cl = i+1, mallocClass(cl+1) {
		list := c.cached[cl]
		if len(list) == 0 {
			continue
		}
		addr := list[len(list)-1]
		c.cached[cl] = list[:len(list)-1]
		c.cachedN -= cl
		c.live[addr] = cl
		c.liveBytes += cl
		c.noteUseLocked()
		c.mu.Unlock()
		return addr, nil
	}
	c.mu.Unlock()
	addr, err := c.dev.Malloc(class)
	if err != nil {
		return 0, wrapCUDA("cudaMalloc", err)
	}
	c.mu.Lock()
	c.live[addr] = class
	c.liveBytes += class
	c.reserved += class
	c.reservedTotal += class
	c.noteUseLocked()
	c.mu.Unlock()
	return addr, nil
}

// free records the point of the reclamation stream r after which the block
// may be reused; the ledger has made r wait for every use of it.
func (c *mallocCache) free(addr uintptr, r *cudaStream) error {
	c.mu.Lock()
	size, ok := c.live[addr]
	if ok {
		delete(c.live, addr)
		c.liveBytes -= size
		c.pendingBytes += size
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("cuda fallback: free of unknown address %#x: %w", addr, ErrInvalid)
	}
	ev, err := r.record()
	if err != nil {
		// Without an event there is no safe moment to reuse the block: keep
		// it allocated (it shows as used) rather than risk a race.
		return fmt.Errorf("cuda fallback: free of %#x: %w", addr, err)
	}
	c.mu.Lock()
	c.pending = append(c.pending, pendingFree{addr: addr, size: size, ev: ev.(*cudaEvent).h})
	c.mu.Unlock()
	return nil
}

// reapLocked moves frees that have completed out of pending: into the cache
// while it has room, otherwise onto the list for cudaFree. Frees complete in
// order on the reclamation stream, so it stops at the first one still
// pending.
func (c *mallocCache) reapLocked() {
	capacity := max(c.limit, c.primed, 0)
	n := 0
	for _, p := range c.pending {
		done, err := c.dev.EventQuery(p.ev)
		if err != nil || !done {
			break
		}
		c.events.put(p.ev)
		c.pendingBytes -= p.size
		if c.cachedN+p.size <= capacity {
			c.cached[p.size] = append(c.cached[p.size], p.addr)
			c.cachedN += p.size
		} else {
			c.toFree = append(c.toFree, pendingFree{addr: p.addr, size: p.size})
		}
		n++
	}
	if n > 0 {
		c.pending = append(c.pending[:0], c.pending[n:]...)
	}
}

// shrinkLocked takes cached blocks, largest first, until the cache holds at
// most keepCached bytes, and returns them for freeing.
func (c *mallocCache) shrinkLocked(keepCached int64) []pendingFree {
	if c.cachedN <= keepCached {
		return nil
	}
	classes := make([]int64, 0, len(c.cached))
	for cl, list := range c.cached {
		if len(list) > 0 {
			classes = append(classes, cl)
		}
	}
	sort.Slice(classes, func(i, j int) bool { return classes[i] > classes[j] })
	var out []pendingFree
	for _, cl := range classes {
		for len(c.cached[cl]) > 0 && c.cachedN > keepCached {
			list := c.cached[cl]
			out = append(out, pendingFree{addr: list[len(list)-1], size: cl})
			c.cached[cl] = list[:len(list)-1]
			c.cachedN -= cl
		}
	}
	return out
}

// freeBlocks calls cudaFree outside the lock (it waits for the device).
func (c *mallocCache) freeBlocks(blocks []pendingFree) error {
	var errs []error
	var freed int64
	for _, b := range blocks {
		if err := c.dev.Free(b.addr); err != nil {
			errs = append(errs, wrapCUDA("cudaFree", err))
			continue
		}
		freed += b.size
	}
	c.mu.Lock()
	c.reserved -= freed
	c.mu.Unlock()
	return errors.Join(errs...)
}

// takeReleaseLocked empties the list of blocks waiting for cudaFree.
func (c *mallocCache) takeReleaseLocked() []pendingFree {
	out := c.toFree
	c.toFree = nil
	return out
}

func (c *mallocCache) syncPoint() {
	c.mu.Lock()
	c.reapLocked()
	out := append(c.takeReleaseLocked(), c.shrinkLocked(c.capacityLocked())...)
	c.mu.Unlock()
	_ = c.freeBlocks(out)
}

func (c *mallocCache) setThreshold(t uint64) {
	c.mu.Lock()
	c.threshold = t
	c.mu.Unlock()
}

// prime reserves one block of the class of bytes and caches it.
func (c *mallocCache) prime(bytes int64) error {
	class := mallocClass(bytes)
	addr, err := c.dev.Malloc(class)
	if err != nil {
		return wrapCUDA("prime: cudaMalloc", err)
	}
	c.mu.Lock()
	c.cached[class] = append(c.cached[class], addr)
	c.cachedN += class
	c.primed += class
	c.reserved += class
	c.reservedTotal += class
	c.noteUseLocked()
	c.mu.Unlock()
	return nil
}

// trim frees completed blocks until at most keep bytes stay reserved.
func (c *mallocCache) trim(keep int64) error {
	c.mu.Lock()
	c.reapLocked()
	c.primed = min(c.primed, keep)
	out := c.takeReleaseLocked()
	var drop int64
	for _, b := range out {
		drop += b.size
	}
	keepCached := c.cachedN - max(0, c.reserved-drop-keep)
	out = append(out, c.shrinkLocked(max(0, keepCached))...)
	c.mu.Unlock()
	return c.freeBlocks(out)
}

func (c *mallocCache) usage() poolUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return poolUsage{
		reservedCur: c.reserved, reservedHigh: max(c.reservedHigh, c.reserved), reservedTotal: c.reservedTotal,
		usedCur: c.liveBytes + c.pendingBytes, usedHigh: max(c.usedHigh, c.liveBytes+c.pendingBytes),
	}
}

func (c *mallocCache) resetHigh() {
	c.mu.Lock()
	c.reservedHigh = c.reserved
	c.usedHigh = c.liveBytes + c.pendingBytes
	c.mu.Unlock()
}

// release frees everything but live blocks (leaked buffers keep their
// memory). The reclamation stream has been synchronised, so every pending
// free is complete; wait for any that is not.
func (c *mallocCache) release() error {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	out := c.takeReleaseLocked()
	out = append(out, c.shrinkLocked(0)...)
	c.mu.Unlock()
	var errs []error
	for _, p := range pending {
		if err := c.dev.EventSynchronize(p.ev); err != nil {
			errs = append(errs, wrapCUDA("wait for a pending free", err))
			continue // not known to be complete: leave the block allocated
		}
		c.events.put(p.ev)
		out = append(out, pendingFree{addr: p.addr, size: p.size})
		c.mu.Lock()
		c.pendingBytes -= p.size
		c.mu.Unlock()
	}
	errs = append(errs, c.freeBlocks(out))
	return errors.Join(errs...)
}
