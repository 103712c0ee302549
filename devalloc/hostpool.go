package devalloc

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"syscall"
	"unsafe"
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
	segments  map[*segment]struct{}
	threshold uint64
	// mmap and munmap are replaceable so tests can simulate an exhausted OS.
	mmap   func(size int64) ([]byte, error)
	munmap func([]byte) error

	reserved, reservedHigh, reservedTotal int64
	used, usedHigh                        int64
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

func newHostPool() *hostPool {
	return &hostPool{
		live:      make(map[uintptr]*chunk),
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
	mem, err := p.mmap(size)
	if err != nil {
		return nil, fmt.Errorf("host pool: mmap %s: %v: %w", FormatBytes(size), err, ErrOutOfMemory)
	}
	seg := &segment{mem: mem, size: size, arena: ar}
	p.segments[seg] = struct{}{}
	p.reserved += size
	p.reservedTotal += size
	p.reservedHigh = max(p.reservedHigh, p.reserved)
	return &chunk{seg: seg, size: size}, nil
}

func (p *hostPool) alloc(size int64) (*chunk, unsafe.Pointer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
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

func (p *hostPool) free(addr uintptr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.live[addr]
	if !ok {
		return fmt.Errorf("host pool: free of unknown address %#x: %w", addr, ErrInvalid)
	}
	delete(p.live, addr)
	p.used -= c.size
	if n := c.nextPhys; n != nil && n.free {
		p.removeFree(n)
		c.size += n.size
		c.nextPhys = n.nextPhys
		if c.nextPhys != nil {
			c.nextPhys.prevPhys = c
		}
	}
	if pr := c.prevPhys; pr != nil && pr.free {
		p.removeFree(pr)
		pr.size += c.size
		pr.nextPhys = c.nextPhys
		if pr.nextPhys != nil {
			pr.nextPhys.prevPhys = pr
		}
		c = pr
	}
	p.insertFree(c)
	return nil
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
	return poolUsage{p.reserved, p.reservedHigh, p.reservedTotal, p.used, p.usedHigh}
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
		_ = p.munmap(seg.mem)
	}
	p.small, p.large = arena{}, arena{}
	return kept
}
