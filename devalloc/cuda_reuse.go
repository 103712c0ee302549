//go:build cgo

package devalloc

import (
	"errors"
	"sync"

	"github.com/distbuf/distbuf/internal/cudart"
)

// streamReuse keeps, on the stream-ordered pool under Retain, blocks freed
// in the order of a stream for the next allocation of the same size on
// that stream: what the pool itself would hand back there, without the two
// driver calls. Work enqueued on the stream after the allocation runs after
// the work before the free, as with cudaFreeAsync and cudaMallocAsync on
// one stream, so no event or wait is needed. Under MPS a pool allocation
// costs 10-20 us of the client's time, so a solve that allocates the same
// buffers every iteration pays for them once.
//
// Only sizes recur exactly (the allocator's 256-byte granularity), and only
// on the stream they were freed on; everything else goes to the pool. The
// kept bytes are bounded (Config.Cache, the `cache` key: 256 MiB by
// default, off with cache:off): past the bound the oldest blocks go back to
// the pool. A block of more than a sixteenth of the bound is not kept: a
// few such blocks would fill it, and an allocation that large is worth its
// driver call. They also go back, with cudaFreeAsync on their stream, before
// the stream is destroyed, at Trim (and so on the out-of-memory ladder,
// which first hands every kept block back), when the release threshold
// drops below Retain's, and at Close. The pool counts kept blocks as used;
// Stats.ReuseKept reports them.
//
// A block freed after work on other streams goes to the reclamation
// stream, which waits for that work (Buffer.enqueueFree). It is kept there
// too, with an event recorded at its free: once the event has completed,
// nothing uses the block any more, and an allocation of its size on any
// stream takes it, the oldest first, with no wait. This is the usual fate
// of a received message, written on the exchanger's stream and read on the
// caller's: its next allocation needs no pool call either. The event
// replaces the cudaFreeAsync the block would have cost; taking it costs a
// cudaEventQuery. At most maxSharedKept blocks are kept there, an event
// each; past that they go back to the pool.
type streamReuse struct {
	// free returns a block to the pool in the order of s. It is called with
	// mu held: a stream's destroy takes its blocks back under mu before it
	// destroys the handle, so a kept block's stream handle is valid there.
	free func(addr uintptr, s *cudaStream) error
	// mark records an event on s (the reclamation stream) at the free of a
	// block kept there; reached reports whether it has completed; recycle
	// gives it back. Nil marks: blocks freed there go back to the pool.
	mark    func(s *cudaStream) (cudart.Event, error)
	reached func(ev cudart.Event) bool
	recycle func(ev cudart.Event)

	limit int64 // 0: keep nothing; set once

	mu    sync.Mutex
	on    bool // the release threshold is Retain's
	bytes int64
	n     int // blocks kept
	// streams are those with lists of kept blocks (cudaStream.kept: by
	// size, last freed last, guarded by mu). A list emptied by take stays
	// (the size is likely freed again) until compaction drops it.
	streams map[*cudaStream]bool
	// order is every block kept, oldest first; the entries of blocks taken
	// since (their seq no longer listed) are skipped when eviction meets
	// them, and dropped when they outnumber the kept ones.
	order []reuseEntry
	seq   uint64
	hits  int64
	// shared is the reclamation stream once it kept a block: its blocks
	// serve every stream (takeSharedLocked); sharedN of them are kept.
	shared  *cudaStream
	sharedN int
}

// maxSharedKept bounds the blocks kept on the reclamation stream, each of
// which holds an event until it is taken: a solve frees a few buffers
// there, a code that frees thousands of tiny ones after cross-stream reads
// would otherwise hold thousands of events.
const maxSharedKept = 1024

type keptList struct{ blocks []keptBlock }

type keptBlock struct {
	addr uintptr
	seq  uint64       // when it was kept: a block taken and kept again is a new entry
	ev   cudart.Event // a block of the reclamation stream: recorded at its free
}

type reuseKey struct {
	s    *cudaStream
	size int64
}

type reuseEntry struct {
	key reuseKey
	keptBlock
}

func newStreamReuse(limit int64, free func(addr uintptr, s *cudaStream) error) *streamReuse {
	if limit < 0 {
		limit = 0
	}
	return &streamReuse{free: free, limit: limit, on: true, streams: map[*cudaStream]bool{}}
}

