package packing

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync/atomic"
	"unsafe"

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
	// members maps group positions to plan indices; nil when they are equal
	// (a single-group plan).
	members []int32
	freed   atomic.Bool
	// owner is the joined buffer a part belongs to (Parts); nil for a
	// Coalesced that owns its buffer.
	owner *Coalesced
	// share is the buffer's shared ownership (WrapShared); nil when the
	// Coalesced owns its buffer alone.
	share *Share
}

// isFreed reports whether the buffer is gone: freed, or, for a part, its
// owner freed.
func (c *Coalesced) isFreed() bool {
	return c.freed.Load() || (c.owner != nil && c.owner.freed.Load())
}

// Alloc allocates the buffer of a single-group plan with one allocator call,
// usable in the order of s, and zeroes its padding in the order of s. Block
// contents are undefined until written. A plan with several destination
// groups needs AllocGroups.
func Alloc(a *devalloc.Allocator, p *Plan, s *devalloc.Stream) (*Coalesced, error) {
	if p == nil {
		return nil, fmt.Errorf("packing: alloc: nil plan: %w", ErrInvalid)
	}
	if len(p.groups) != 1 {
		return nil, fmt.Errorf("packing: alloc: plan has %d destination groups, use AllocGroups: %w", len(p.groups), ErrInvalid)
	}
	return allocGroup(a, p, 0, s, false)
}

// AllocGroups allocates one buffer per destination group, in the order of
// Plan.Groups: one allocator call per group. Buffers to exchange with msg
// come from msg.AllocSend instead, which leaves room for the message's
// manifest before the blocks.
func AllocGroups(a *devalloc.Allocator, p *Plan, s *devalloc.Stream) ([]*Coalesced, error) {
	if p == nil {
		return nil, fmt.Errorf("packing: alloc groups: nil plan: %w", ErrInvalid)
	}
	out := make([]*Coalesced, 0, len(p.groups))
	for g := range p.groups {
		c, err := allocGroup(a, p, g, s, false)
		if err != nil {
			for _, done := range out {
				_ = done.Free()
			}
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// AllocPinned lays out group g of the plan in page-locked host memory: a
// staging buffer that Go code fills through the views and that Transfer
// moves to the device in one copy.
func AllocPinned(a *devalloc.Allocator, p *Plan, g int, s *devalloc.Stream) (*Coalesced, error) {
	if p == nil {
		return nil, fmt.Errorf("packing: alloc pinned: nil plan: %w", ErrInvalid)
	}
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("packing: alloc pinned: group %d of %d: %w", g, len(p.groups), ErrOutOfRange)
	}
	return allocGroup(a, p, g, s, true)
}

// AllocCopy allocates a buffer laid out as src (its plan and group) from a,
// usable in the order of s, and fills it with src's layout by one copy in
// that order: the device copy of operands packed in pinned memory. The
// copy brings src's padding, which is zero, so nothing is cleared first:
// one allocator call and one copy, where Alloc and Transfer also clear.
func AllocCopy(a *devalloc.Allocator, src *Coalesced, s *devalloc.Stream) (*Coalesced, error) {
	if src == nil {
		return nil, fmt.Errorf("packing: alloc copy: nil source: %w", ErrInvalid)
	}
	if err := src.check(); err != nil {
		return nil, err
	}
	c, err := allocLayout(a, src.plan, src.group, 0, s, false, false)
	if err != nil {
		return nil, err
	}
	if err := Transfer(s, c, src); err != nil {
		_ = c.buf.Free()
		return nil, err
	}
	return c, nil
}

// AllocPrefixed allocates the buffer of group g with prefix bytes reserved
// before the layout, in one allocator call: room for a message header, so
// that the buffer holding the blocks is also the whole message and sending
// it copies nothing. The views start at Start() == prefix; the prefix is the
// caller's and its bytes are undefined until written. prefix must be a
// non-negative multiple of the plan's Align, so the blocks keep their
// alignment in memory.
func AllocPrefixed(a *devalloc.Allocator, p *Plan, g int, prefix int64, s *devalloc.Stream) (*Coalesced, error) {
	if p == nil {
		return nil, fmt.Errorf("packing: alloc prefixed: nil plan: %w", ErrInvalid)
	}
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("packing: alloc prefixed: group %d of %d: %w", g, len(p.groups), ErrOutOfRange)
	}
	if err := p.checkStart("alloc prefixed", prefix); err != nil {
		return nil, err
	}
	return allocGroupAt(a, p, g, prefix, s, false)
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
		return fmt.Errorf("packing: %s: start %d: want a multiple of %d in [0, 2^50]: %w", op, start, align, ErrBadAlign)
	}
	return nil
}

