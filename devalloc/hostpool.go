package devalloc

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/bytesize"
)

// hostPool is the host backend's stand-in for the driver's memory pool: it
// reserves segments from the OS with mmap (off the Go heap, page aligned, so C
// and MPI may keep pointers into them), carves allocations out of them, keeps
// freed memory for reuse, and gives whole free segments back on trim. It has
// the observable behaviour of a cudaMemPool (reserved vs used, a release
// threshold applied at synchronisation points, priming, trimming) so that the
// same conformance suite holds on both backends.
//
// Free chunks sit in segregated bins, four per power of two, with a bitmap of
// non-empty bins, and neighbours coalesce. Small requests are carved from 2
// MiB segments of their own and large ones from segments sized to them, so a
// long-lived tiny block never pins a large segment; within a bin the best
// fit is taken. Both keep the pool near the working set when sizes vary from
// one solve to the next.
type hostPool struct {
	mu        sync.Mutex
	small     arena
	large     arena
	live      map[uintptr]*chunk
	ordered   map[*hostStream]orderedChunks // freed in a busy stream's order, reusable on it
	tickets   uint64                        // the last ticket of a queued free
	segments  map[*segment]struct{}
	threshold uint64
	// mmap and munmap are replaceable so tests can simulate an exhausted OS.
	mmap   func(size int64) ([]byte, error)
	munmap func([]byte) error

	reserved, reservedHigh, reservedTotal int64
	used, usedHigh                        int64
	// capacity is the host backend's device memory (DISTBUF_HOST_MEMORY):
	// what the process's host pools may reserve together; 0 for none.
	capacity int64
}

// hostReserved is what the host pools of the process opened with
// DISTBUF_HOST_MEMORY have reserved: the host backend's device memory in
// use, which that size caps as a GPU's memory caps the pools of the ranks
// that share it. Pools opened without it stand on the machine's memory and
// are not counted.
var hostReserved atomic.Int64

// unreserve gives size bytes of the host backend's device memory back.
func (p *hostPool) unreserve(size int64) {
	if p.capacity > 0 {
		hostReserved.Add(-size)
	}
}

type arena struct {
	bins     [numBins]*chunk
	nonEmpty [(numBins + 63) / 64]uint64
}

type segment struct {
	mem   []byte
	size  int64
	arena *arena
}

type chunk struct {
	seg       *segment
	off, size int64
	free      bool
	// orderedOn is the stream a pending free of this live chunk is queued
	// on; ticket names that free (unique in the pool), so that the queued
	// operation of an earlier free, overtaken by a reuse, leaves it alone.
	orderedOn *hostStream
	ticket    uint64
	prevPhys  *chunk
	nextPhys  *chunk
	prevFree  *chunk
	nextFree  *chunk
	bin       int
}

const (
	minBinShift    = 8  // 256 B
	maxBinShift    = 50 // 1 PiB
	numBins        = (maxBinShift - minBinShift) * 4
	smallSegment   = 2 << 20 // small requests share 2 MiB segments, as the CUDA pool does
	smallLimit     = 1 << 20 // requests below this are small
	segmentQuantum = 2 << 20
)

// orderedChunks are a stream's pending frees by bin.
type orderedChunks map[int][]*chunk

func newHostPool() *hostPool {
	return &hostPool{
		live:      make(map[uintptr]*chunk),
		ordered:   make(map[*hostStream]orderedChunks),
		segments:  make(map[*segment]struct{}),
		threshold: math.MaxUint64,
		mmap: func(size int64) ([]byte, error) {
			return syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		},
		munmap: syscall.Munmap,
	}
}

// binFloor is the bin whose range holds size: 4 bins per power of two.
func binFloor(size int64) int {
	if size < 1<<minBinShift {
		return 0
	}
	e := bits.Len64(uint64(size)) - 1
	sub := int(size>>(e-2)) & 3
	b := (e-minBinShift)*4 + sub
	return min(b, numBins-1)
}

func binLower(b int) int64 {
	e, sub := b/4+minBinShift, b%4
	return int64(4+sub) << (e - 2)
}

// binCeil is the first bin in which every chunk is at least size bytes.
func binCeil(size int64) int {
	b := binFloor(size)
	if binLower(b) < size {
		b++
	}
	return b
}

func (p *hostPool) ptr(c *chunk) unsafe.Pointer {
	return unsafe.Pointer(&c.seg.mem[c.off])
}

func (p *hostPool) insertFree(c *chunk) {
	ar := c.seg.arena
	c.free = true
	c.bin = binFloor(c.size)
	c.prevFree, c.nextFree = nil, ar.bins[c.bin]
	if c.nextFree != nil {
		c.nextFree.prevFree = c
	}
	ar.bins[c.bin] = c
	ar.nonEmpty[c.bin/64] |= 1 << (c.bin % 64)
}

