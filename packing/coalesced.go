package packing

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
)

// Coalesced is one group of a plan laid out in a single devalloc Buffer: one
// allocation, many block views. The Coalesced owns the buffer (Free releases
// it once); views own nothing.
type Coalesced struct {
	plan  *Plan
	group int
	buf   *devalloc.Buffer
	start int64          // where the layout begins in buf (a prefix before it is the caller's)
	base  uintptr        // address of the layout: the buffer's address plus start
	host  unsafe.Pointer // the same, when Go may address the memory
	size  int64          // the group's bytes
	n     int            // blocks in the group
	// members maps group positions to plan indices; nil when position k
	// is plan index first+k (a single-group plan, or groups the list gave
	// one after another).
	members []int32
	first   int
	freed   atomic.Bool
	// owner is the joined buffer a part belongs to (Parts); nil for a
	// Coalesced that owns its buffer.
	owner *Coalesced
	// release gives the buffer back on Free instead of freeing it (Wrap);
	// nil when the Coalesced owns its buffer.
	release func() error
}

// isFreed reports whether the buffer is gone: freed, or, for a part, its
// owner freed.
func (c *Coalesced) isFreed() bool {
	return c.freed.Load() || (c.owner != nil && c.owner.freed.Load())
}

// AllocOptions are the variants of Alloc. The zero value allocates group 0
// of the plan in the allocator's own memory (device memory on the CUDA
// backend) and clears its padding.
type AllocOptions struct {
	// Group is the group to lay out, an index in Plan.Groups. Buffers of a
	// plan of several destination groups come from msg.AllocSend when they
	// are to be exchanged (it sets Group and Prefix: Group exists for it),
	// or as one buffer through Plan.Joined.
	Group int
	// Prefix reserves bytes before the layout in the same allocation: room
	// for a message header, so that the buffer holding the blocks is also
	// the whole message and sending it copies nothing (msg.AllocSend's
	// manifest). It must be a non-negative multiple of the plan's Align,
	// so that the blocks keep their alignment in memory. Coalesced.Start
	// reports it; its bytes are the caller's, undefined until written.
	Prefix int64
	// Pinned lays the group out in page-locked host memory, from the
	// allocator's pinned pool: a staging buffer that host code fills in
	// place, then moved to the device by an Alloc with CopyOf.
	Pinned bool
	// CopyOf, when set, fills the new buffer by one copy of CopyOf's
	// layout in the order of s, instead of clearing its padding (CopyOf's
	// padding is zero, and comes with the copy): one allocator call and one
	// copy, the upload of operands packed in pinned memory. CopyOf must be
	// laid out by the same plan and group.
	CopyOf *Coalesced
}

// Alloc allocates the buffer of one group of p with one allocator call,
// usable in the order of s, and zeroes its padding in the order of s. Block
// contents are undefined until written. Without options p must have a
// single group; opts, at most one, choose the group and the variants.
func Alloc(a *devalloc.Allocator, p *Plan, s *devalloc.Stream, opts ...AllocOptions) (*Coalesced, error) {
	if p == nil {
		return nil, fmt.Errorf("packing: alloc: nil plan: %w", distbuf.ErrInvalid)
	}
	var o AllocOptions
	switch len(opts) {
	case 0:
		if len(p.groups) != 1 {
			return nil, fmt.Errorf("packing: alloc: plan has %d destination groups: allocate send buffers with msg.AllocSend, or join the groups (Plan.Joined): %w", len(p.groups), distbuf.ErrInvalid)
		}
	case 1:
		o = opts[0]
	default:
		return nil, fmt.Errorf("packing: alloc: %d AllocOptions: want at most one: %w", len(opts), distbuf.ErrInvalid)
	}
	g := o.Group
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("packing: alloc: group %d out of range: the plan has %d: %w", g, len(p.groups), distbuf.ErrInvalid)
	}
	if err := p.checkStart("alloc", o.Prefix); err != nil {
		return nil, err
	}
	if o.CopyOf == nil {
		return allocLayout(a, p, g, o.Prefix, s, o.Pinned, true)
	}
	src := o.CopyOf
	if err := src.check(); err != nil {
		return nil, err
	}
	if src.plan != p || src.group != g {
		return nil, fmt.Errorf("packing: alloc: CopyOf is laid out by another plan or group (group %d) than the one allocated (group %d): %w", src.group, g, distbuf.ErrInvalid)
	}
	c, err := allocLayout(a, p, g, o.Prefix, s, o.Pinned, false)
	if err != nil {
		return nil, err
	}
	if err := transfer(s, c, src); err != nil {
		_ = c.buf.Free()
		return nil, err
	}
	return c, nil
}

