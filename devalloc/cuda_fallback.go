//go:build cgo

package devalloc

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"sync"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/cudart"
)

// mallocCache is the CUDA fallback when stream-ordered pools are
// unavailable or turned off: cudaMalloc and cudaFree, with the stream order
// kept by the ledger and a small cache so the hot path calls neither.
//
// A freed block is handed to the stream its free was ordered on (the
// ledger has made that stream wait for every use of the block), and is
// reused at once by the next allocation of its size on the same stream:
// work there runs after the free, as with cudaMallocAsync's reuse on one
// stream. Allocating, filling and freeing on one stream thus makes no
// driver call at all once warm. For any other stream a block must first be
// known complete: when an allocation finds nothing on its own stream, the
// blocks other streams hold are retired, with one event recorded per
// stream, and become reusable once that event has completed (completion is
// queried, never waited for). Completed blocks go to a cache of size
// classes (four per power of two, so a block is at most 25% larger than
// asked) and are handed out again for requests of their class or up to
// four classes below (less than 2x). A request whose class the cache could
// not keep (above its bound) is not rounded to a class at all.
//
// cudaFree waits for the whole device, so it is only called where the host
// waits anyway: at synchronisation points (Stream.Synchronize, Allocator.Sync,
// the out-of-memory ladder), Trim, phase boundaries and Close. There the
// free blocks are cut down to their bound (retiring the streams' blocks if
// they are over it) and blocks that did not fit are freed.
//
// The bound is Config.Cache (256 MiB by default; -1 keeps no cache,
// so every free is a cudaFree and every allocation a cudaMalloc), raised to
// the bytes primed (Config.Prime allocates with cudaMalloc and caches the
// block), and lowered to the release threshold under AggressiveFree. Trim(keep)
// frees cached blocks, largest first, until at most keep bytes stay
// reserved, and lowers the primed amount to keep.
type mallocCache struct {
	dev    *cudart.Device
	events *eventPool
	limit  int64 // -1: no cache

	mu        sync.Mutex
	threshold uint64
	primed    int64
	live      map[uintptr]int64         // allocated blocks and their class size
	ordered   map[*cudaStream]*classMap // freed in the order of a stream, reusable on it
	orderedN  int64
	pending   []pendingBatch // retired, not yet known to be complete; oldest first
	cached    classMap       // complete
	toFree    []block        // complete, not kept: cudaFree at the next sync point

	liveBytes, pendingBytes               int64 // pendingBytes: on streams' lists and retired
	reserved, reservedHigh, reservedTotal int64
	usedHigh                              int64
}

// classMap holds free blocks by size class.
type classMap struct {
	blocks map[int64][]uintptr
	bytes  int64
}

func (m *classMap) put(class int64, addr uintptr) {
	if m.blocks == nil {
		m.blocks = make(map[int64][]uintptr)
	}
	m.blocks[class] = append(m.blocks[class], addr)
	m.bytes += class
}

// take returns a block for a request of class: of that class or up to
// four classes above it.
func (m *classMap) take(class int64) (uintptr, int64, bool) {
	if m.bytes == 0 {
		return 0, 0, false
	}
	for i, cl := 0, class; i <= 4; i, cl = i+1, mallocClass(cl+1) {
		list := m.blocks[cl]
		if len(list) == 0 {
			continue
		}
		m.blocks[cl] = list[:len(list)-1]
		m.bytes -= cl
		return list[len(list)-1], cl, true
	}
	return 0, 0, false
}

// drain empties m into blocks.
func (m *classMap) drain(out []block) []block {
	for cl, list := range m.blocks {
		for _, addr := range list {
			out = append(out, block{addr: addr, size: cl})
		}
		delete(m.blocks, cl)
	}
	m.bytes = 0
	return out
}

type block struct {
	addr uintptr
	size int64
}

// pendingBatch is a stream's retired blocks and the event after their frees.
type pendingBatch struct {
	blocks []block
	bytes  int64
	ev     cudart.Event
}