func (p *hostPool) removeFree(c *chunk) {
	ar := c.seg.arena
	if c.prevFree != nil {
		c.prevFree.nextFree = c.nextFree
	} else {
		ar.bins[c.bin] = c.nextFree
	}
	if c.nextFree != nil {
		c.nextFree.prevFree = c.prevFree
	}
	if ar.bins[c.bin] == nil {
		ar.nonEmpty[c.bin/64] &^= 1 << (c.bin % 64)
	}
	c.prevFree, c.nextFree, c.free = nil, nil, false
}

func (p *hostPool) arenaFor(size int64) *arena {
	if size < smallLimit {
		return &p.small
	}
	return &p.large
}

// findFree returns the best-fitting free chunk of at least size bytes in
// the arena for size, or nil: the smallest fit in the size's own bin, else
// the smallest chunk of the first larger non-empty bin.
func (p *hostPool) findFree(size int64) *chunk {
	ar := p.arenaFor(size)
	var best *chunk
	if f := binFloor(size); binLower(f) < size {
		for c := ar.bins[f]; c != nil; c = c.nextFree {
			if c.size >= size && (best == nil || c.size < best.size) {
				best = c
			}
		}
		if best != nil {
			return best
		}
	}
	b := binCeil(size)
	for w := b / 64; w < len(ar.nonEmpty); w++ {
		mask := ar.nonEmpty[w]
		if w == b/64 {
			mask &^= (1 << (b % 64)) - 1
		}
		if mask == 0 {
			continue
		}
		for c := ar.bins[w*64+bits.TrailingZeros64(mask)]; c != nil; c = c.nextFree {
			if best == nil || c.size < best.size {
				best = c
			}
		}
		return best
	}
	return nil
}

func (p *hostPool) addSegment(size int64, ar *arena) (*chunk, error) {
	if p.capacity > 0 {
		if all := hostReserved.Add(size); all > p.capacity {
			hostReserved.Add(-size)
			return nil, fmt.Errorf("host pool: reserving %s more would exceed the host memory of %s (%s, %s reserved by this process): %w",
				bytesize.Format(size), bytesize.Format(p.capacity), envHostMemory, bytesize.Format(all-size), distbuf.ErrOutOfMemory)
		}
	}
	mem, err := p.mmap(size)
	if err != nil {
		p.unreserve(size)
		return nil, fmt.Errorf("host pool: mmap %s: %v: %w", bytesize.Format(size), err, distbuf.ErrOutOfMemory)
	}
	seg := &segment{mem: mem, size: size, arena: ar}
	p.segments[seg] = struct{}{}
	p.reserved += size
	p.reservedTotal += size
	p.reservedHigh = max(p.reservedHigh, p.reserved)
	return &chunk{seg: seg, size: size}, nil
}

// alloc returns size bytes usable in the order of stream s (nil: in no
// stream's order, only from free memory).
func (p *hostPool) alloc(size int64, s *hostStream) (*chunk, unsafe.Pointer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.takeOrdered(size, s); c != nil {
		return c, p.ptr(c), nil
	}
	c := p.findFree(size)
	if c != nil {
		p.removeFree(c)
	} else {
		segSize := alignUp(max(size, smallSegment), segmentQuantum)
		var err error
		if c, err = p.addSegment(segSize, p.arenaFor(size)); err != nil {
			return nil, nil, err
		}
	}
	if rest := c.size - size; rest >= allocAlign {
		tail := &chunk{seg: c.seg, off: c.off + size, size: rest, prevPhys: c, nextPhys: c.nextPhys}
		if c.nextPhys != nil {
			c.nextPhys.prevPhys = tail
		}
		c.nextPhys, c.size = tail, size
		p.insertFree(tail)
	}
	ptr := p.ptr(c)
	p.live[uintptr(ptr)] = c
	p.used += c.size
	p.usedHigh = max(p.usedHigh, p.used)
	return c, ptr, nil
}

// order records that the free of the chunk at addr is queued on stream s,
// which is busy: until the free runs, the chunk is reusable by allocations
// on s, whose work s runs after the free (as cudaMallocAsync reuses a block
// freed by cudaFreeAsync on the same stream). Without that, a stream still
// busy when the next solve allocates makes the pool reserve the previous
// solve's memory a second time, and under Retain it keeps it. It returns
// the ticket the queued free must present.
func (p *hostPool) order(addr uintptr, s *hostStream) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.live[addr]
	if !ok || c.orderedOn != nil {
		return 0, fmt.Errorf("host pool: free of unknown address %#x: %w", addr, distbuf.ErrInvalid)
	}
	c.orderedOn = s
	p.tickets++
	c.ticket = p.tickets
	oc := p.ordered[s]
	if oc == nil {
		oc = orderedChunks{}
		p.ordered[s] = oc
	}
	b := binFloor(c.size)
	oc[b] = append(oc[b], c)
	return c.ticket, nil
}