// checkStart validates where a layout may begin in a buffer: a multiple of
// the plan's alignment (of the largest element for a manifest plan, whose
// Align is 0) and small enough to add to a layout size.
func (p *Plan) checkStart(op string, start int64) error {
	align := p.opts.Align
	if align == 0 {
		align = maxElemSize
	}
	if start < 0 || start > MaxBytes || start%align != 0 {
		return fmt.Errorf("packing: %s: start %d misaligned or out of range: want a multiple of %d in [0, 2^50]: %w", op, start, align, distbuf.ErrInvalid)
	}
	return nil
}

// maxElemSize is the largest element size: a layout that starts on a
// multiple of it keeps every block's elements aligned.
const maxElemSize = 16

// allocLayout allocates group g of p after start bytes; clearPadding zeroes
// the padding in the order of s (a copy of a layout brings zero padding).
func allocLayout(a *devalloc.Allocator, p *Plan, g int, start int64, s *devalloc.Stream, pinned, clearPadding bool) (*Coalesced, error) {
	if a == nil {
		return nil, fmt.Errorf("packing: alloc: nil allocator: %w", distbuf.ErrInvalid)
	}
	size := p.groups[g].Bytes
	if start > MaxBytes-size {
		return nil, fmt.Errorf("packing: alloc group %d: too large: %d bytes after a %d-byte prefix exceed 2^50: %w", g, size, start, distbuf.ErrInvalid)
	}
	// An empty group still gets a (minimal) buffer so that every group is
	// one buffer and one message.
	n := max(start+size, 1)
	var buf *devalloc.Buffer
	var err error
	if pinned {
		buf, err = a.AllocPinned(n, s)
	} else {
		buf, err = a.Alloc(n, s)
	}
	if err != nil {
		return nil, fmt.Errorf("packing: alloc group %d (%d blocks, %d bytes): %w", g, p.groups[g].Blocks, size, err)
	}
	c, err := wrap(buf, start, p, g)
	if err == nil && clearPadding {
		err = c.zeroPadding(s)
	}
	if err != nil {
		_ = buf.Free()
		return nil, err
	}
	return c, nil
}

// Wrap makes the Coalesced of group g of plan p over an existing buffer,
// such as a received message, without copying: the layout begins at byte
// off of buf (a received message's payload, after its header), which must
// hold the group's bytes from there. off must be a multiple of the plan's
// Align (of 16 for a plan from FromManifest). The Coalesced owns what
// release gives back: its Free calls release once, after which it and its
// views report distbuf.ErrFreed. A nil release hands buf over: Free frees
// it. Where several Coalesced share one buffer (the receive buffer of
// several messages), each is given the release of its own reference. On
// error Wrap takes nothing: buf, and the reference, stay the caller's.
func Wrap(buf *devalloc.Buffer, off int64, p *Plan, g int, release func() error) (*Coalesced, error) {
	if buf == nil || p == nil {
		return nil, fmt.Errorf("packing: wrap: nil buffer or plan: %w", distbuf.ErrInvalid)
	}
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("packing: wrap: group %d out of range: the plan has %d: %w", g, len(p.groups), distbuf.ErrInvalid)
	}
	if err := p.checkStart("wrap", off); err != nil {
		return nil, err
	}
	c, err := wrap(buf, off, p, g)
	if err != nil {
		return nil, err
	}
	c.release = release
	return c, nil
}

func wrap(buf *devalloc.Buffer, start int64, p *Plan, g int) (*Coalesced, error) {
	addr, size, _, err := buf.Region()
	if err != nil {
		return nil, fmt.Errorf("packing: wrap: %w", err)
	}
	need := p.groups[g].Bytes
	if size < need || start > size-need {
		return nil, fmt.Errorf("packing: wrap: buffer #%d holds %d bytes, the layout needs %d from byte %d: %w", buf.ID(), size, need, start, distbuf.ErrInvalid)
	}
	c := &Coalesced{plan: p, group: g, buf: buf, start: start, base: addr + uintptr(start), size: need, n: p.groups[g].Blocks}
	if len(p.groups) > 1 {
		c.members, c.first, _ = p.groupIndex(g)
	}
	if buf.Location().HostAccessible() {
		mem, err := buf.Bytes()
		if err != nil {
			return nil, fmt.Errorf("packing: wrap: %w", err)
		}
		c.host = unsafe.Add(unsafe.Pointer(unsafe.SliceData(mem)), start)
	}
	return c, nil
}