// maxElemSize is the largest element size: a layout that starts on a
// multiple of it keeps every block's elements aligned.
const maxElemSize = 16

func allocGroup(a *devalloc.Allocator, p *Plan, g int, s *devalloc.Stream, pinned bool) (*Coalesced, error) {
	return allocGroupAt(a, p, g, 0, s, pinned)
}

func allocGroupAt(a *devalloc.Allocator, p *Plan, g int, start int64, s *devalloc.Stream, pinned bool) (*Coalesced, error) {
	return allocLayout(a, p, g, start, s, pinned, true)
}

// allocLayout allocates group g of p after start bytes; clearPadding zeroes
// the padding in the order of s (AllocCopy's copy brings zero padding).
func allocLayout(a *devalloc.Allocator, p *Plan, g int, start int64, s *devalloc.Stream, pinned, clearPadding bool) (*Coalesced, error) {
	if a == nil {
		return nil, fmt.Errorf("packing: alloc: nil allocator: %w", ErrInvalid)
	}
	size := p.groups[g].Bytes
	if start > MaxBytes-size {
		return nil, fmt.Errorf("packing: alloc group %d: %d bytes after a %d-byte prefix exceed 2^50: %w", g, size, start, ErrOverflow)
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

// Wrap makes the views of group g of plan p over an existing buffer, such as
// a received message, without copying. The buffer must hold at least the
// group's bytes. The Coalesced takes ownership: its Free frees buf.
func Wrap(buf *devalloc.Buffer, p *Plan, g int) (*Coalesced, error) {
	if buf == nil || p == nil {
		return nil, fmt.Errorf("packing: wrap: nil buffer or plan: %w", ErrInvalid)
	}
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("packing: wrap: group %d of %d: %w", g, len(p.groups), ErrOutOfRange)
	}
	return wrap(buf, 0, p, g)
}

// WrapAt is Wrap for a layout that begins at byte off of buf, such as the
// payload of a received message after its header: the views start there and
// Start reports off. off must be a multiple of the plan's Align (of 16 for a
// plan from FromManifest). The Coalesced takes ownership of buf.
func WrapAt(buf *devalloc.Buffer, off int64, p *Plan, g int) (*Coalesced, error) {
	if buf == nil || p == nil {
		return nil, fmt.Errorf("packing: wrap at: nil buffer or plan: %w", ErrInvalid)
	}
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("packing: wrap at: group %d of %d: %w", g, len(p.groups), ErrOutOfRange)
	}
	if err := p.checkStart("wrap at", off); err != nil {
		return nil, err
	}
	return wrap(buf, off, p, g)
}