func newMallocCache(d *cudart.Device, events *eventPool, limit int64) *mallocCache {
	if limit == 0 {
		limit = defaultCache
	}
	return &mallocCache{
		dev: d, events: events, limit: limit, threshold: math.MaxUint64,
		live: make(map[uintptr]int64), ordered: make(map[*cudaStream]*classMap),
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

// classLocked is the size a request of size bytes is given: its size
// class where the cache could keep the block, else size in cudaMalloc's own
// 2 MiB steps, since a block the cache cannot keep is never reused by class
// and rounding it up to one (up to a quarter more) would only waste memory.
func (c *mallocCache) classLocked(size int64) int64 {
	if class := mallocClass(size); class <= c.capacityLocked() {
		return class
	}
	return alignUp(size, mallocGranularity)
}

// mallocGranularity is the step in which cudaMalloc reserves large blocks.
const mallocGranularity = 2 << 20

func (c *mallocCache) alloc(size int64, s *cudaStream) (uintptr, error) {
	c.mu.Lock()
	class := c.classLocked(size)
	if m := c.ordered[s]; m != nil {
		if addr, cl, ok := m.take(class); ok {
			c.orderedN -= cl
			c.pendingBytes -= cl
			c.handOutLocked(addr, cl)
			c.mu.Unlock()
			return addr, nil
		}
	}
	addr, cl, ok := c.cached.take(class)
	if !ok {
		c.retireLocked(s)
		c.reapLocked()
		addr, cl, ok = c.cached.take(class)
	}
	if ok {
		c.handOutLocked(addr, cl)
		c.mu.Unlock()
		return addr, nil
	}
	c.mu.Unlock()
	addr, err := c.dev.Malloc(class)
	if err != nil {
		return 0, wrapCUDA("cudaMalloc", err)
	}
	c.mu.Lock()
	c.reserved += class
	c.reservedTotal += class
	c.handOutLocked(addr, class)
	c.mu.Unlock()
	return addr, nil
}

func (c *mallocCache) handOutLocked(addr uintptr, class int64) {
	c.live[addr] = class
	c.liveBytes += class
	c.noteUseLocked()
}

// free hands the block to stream r, on which the ledger has ordered the
// free after every use of it.
func (c *mallocCache) free(addr uintptr, r *cudaStream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	size, ok := c.live[addr]
	if !ok {
		return fmt.Errorf("cuda fallback: free of unknown address %#x: %w", addr, distbuf.ErrInvalid)
	}
	delete(c.live, addr)
	c.liveBytes -= size
	c.pendingBytes += size
	c.orderLocked(r, addr, size)
	return nil
}

func (c *mallocCache) orderLocked(r *cudaStream, addr uintptr, size int64) {
	m := c.ordered[r]
	if m == nil {
		m = &classMap{}
		c.ordered[r] = m
	}
	m.put(size, addr)
	c.orderedN += size
}

// retireLocked moves the blocks every stream but except holds into pending
// batches, recording one event per stream after its frees. A stream whose
// event cannot be recorded keeps its blocks: without an event there is no
// safe moment to reuse them elsewhere.
func (c *mallocCache) retireLocked(except *cudaStream) {
	for s, m := range c.ordered {
		if s == except || m.bytes == 0 {
			continue
		}
		ev, err := s.record()
		if err != nil {
			continue
		}
		batch := pendingBatch{bytes: m.bytes, ev: ev.(*cudaEvent).h}
		c.orderedN -= m.bytes
		batch.blocks = m.drain(nil)
		c.pending = append(c.pending, batch)
	}
}

// seal detaches the blocks freed on s so far, before s is synchronised;
// synced takes them once it is. Blocks freed meanwhile stay with s: they
// may be ordered after work the synchronisation did not wait for.
func (c *mallocCache) seal(s *cudaStream) *classMap {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.ordered[s]
	if m == nil || m.bytes == 0 {
		return nil
	}
	delete(c.ordered, s)
	c.orderedN -= m.bytes
	return m
}

// synced takes the blocks seal detached: into the cache when the
// synchronisation succeeded, else back to the stream.
func (c *mallocCache) synced(s *cudaStream, m *classMap, ok bool) {
	if m == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		for _, b := range m.drain(nil) {
			c.orderLocked(s, b.addr, b.size)
		}
		return
	}
	c.pendingBytes -= m.bytes
	c.keepLocked(m.drain(nil))
}

// streamDone takes the blocks of a stream that has been synchronised and is
// being destroyed: its frees have all run.
func (c *mallocCache) streamDone(s *cudaStream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.ordered[s]
	delete(c.ordered, s)
	if m == nil || m.bytes == 0 {
		return
	}
	c.orderedN -= m.bytes
	c.pendingBytes -= m.bytes
	c.keepLocked(m.drain(nil))
}

// keepLocked caches complete blocks while the cache has room, and lists the
// others for cudaFree.
func (c *mallocCache) keepLocked(blocks []block) {
	capacity := max(c.limit, c.primed, 0)
	for _, b := range blocks {
		if c.cached.bytes+b.size <= capacity {
			c.cached.put(b.size, b.addr)
		} else {
			c.toFree = append(c.toFree, b)
		}
	}
}

// reapLocked moves retired batches whose event has completed out of
// pending. Events of one stream complete in order, but batches of several
// streams interleave, so every batch is queried.
func (c *mallocCache) reapLocked() {
	kept := c.pending[:0]
	for _, p := range c.pending {
		done, err := c.dev.EventQuery(p.ev)
		if err != nil || !done {
			kept = append(kept, p)
			continue
		}
		c.events.put(p.ev)
		c.pendingBytes -= p.bytes
		c.keepLocked(p.blocks)
	}
	clear(c.pending[len(kept):])
	c.pending = kept
}

// shrinkLocked takes cached blocks, largest first, until the cache holds at
// most keepCached bytes, and returns them for freeing.
func (c *mallocCache) shrinkLocked(keepCached int64) []block {
	if c.cached.bytes <= keepCached {
		return nil
	}
	classes := make([]int64, 0, len(c.cached.blocks))
	for cl, list := range c.cached.blocks {
		if len(list) > 0 {
			classes = append(classes, cl)
		}
	}
	sort.Slice(classes, func(i, j int) bool { return classes[i] > classes[j] })
	var out []block
	for _, cl := range classes {
		for len(c.cached.blocks[cl]) > 0 && c.cached.bytes > keepCached {
			list := c.cached.blocks[cl]
			out = append(out, block{addr: list[len(list)-1], size: cl})
			c.cached.blocks[cl] = list[:len(list)-1]
			c.cached.bytes -= cl
		}
	}
	return out
}

// freeBlocks calls cudaFree outside the lock (it waits for the device).
func (c *mallocCache) freeBlocks(blocks []block) error {
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
func (c *mallocCache) takeReleaseLocked() []block {
	out := c.toFree
	c.toFree = nil
	return out
}

// syncPoint frees what the bound does not let the cache keep. The blocks
// streams hold count against the bound too: when they would not fit, they
// are retired, to be cut down once complete.
func (c *mallocCache) syncPoint() {
	c.mu.Lock()
	capacity := c.capacityLocked()
	if c.cached.bytes+c.orderedN > capacity {
		c.retireLocked(nil)
	}
	c.reapLocked()
	out := append(c.takeReleaseLocked(), c.shrinkLocked(capacity)...)
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
	c.cached.put(class, addr)
	c.primed += class
	c.reserved += class
	c.reservedTotal += class
	c.noteUseLocked()
	c.mu.Unlock()
	return nil
}

// trim frees completed blocks until at most keep bytes stay reserved. The
// caller has synchronised every stream, which put the blocks they held in
// the cache and completed every retired batch.
func (c *mallocCache) trim(keep int64) error {
	c.mu.Lock()
	c.reapLocked()
	c.primed = min(c.primed, keep)
	out := c.takeReleaseLocked()
	var drop int64
	for _, b := range out {
		drop += b.size
	}
	keepCached := c.cached.bytes - max(0, c.reserved-drop-keep)
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
// memory). Every stream has been destroyed, after synchronising, so the
// blocks streams held are complete, and so is every pending batch; wait for
// any that is not.
func (c *mallocCache) release() error {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	out := c.takeReleaseLocked()
	for s, m := range c.ordered {
		c.pendingBytes -= m.bytes
		out = m.drain(out)
		delete(c.ordered, s)
	}
	c.orderedN = 0
	out = append(out, c.shrinkLocked(0)...)
	c.mu.Unlock()
	var errs []error
	for _, p := range pending {
		if err := c.dev.EventSynchronize(p.ev); err != nil {
			errs = append(errs, wrapCUDA("wait for a pending free", err))
			continue // not known to be complete: leave the blocks allocated
		}
		c.events.put(p.ev)
		out = append(out, p.blocks...)
		c.mu.Lock()
		c.pendingBytes -= p.bytes
		c.mu.Unlock()
	}
	errs = append(errs, c.freeBlocks(out))
	return errors.Join(errs...)
}