// zeroPadding clears the bytes between classes (and between blocks when
// BlockAlign pads them) in the order of s. A layout without padding, such as
// blocks whose sizes are multiples of the alignment, needs nothing. Device
// memory is cleared span by span when there are few spans, and otherwise
// whole by one memset: one launch is cheaper than many.
func (c *Coalesced) zeroPadding(s *devalloc.Stream) error {
	if c.size == 0 {
		return nil
	}
	// Device padding needs the spans only up to maxPaddingMemsets of
	// them, kept on the stack; host padding is cleared span by span.
	var few [maxPaddingMemsets + 1]byteSpan
	limit := len(few)
	if c.host != nil {
		limit = -1
	}
	gaps, whole := c.appendPaddingSpans(few[:0], limit)
	switch {
	case whole && c.host == nil:
		return s.Memset(c.buf, c.start, c.size, 0)
	case whole:
		host, n := c.host, c.size
		return c.enqueueWrite(s, func() { clear(unsafe.Slice((*byte)(host), n)) })
	case len(gaps) == 0:
		return nil
	case c.host == nil && len(gaps) > maxPaddingMemsets:
		return s.Memset(c.buf, c.start, c.size, 0)
	case c.host == nil:
		for _, g := range gaps {
			if err := s.Memset(c.buf, c.start+g.off, g.n, 0); err != nil {
				return err
			}
		}
		return nil
	}
	host, spans := c.host, slices.Clone(gaps)
	return c.enqueueWrite(s, func() {
		for _, g := range spans {
			clear(unsafe.Slice((*byte)(unsafe.Add(host, g.off)), g.n))
		}
	})
}

// maxPaddingMemsets is the most spans of device padding cleared one memset
// each; beyond it the whole buffer is cleared at once.
const maxPaddingMemsets = 4

// byteSpan is a byte range of a layout.
type byteSpan struct{ off, n int64 }

// appendPaddingSpans appends to gaps the ranges of the layout that hold
// padding: between classes, after the last one, and whole classes whose
// blocks are padded; it stops once gaps holds limit spans (limit > 0;
// limit < 0: all of them). whole is true when the padding cannot be listed by classes (a
// manifest layout, whose classes may interleave): then everything is to
// be cleared.
func (c *Coalesced) appendPaddingSpans(gaps []byteSpan, limit int) (_ []byteSpan, whole bool) {
	if c.plan.manifest() {
		return gaps, true
	}
	full := func() bool { return limit >= 0 && len(gaps) >= limit }
	var cursor int64
	for _, ci := range c.plan.groups[c.group].Classes {
		cl := &c.plan.classes[ci]
		if cl.Offset > cursor {
			if gaps = append(gaps, byteSpan{cursor, cl.Offset - cursor}); full() {
				return gaps, false
			}
		}
		end := cl.Offset + cl.Stride*int64(cl.Count)
		if cl.Stride > cl.BlockBytes {
			// padded blocks: clear the class
			if gaps = append(gaps, byteSpan{cl.Offset, end - cl.Offset}); full() {
				return gaps, false
			}
		}
		cursor = end
	}
	if c.size > cursor {
		gaps = append(gaps, byteSpan{cursor, c.size - cursor})
	}
	return gaps, false
}

// enqueueWrite runs fn on the host in the order of s, declared as a write
// of the buffer so that work on other streams is ordered after it.
func (c *Coalesced) enqueueWrite(s *devalloc.Stream, fn func()) error {
	w, err := c.buf.Write(s)
	if err != nil {
		return err
	}
	err = s.Enqueue(func() error { fn(); return nil })
	return errors.Join(err, w.Done())
}