func wrap(buf *devalloc.Buffer, start int64, p *Plan, g int) (*Coalesced, error) {
	addr, size, _, err := buf.Region()
	if err != nil {
		return nil, fmt.Errorf("packing: wrap: %w", err)
	}
	need := p.groups[g].Bytes
	if size < need || start > size-need {
		return nil, fmt.Errorf("packing: wrap: buffer #%d holds %d bytes, the layout needs %d from byte %d: %w", buf.ID(), size, need, start, ErrOutOfRange)
	}
	c := &Coalesced{plan: p, group: g, buf: buf, start: start, base: addr + uintptr(start), size: need, n: p.groups[g].Blocks}
	if len(p.groups) > 1 {
		c.members, _ = p.Members(g)
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
		return fmt.Errorf("packing: nil coalesced buffer: %w", ErrInvalid)
	}
	if c.isFreed() {
		return fmt.Errorf("packing: coalesced buffer #%d: %w", c.buf.ID(), ErrFreed)
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

// Start is the byte offset in Buffer at which the layout begins: 0 unless
// the buffer came from AllocPrefixed or WrapAt. View offsets count from it.
func (c *Coalesced) Start() int64 { return c.start }

// Buffer is the underlying allocation; the layout occupies
// [Start, Start+Size) of it. Declare work on views with its Read and Write
// (or with the Coalesced's own); do not Free it directly.
func (c *Coalesced) Buffer() *devalloc.Buffer { return c.buf }

// Location says where the memory lives.
func (c *Coalesced) Location() devalloc.Location { return c.buf.Location() }

// Read declares that work about to be enqueued on s reads any of the views.
func (c *Coalesced) Read(s *devalloc.Stream) (*devalloc.Access, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return c.buf.Read(s)
}

// Write declares that work about to be enqueued on s writes any of the views.
func (c *Coalesced) Write(s *devalloc.Stream) (*devalloc.Access, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return c.buf.Write(s)
}

// Free releases the buffer once, after every completion recorded on it (the
// devalloc ledger). Every later use of the Coalesced or its views returns
// ErrFreed, a second Free included.
func (c *Coalesced) Free() error {
	if c == nil {
		return fmt.Errorf("packing: free of nil coalesced buffer: %w", ErrInvalid)
	}
	if c.owner != nil {
		return fmt.Errorf("packing: free of a part of joined buffer #%d: free the joined buffer: %w", c.buf.ID(), ErrInvalid)
	}
	if c.freed.Swap(true) {
		return fmt.Errorf("packing: double free of coalesced buffer #%d: %w", c.buf.ID(), ErrFreed)
	}
	if c.share != nil {
		return c.share.drop()
	}
	if err := c.buf.Free(); err != nil {
		return fmt.Errorf("packing: free: %w", err)
	}
	return nil
}

// View is one block inside a Coalesced: a handle of two words that reads
// the block's id, offset, shape, dtype and address from the plan's flat
// arrays, so making views costs nothing per block beyond the plan itself. It
// owns no memory: Addr and the host slices are valid until the Coalesced is
// freed, and any access through them must be declared on the Coalesced
// (Read/Write, then Access.Done). Host code that must also run on a GPU,
// where these slices do not exist, uses Coalesced.OnHost instead.
type View struct {
	c *Coalesced
	i int // plan index
}

func (v View) cls() *Class { return v.c.plan.class(v.i) }

// ID is the block's id.
func (v View) ID() uint64 { return v.c.plan.id(v.i) }

// Offset is the block's byte offset in the layout, counted from the
// Coalesced's Start.
func (v View) Offset() int64 { return v.c.plan.offset(v.i) }

// Addr is the block's address: a device pointer on device memory, a host
// address otherwise. It is valid until the Coalesced is freed.
func (v View) Addr() uintptr { return v.c.base + uintptr(v.c.plan.offset(v.i)) }

// Rows is the number of rows.
func (v View) Rows() int { return v.cls().Rows }

// Cols is the number of columns.
func (v View) Cols() int { return v.cls().Cols }

// DType is the element type.
func (v View) DType() DType { return v.cls().DType }

// Bytes is the size of the block's elements.
func (v View) Bytes() int64 { return v.cls().BlockBytes }

// Len is the number of elements.
func (v View) Len() int { cl := v.cls(); return cl.Rows * cl.Cols }

// PlanIndex is the block's index in the plan's descriptor list.
func (v View) PlanIndex() int { return v.i }

// Coalesced is the buffer the view belongs to.
func (v View) Coalesced() *Coalesced { return v.c }

// Desc is the block's descriptor.
func (v View) Desc() Desc {
	cl := v.cls()
	return Desc{ID: v.ID(), DType: cl.DType, Rows: cl.Rows, Cols: cl.Cols, Dest: v.c.Dest()}
}

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
	i := k
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

func (c *Coalesced) viewError(k int) error {
	if err := c.check(); err != nil { // nil or freed
		return err
	}
	return fmt.Errorf("packing: view %d of a buffer with %d blocks: %w", k, c.Len(), ErrOutOfRange)
}

// Lookup returns the view of the block with the given id.
func (c *Coalesced) Lookup(id uint64) (View, error) {
	if err := c.check(); err != nil {
		return View{}, err
	}
	i, ok := c.plan.Index(id)
	if !ok || c.plan.class(i).Group != c.group {
		return View{}, fmt.Errorf("packing: no block with id %d in this buffer: %w", id, ErrOutOfRange)
	}
	return View{c: c, i: i}, nil
}

// Position is the group position of the block with the given id: the index
// View, Locate and HostBlocks' typed methods take, and gemm's Triple names.
func (c *Coalesced) Position(id uint64) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	if k, ok := c.position(id); ok {
		return k, nil
	}
	return 0, fmt.Errorf("packing: no block with id %d in coalesced buffer #%d: %w", id, c.buf.ID(), ErrOutOfRange)
}

// position is Position without the checks of c. The first call on a plan
// builds a map of its ids (Plan.Index).
func (c *Coalesced) position(id uint64) (int, bool) {
	i, ok := c.plan.Index(id)
	if !ok || c.plan.class(i).Group != c.group {
		return 0, false
	}
	if c.members == nil {
		return i, true
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
		members := c.members
		for k := range c.n {
			i := k
			if members != nil {
				i = int(members[k])
			}
			if !yield(k, View{c: c, i: i}) {
				return
			}
		}
	}
}

// Views returns every view in group-position order.
func (c *Coalesced) Views() ([]View, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	out := make([]View, c.n)
	for k := range out {
		i := k
		if c.members != nil {
			i = int(c.members[k])
		}
		out[k] = View{c: c, i: i}
	}
	return out, nil
}

// hostPtr returns the block's host address after checking that it may be used.
func (v View) hostPtr(want DType) (unsafe.Pointer, error) {
	if v.c == nil {
		return nil, fmt.Errorf("packing: zero View: %w", ErrInvalid)
	}
	if err := v.c.check(); err != nil {
		return nil, err
	}
	if want != 0 && v.DType() != want {
		return nil, fmt.Errorf("packing: block id %d holds %s, not %s: %w", v.ID(), v.DType(), want, ErrInvalid)
	}
	if v.c.host == nil {
		return nil, fmt.Errorf("packing: block id %d is in %s memory (Coalesced.OnHost gives host slices on every backend): %w", v.ID(), v.c.buf.Location(), ErrNotHostAccessible)
	}
	return unsafe.Add(v.c.host, v.Offset()), nil
}

// Raw is the block's bytes on host-accessible memory (host backend, pinned).
// On device memory it fails with ErrNotHostAccessible, as the typed slices
// below do: code that must also run on a GPU reads and writes blocks
// through Coalesced.OnHost, whose HostBlocks gives the same slices, by
// block position, on every backend.
func (v View) Raw() ([]byte, error) {
	p, err := v.hostPtr(0)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), v.Bytes()), nil
}

// Float32s is the block's elements, row-major, for a Float32 block on
// host-accessible memory (see Raw, and Coalesced.OnHost for code that must
// also run on a GPU).
func (v View) Float32s() ([]float32, error) {
	p, err := v.hostPtr(Float32)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*float32)(p), v.Len()), nil
}

// Float64s is the block's elements for a Float64 block, on host-accessible
// memory only, as Float32s.
func (v View) Float64s() ([]float64, error) {
	p, err := v.hostPtr(Float64)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*float64)(p), v.Len()), nil
}

// Complex64s is the block's elements for a Complex64 block, on host-accessible
// memory only, as Float32s.
func (v View) Complex64s() ([]complex64, error) {
	p, err := v.hostPtr(Complex64)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*complex64)(p), v.Len()), nil
}

// Complex128s is the block's elements for a Complex128 block, on host-accessible
// memory only, as Float32s.
func (v View) Complex128s() ([]complex128, error) {
	p, err := v.hostPtr(Complex128)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*complex128)(p), v.Len()), nil
}