// takeOrdered hands out a chunk whose free is queued on s, of at least size
// bytes and less than twice that, or returns nil.
func (p *hostPool) takeOrdered(size int64, s *hostStream) *chunk {
	oc := p.ordered[s]
	if len(oc) == 0 {
		return nil
	}
	for b := binFloor(size); b <= binFloor(size)+3 && b < numBins; b++ {
		list := oc[b]
		for i := len(list) - 1; i >= 0; i-- {
			c := list[i]
			if c.size < size || c.size >= 2*size {
				continue
			}
			p.unorderLocked(c)
			return c
		}
	}
	return nil
}

// unorderLocked takes c off its stream's list: reused, or freed.
func (p *hostPool) unorderLocked(c *chunk) {
	s := c.orderedOn
	oc := p.ordered[s]
	b := binFloor(c.size)
	list := oc[b]
	for i, o := range list {
		if o == c {
			list[i] = list[len(list)-1]
			list[len(list)-1] = nil
			oc[b] = list[:len(list)-1]
			break
		}
	}
	if len(oc[b]) == 0 {
		delete(oc, b)
	}
	if len(oc) == 0 {
		delete(p.ordered, s)
	}
	c.orderedOn = nil
}

// freeOrdered is the queued free of the chunk at addr with its ticket: it
// frees the chunk unless a reuse overtook it.
func (p *hostPool) freeOrdered(addr uintptr, ticket uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.live[addr]
	if !ok || c.orderedOn == nil || c.ticket != ticket {
		return nil // reused since: the new owner frees it
	}
	p.unorderLocked(c)
	return p.freeLocked(c)
}

func (p *hostPool) free(addr uintptr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.live[addr]
	if !ok || c.orderedOn != nil {
		return fmt.Errorf("host pool: free of unknown address %#x: %w", addr, distbuf.ErrInvalid)
	}
	return p.freeLocked(c)
}

func (p *hostPool) freeLocked(c *chunk) error {
	addr := uintptr(p.ptr(c))
	delete(p.live, addr)
	p.used -= c.size
	if n := c.nextPhys; n != nil && n.free {
		p.removeFree(n)
		c.absorbNext()
	}
	if pr := c.prevPhys; pr != nil && pr.free {
		p.removeFree(pr)
		pr.absorbNext()
		c = pr
	}
	p.insertFree(c)
	return nil
}

// absorbNext merges the chunk physically after c into c.
func (c *chunk) absorbNext() {
	n := c.nextPhys
	c.size += n.size
	c.nextPhys = n.nextPhys
	if c.nextPhys != nil {
		c.nextPhys.prevPhys = c
	}
}

// prime reserves one segment of at least bytes and leaves it free.
func (p *hostPool) prime(bytes int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, err := p.addSegment(alignUp(bytes, segmentQuantum), &p.large)
	if err != nil {
		return err
	}
	p.insertFree(c)
	return nil
}

// trim unmaps wholly free segments, largest first, until at most keep bytes
// stay reserved.
func (p *hostPool) trim(keep int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.trimLocked(keep)
}

func (p *hostPool) trimLocked(keep int64) error {
	for p.reserved > keep {
		var best *chunk
		for _, ar := range []*arena{&p.large, &p.small} {
			for b := numBins - 1; b >= 0 && best == nil; b-- {
				for c := ar.bins[b]; c != nil; c = c.nextFree {
					if c.off == 0 && c.size == c.seg.size && (best == nil || c.size > best.size) {
						best = c
					}
				}
			}
		}
		if best == nil {
			return nil // everything left is in use or fragmented by live chunks
		}
		p.removeFree(best)
		delete(p.segments, best.seg)
		p.reserved -= best.seg.size
		p.unreserve(best.seg.size)
		if err := p.munmap(best.seg.mem); err != nil {
			return fmt.Errorf("host pool: munmap: %w", err)
		}
	}
	return nil
}

func (p *hostPool) setThreshold(t uint64) {
	p.mu.Lock()
	p.threshold = t
	p.mu.Unlock()
}

// syncPoint applies the release threshold, as the driver does at every
// stream, event or device synchronisation.
func (p *hostPool) syncPoint() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.threshold < math.MaxInt64 && uint64(p.reserved) > p.threshold {
		_ = p.trimLocked(int64(p.threshold))
	}
}

func (p *hostPool) usage() poolUsage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return poolUsage{reservedCur: p.reserved, reservedHigh: p.reservedHigh, reservedTotal: p.reservedTotal, usedCur: p.used, usedHigh: p.usedHigh}
}

func (p *hostPool) resetHigh() {
	p.mu.Lock()
	p.reservedHigh, p.usedHigh = p.reserved, p.used
	p.mu.Unlock()
}

// release unmaps every segment with no live chunk; segments with live chunks
// are kept so stale pointers held by leakers stay valid. It returns the bytes
// kept.
func (p *hostPool) release() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	busy := map[*segment]bool{}
	for _, c := range p.live {
		busy[c.seg] = true
	}
	var kept int64
	for seg := range p.segments {
		if busy[seg] {
			kept += seg.size
			continue
		}
		delete(p.segments, seg)
		p.reserved -= seg.size
		p.unreserve(seg.size)
		_ = p.munmap(seg.mem)
	}
	p.small, p.large = arena{}, arena{}
	return kept
}