func (c *Coalesced) check() error {
	if c == nil {
		return fmt.Errorf("packing: nil coalesced buffer: %w", distbuf.ErrInvalid)
	}
	if c.isFreed() {
		return fmt.Errorf("packing: coalesced buffer #%d: %w", c.buf.ID(), distbuf.ErrFreed)
	}
	return nil
}

// Plan is the layout the buffer follows.
func (c *Coalesced) Plan() *Plan { return c.plan }

// Group is the index in Plan.Groups of the group this buffer holds.
func (c *Coalesced) Group() int { return c.group }

// Dest is the destination rank of the group, or NoDest for a received or
// joined layout.
func (c *Coalesced) Dest() int { return c.plan.groups[c.group].Dest }

// Len is the number of blocks.
func (c *Coalesced) Len() int { return c.n }

// Size is the number of bytes of the layout (the message payload).
func (c *Coalesced) Size() int64 { return c.size }

// Start is the byte offset in Buffer at which the layout begins: Alloc's
// Prefix, Wrap's offset, or a part's place in its joined buffer (Parts).
// View offsets count from it.
func (c *Coalesced) Start() int64 { return c.start }

// Buffer is the underlying allocation; the layout occupies
// [Start, Start+Size) of it. Declare work on the blocks with its Read and
// Write (then Access.Done), hold it for host work with its Hold, and ask it
// where the memory lives (Location); do not Free it directly.
func (c *Coalesced) Buffer() *devalloc.Buffer { return c.buf }

// Free releases the buffer once, after every completion recorded on it (the
// devalloc ledger): it frees it, or, for a Coalesced made by Wrap with a
// release, calls release. Every later use of the Coalesced or its views
// returns distbuf.ErrFreed, a second Free included. A part of a joined
// buffer (Parts) owns nothing: its Free is refused with
// distbuf.ErrInvalid.
func (c *Coalesced) Free() error {
	if c == nil {
		return fmt.Errorf("packing: free of nil coalesced buffer: %w", distbuf.ErrInvalid)
	}
	if c.owner != nil {
		return fmt.Errorf("packing: free of a part of joined buffer #%d: free the joined buffer: %w", c.buf.ID(), distbuf.ErrInvalid)
	}
	if c.freed.Swap(true) {
		return fmt.Errorf("packing: double free of coalesced buffer #%d: %w", c.buf.ID(), distbuf.ErrFreed)
	}
	if c.release != nil {
		return c.release()
	}
	if err := c.buf.Free(); err != nil {
		return fmt.Errorf("packing: free: %w", err)
	}
	return nil
}

// View is one block inside a Coalesced: a handle of two words that reads
// the block's descriptor and offset from the plan's flat arrays, so making
// views costs nothing per block beyond the plan itself. It owns no memory.
// Host code reads and writes the blocks through Coalesced.OnHost, the same
// on every backend; device code finds a block at Buffer's address plus
// Start plus Offset, and declares its work on Buffer (Read/Write, then
// Access.Done).
type View struct {
	c *Coalesced
	i int // plan index
}

func (v View) cls() *Class { return v.c.plan.class(v.i) }

// Desc is the block's descriptor: id, dtype, shape, and the destination
// of its group (NoDest for a received or joined layout).
func (v View) Desc() Desc {
	cl := v.cls()
	return Desc{ID: v.id(), DType: cl.DType, Rows: cl.Rows, Cols: cl.Cols, Dest: v.c.Dest()}
}

// Offset is the block's byte offset in the layout, counted from the
// Coalesced's Start.
func (v View) Offset() int64 { return v.c.plan.offset(v.i) }

func (v View) id() uint64    { return v.c.plan.id(v.i) }
func (v View) dtype() DType  { return v.cls().DType }
func (v View) bytes() int64  { return v.cls().BlockBytes }
func (v View) length() int   { cl := v.cls(); return cl.Rows * cl.Cols }
func (v View) addr() uintptr { return v.c.base + uintptr(v.c.plan.offset(v.i)) }

// View returns the block at group position k.
func (c *Coalesced) View(k int) (View, error) {
	if c != nil && uint(k) < uint(c.n) && !c.isFreed() {
		return c.viewAt(k), nil
	}
	return View{}, c.viewError(k)
}