// take returns a kept block of size freed on s, else one freed on the
// reclamation stream whose free has run, if any.
func (r *streamReuse) take(s *cudaStream, size int64) (uintptr, bool) {
	if r == nil || size > r.limit/16 { // never kept: no lock
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := s.kept[size]
	if s.shared || l == nil || len(l.blocks) == 0 {
		return r.takeSharedLocked(size)
	}
	b := l.blocks[len(l.blocks)-1]
	l.blocks = l.blocks[:len(l.blocks)-1]
	r.bytes -= size
	r.n--
	r.hits++
	return b.addr, true
}

// takeSharedLocked returns the block of size freed longest ago on the
// reclamation stream, once the event recorded at its free has completed:
// the later ones come after it in that stream's order.
func (r *streamReuse) takeSharedLocked(size int64) (uintptr, bool) {
	if r.shared == nil {
		return 0, false
	}
	l := r.shared.kept[size]
	if l == nil || len(l.blocks) == 0 || !r.reached(l.blocks[0].ev) {
		return 0, false
	}
	b := l.blocks[0]
	l.blocks = append(l.blocks[:0], l.blocks[1:]...)
	r.recycle(b.ev)
	r.bytes -= size
	r.n--
	r.sharedN--
	r.hits++
	return b.addr, true
}

// put keeps a block freed on s, or says no (the caller frees it to the
// pool). To stay within the bound it first gives the oldest kept blocks
// back to the pool; the error is theirs.
func (r *streamReuse) put(s *cudaStream, size int64, addr uintptr) (kept bool, err error) {
	if r == nil || (s.shared && r.mark == nil) || size > r.limit/16 { // never kept: no lock
		return false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on || (s.shared && r.sharedN >= maxSharedKept) {
		return false, nil
	}
	var errs []error
	for r.bytes+size > r.limit {
		e, ok := r.evictOldestLocked()
		if !ok {
			break
		}
		errs = append(errs, r.free(e.addr, e.key.s))
		r.recycleOf(e.keptBlock)
	}
	var ev cudart.Event
	if s.shared {
		if ev, err = r.mark(s); err != nil {
			return false, errors.Join(append(errs, err)...)
		}
		r.shared = s
		r.sharedN++
	}
	k := reuseKey{s, size}
	if s.kept == nil {
		s.kept = map[int64]*keptList{}
		r.streams[s] = true
	}
	l := s.kept[size]
	if l == nil {
		l = &keptList{}
		s.kept[size] = l
	}
	r.seq++
	b := keptBlock{addr, r.seq, ev}
	l.blocks = append(l.blocks, b)
	r.order = append(r.order, reuseEntry{k, b})
	r.bytes += size
	r.n++
	if len(r.order) > 64 && len(r.order) > 4*r.n {
		r.compactLocked()
	}
	return true, errors.Join(errs...)
}

// recycleOf gives back the event of a block of the reclamation stream.
func (r *streamReuse) recycleOf(b keptBlock) {
	if b.ev != 0 {
		r.recycle(b.ev)
	}
}

// evictOldestLocked removes the oldest block still kept.
func (r *streamReuse) evictOldestLocked() (reuseEntry, bool) {
	for len(r.order) > 0 {
		e := r.order[0]
		r.order = r.order[1:]
		if r.removeLocked(e) {
			return e, true
		}
	}
	return reuseEntry{}, false
}

// removeLocked drops e from its list; false when it was taken since.
func (r *streamReuse) removeLocked(e reuseEntry) bool {
	l := e.key.s.kept[e.key.size]
	if l == nil {
		return false
	}
	for i, b := range l.blocks {
		if b == e.keptBlock {
			l.blocks = append(l.blocks[:i], l.blocks[i+1:]...)
			r.bytes -= e.key.size
			r.n--
			if e.key.s.shared {
				r.sharedN--
			}
			return true
		}
	}
	return false
}

// compactLocked drops the entries of blocks taken since they were kept,
// keeping the order of the others, and the lists left empty.
func (r *streamReuse) compactLocked() {
	live := make(map[uint64]bool, r.n)
	for s := range r.streams {
		for size, l := range s.kept {
			if len(l.blocks) == 0 {
				delete(s.kept, size)
			}
			for _, b := range l.blocks {
				live[b.seq] = true
			}
		}
		if len(s.kept) == 0 {
			s.kept = nil
			delete(r.streams, s)
			if s == r.shared {
				r.shared = nil
			}
		}
	}
	out := r.order[:0]
	for _, e := range r.order {
		if live[e.seq] {
			out = append(out, e)
		}
	}
	r.order = out
}

// drain gives the blocks kept for s, or for every stream when s is nil,
// back to the pool.
func (r *streamReuse) drain(s *cudaStream) error {
	_, err := r.drainOf(s)
	return err
}

// drainStreams gives every kept block back and returns the streams whose
// order the frees went into.
func (r *streamReuse) drainStreams() ([]*cudaStream, error) { return r.drainOf(nil) }

func (r *streamReuse) drainOf(s *cudaStream) ([]*cudaStream, error) {
	if r == nil {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	var streams []*cudaStream
	seen := map[*cudaStream]bool{}
	n := 0
	for ks := range r.streams {
		if s != nil && ks != s {
			continue
		}
		for size, l := range ks.kept {
			for _, b := range l.blocks {
				errs = append(errs, r.free(b.addr, ks))
				r.recycleOf(b)
			}
			if len(l.blocks) > 0 && !seen[ks] {
				seen[ks] = true
				streams = append(streams, ks)
			}
			n += len(l.blocks)
			r.n -= len(l.blocks)
			if ks.shared {
				r.sharedN -= len(l.blocks)
			}
			r.bytes -= size * int64(len(l.blocks))
		}
		ks.kept = nil
		delete(r.streams, ks)
		if ks == r.shared {
			r.shared = nil
		}
	}
	if s == nil {
		r.order = nil
	} else if n > 0 {
		r.compactLocked()
	}
	return streams, errors.Join(errs...)
}

// setOn turns keeping on (Retain's threshold) or off; off, the caller
// drains.
func (r *streamReuse) setOn(on bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.on = on
	r.mu.Unlock()
}

func (r *streamReuse) stats() (kept, hits int64) {
	if r == nil {
		return 0, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes, r.hits
}