// Locate returns the class (an index in Plan().Classes()) and the byte
// offset of the block at group position k, as View(k) would give them
// without making the view: for planners that walk every block of a buffer.
// ok is false where View(k) fails, and View(k) then says why.
func (c *Coalesced) Locate(k int) (class int, offset int64, ok bool) {
	if c == nil || uint(k) >= uint(c.n) || c.isFreed() {
		return 0, 0, false
	}
	i := c.first + k
	if c.members != nil {
		i = int(c.members[k])
	}
	p := c.plan
	m := p.meta[i]
	ci := m >> (p.rankBits & 31)
	if p.offs != nil {
		return int(ci), p.offs[i], true
	}
	cl := &p.classes[ci]
	return int(ci), cl.Offset + int64(m&p.rankMask)*cl.Stride, true
}

// Locator finds the blocks of one Coalesced by group position, as Locate
// does, for planners that walk every block: the buffer is checked once,
// when the Locator is made, and Locate is small enough to inline into the
// caller's loop. It reads the plan, not the buffer, so it does not notice
// a later Free: use it within the work that made it.
type Locator struct {
	n int
	// members maps positions to indices in meta and offs, or is nil when
	// position k is index k: meta and offs then begin at the group's first
	// block.
	members  []int32
	meta     []uint32
	offs     []int64
	classes  []Class
	rankBits uint32
	rankMask uint32
}

// Locator returns c's Locator, or the error View would give for a nil or
// freed buffer.
func (c *Coalesced) Locator() (Locator, error) {
	if err := c.check(); err != nil {
		return Locator{}, err
	}
	p := c.plan
	l := Locator{n: c.n, members: c.members, meta: p.meta, offs: p.offs, classes: p.classes, rankBits: uint32(p.rankBits & 31), rankMask: p.rankMask}
	if c.members == nil {
		l.meta = l.meta[c.first : c.first+c.n]
		if l.offs != nil {
			l.offs = l.offs[c.first : c.first+c.n]
		}
	}
	return l, nil
}

// Locate returns the class (an index in Plan().Classes()) and the byte
// offset of the block at group position k; ok is false for a position
// outside the group.
func (l *Locator) Locate(k int) (class int, offset int64, ok bool) {
	if uint(k) >= uint(l.n) {
		return 0, 0, false
	}
	if l.members != nil {
		k = int(l.members[k])
	}
	m := l.meta[k]
	ci := m >> l.rankBits
	if l.offs != nil {
		return int(ci), l.offs[k], true
	}
	cl := &l.classes[ci]
	return int(ci), cl.Offset + int64(m&l.rankMask)*cl.Stride, true
}

func (c *Coalesced) viewError(k int) error {
	if err := c.check(); err != nil { // nil or freed
		return err
	}
	return fmt.Errorf("packing: view %d of a buffer with %d blocks: %w", k, c.Len(), distbuf.ErrInvalid)
}

// Position is the group position of the block with the given id: the index
// View, Locate and HostBlocks' methods take, and gemm's Triple names. The
// first call on a plan builds a map of its ids.
func (c *Coalesced) Position(id uint64) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	if k, ok := c.position(id); ok {
		return k, nil
	}
	return 0, fmt.Errorf("packing: no block with id %d in coalesced buffer #%d: %w", id, c.buf.ID(), distbuf.ErrInvalid)
}

// position is Position without the checks of c.
func (c *Coalesced) position(id uint64) (int, bool) {
	i, ok := c.plan.index(id)
	if !ok || c.plan.class(i).Group != c.group {
		return 0, false
	}
	if c.members == nil {
		return i - c.first, true
	}
	// members lists the group's plan indices in increasing order.
	return slices.BinarySearch(c.members, int32(i))
}

// All iterates over the views in group-position order, the cheapest way to
// walk a buffer's blocks (nothing is allocated). Over a freed buffer it
// yields nothing: check Len or use View for an error.
func (c *Coalesced) All() iter.Seq2[int, View] {
	return func(yield func(int, View) bool) {
		if c == nil || c.isFreed() {
			return
		}
		// One call of yield rather than a loop for each case: the compiler
		// inlines a loop body into the loop with a budget ten times larger
		// when the iterator calls it from one place, so that a body of a few
		// view calls (address and shape, say) is inlined, not called.
		members, first := c.members, c.first
		for k := range c.n {
			i := first + k
			if members != nil {
				i = int(members[k])
			}
			if !yield(k, View{c: c, i: i}) {
				return
			}
		}
	}
}
