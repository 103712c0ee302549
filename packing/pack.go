package packing

import (
	"fmt"
	"runtime"
	"sort"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"golang.org/x/sync/errgroup"
)

// Ref locates a block's bytes outside a coalesced buffer: an offset in some
// devalloc Buffer (a tensor's storage, a separately allocated block, a
// pinned staging area). The scattered side of a pack or unpack is one Ref per
// block, in group-position order: Plan.GroupPosition says where a block of
// the descriptor list goes.
type Ref struct {
	Buf *devalloc.Buffer
	Off int64
}

// copyMethod is how a Mover moves bytes.
type copyMethod int

const (
	// copyAuto picks copyHost when every byte is host-accessible, else
	// copyKernel when everything is device memory and the kernel can be
	// built, else copyBatch when the runtime has it, else copyPerBlock.
	copyAuto copyMethod = iota
	// copyHost copies on the host with goroutines, inside the stream's order.
	copyHost
	// copyKernel runs the gather/scatter kernel over an offset table.
	copyKernel
	// copyBatch enqueues one cudaMemcpyBatchAsync.
	copyBatch
	// copyPerBlock enqueues one cudaMemcpyAsync per block.
	copyPerBlock
)

func (m copyMethod) String() string {
	switch m {
	case copyAuto:
		return "auto"
	case copyHost:
		return "host"
	case copyKernel:
		return "kernel"
	case copyBatch:
		return "memcpy-batch"
	case copyPerBlock:
		return "memcpy-per-block"
	}
	return fmt.Sprintf("copyMethod(%d)", int(m))
}

// Mover moves the blocks of a Coalesced to and from their scattered
// locations, repeatedly: the validation, the address table and (for the
// kernel) its device copy are made once by NewMover. A Mover owns its device
// table until Close; it does not own the Coalesced or the Refs' buffers.
type Mover struct {
	c        *Coalesced
	bufs     []*devalloc.Buffer // distinct buffers of the refs
	method   copyMethod
	fallback string
	bytes    int64
	dev      int

	// copyHost: block and ref host addresses, sizes, and the split of the
	// blocks among workers (balanced by bytes).
	blkHost, refHost []unsafe.Pointer
	parts            []span

	// Device methods: addresses and sizes; table is the kernel's copy of them.
	blkAddr, refAddr, sizes []uintptr
	table                   *devalloc.Buffer
	entries                 int // rows of the kernel's table
	closed                  bool
}

type span struct{ lo, hi int }

// NewMover validates refs (one per block of c, in group-position order, each
// range inside its buffer, none overlapping another or c's own buffer) and
// prepares the copy. Setup work (the kernel's table upload) is enqueued on
// s. The Mover copies on the host, with goroutines, when every byte is
// host-accessible; by the gather kernel when everything is device memory;
// else, or when the kernel cannot be built, by one cudaMemcpyBatchAsync
// (CUDA 12.8+), else by one cudaMemcpyAsync per block. Method says which.
func NewMover(s *devalloc.Stream, c *Coalesced, refs []Ref) (*Mover, error) {
	return newMover(s, c, refs, copyAuto)
}

// newMover is NewMover with the copy method chosen (copyAuto: as NewMover
// chooses), for the tests and benchmarks that compare them.
func newMover(s *devalloc.Stream, c *Coalesced, refs []Ref, method copyMethod) (*Mover, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if s == nil {
		return nil, fmt.Errorf("packing: mover: nil stream: %w", distbuf.ErrInvalid)
	}
	n := c.Len()
	if len(refs) != n {
		return nil, fmt.Errorf("packing: mover: %d refs for %d blocks: %w", len(refs), n, distbuf.ErrInvalid)
	}
	m := &Mover{c: c, dev: c.buf.Allocator().Info().Device}
	sizes := make([]int64, n)
	allHost := c.host != nil
	allDevice := c.buf.Location() == devalloc.OnDevice
	seen := make(map[*devalloc.Buffer]int)
	for k, r := range refs {
		v := c.viewAt(k)
		sizes[k] = v.bytes()
		if r.Buf == nil {
			return nil, fmt.Errorf("packing: mover: ref %d (block id %d): nil buffer: %w", k, v.id(), distbuf.ErrInvalid)
		}
		if r.Buf == c.buf {
			return nil, fmt.Errorf("packing: mover: ref %d (block id %d) overlaps the coalesced buffer: it points into it: %w", k, v.id(), distbuf.ErrInvalid)
		}
		if r.Off < 0 || r.Off > r.Buf.Size()-sizes[k] {
			return nil, fmt.Errorf("packing: mover: ref %d (block id %d): bytes [%d, %d+%d) outside buffer #%d of %d bytes: %w",
				k, v.id(), r.Off, r.Off, sizes[k], r.Buf.ID(), r.Buf.Size(), distbuf.ErrInvalid)
		}
		if _, ok := seen[r.Buf]; !ok {
			seen[r.Buf] = len(m.bufs)
			m.bufs = append(m.bufs, r.Buf)
			loc := r.Buf.Location()
			allHost = allHost && loc.HostAccessible()
			allDevice = allDevice && loc == devalloc.OnDevice
		}
		m.bytes += sizes[k]
	}
	if err := checkRefsDisjoint(refs, sizes); err != nil {
		return nil, err
	}
	auto := method == copyAuto
	if auto {
		switch {
		case allHost:
			method = copyHost
		case allDevice:
			method = copyKernel
		default:
			method = copyBatch
		}
	}
	var err error
	switch method {
	case copyHost:
		if !allHost {
			return nil, fmt.Errorf("packing: mover: host copy of device memory: %w", distbuf.ErrNotHostAccessible)
		}
		err = m.prepareHost(refs, sizes)
	case copyKernel, copyBatch, copyPerBlock:
		if allHost && c.buf.Location() != devalloc.Pinned {
			return nil, fmt.Errorf("packing: mover: %s on the host backend: %w", method, distbuf.ErrUnavailable)
		}
		err = m.prepareDevice(s, refs, sizes, method, auto, method == copyKernel && !allDevice)
	default:
		return nil, fmt.Errorf("packing: mover: copy method %v: %w", method, distbuf.ErrInvalid)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// viewAt is View without the checks NewMover has already made.
func (c *Coalesced) viewAt(k int) View {
	if c.members != nil {
		return View{c: c, i: int(c.members[k])}
	}
	return View{c: c, i: c.first + k}
}

// checkRefsDisjoint rejects refs whose byte ranges overlap in one buffer:
// an unpack would write them in an undefined order.
func checkRefsDisjoint(refs []Ref, sizes []int64) error {
	order := make([]int, len(refs))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		ra, rb := refs[order[a]], refs[order[b]]
		if ra.Buf != rb.Buf {
			return ra.Buf.ID() < rb.Buf.ID()
		}
		return ra.Off < rb.Off
	})
	for k := 1; k < len(order); k++ {
		p, q := order[k-1], order[k]
		if refs[p].Buf == refs[q].Buf && refs[p].Off+sizes[p] > refs[q].Off {
			return fmt.Errorf("packing: mover: refs %d and %d overlap in buffer #%d at byte %d: %w", p, q, refs[q].Buf.ID(), refs[q].Off, distbuf.ErrInvalid)
		}
	}
	return nil
}

func (m *Mover) prepareHost(refs []Ref, sizes []int64) error {
	m.method = copyHost
	n := len(refs)
	m.blkHost = make([]unsafe.Pointer, n)
	m.refHost = make([]unsafe.Pointer, n)
	bases := make(map[*devalloc.Buffer]unsafe.Pointer, len(m.bufs))
	for _, b := range m.bufs {
		mem, err := b.Bytes()
		if err != nil {
			return fmt.Errorf("packing: mover: %w", err)
		}
		bases[b] = unsafe.Pointer(unsafe.SliceData(mem))
	}
	for k, r := range refs {
		m.blkHost[k] = unsafe.Add(m.c.host, m.c.viewAt(k).Offset())
		m.refHost[k] = unsafe.Add(bases[r.Buf], r.Off)
	}
	m.parts = splitByBytes(sizes, m.bytes)
	m.sizes = make([]uintptr, n)
	for k, sz := range sizes {
		m.sizes[k] = uintptr(sz)
	}
	return nil
}

// parallelCopyMin is the amount of data below which one goroutine copies
// everything: starting workers costs more than it saves.
const parallelCopyMin = 256 << 10

// splitByBytes cuts the block list into contiguous parts of about equal
// bytes, one per worker.
func splitByBytes(sizes []int64, total int64) []span {
	workers := int(min(int64(runtime.GOMAXPROCS(0)), total/parallelCopyMin))
	if workers <= 1 || len(sizes) < 2 {
		return []span{{0, len(sizes)}}
	}
	parts := make([]span, 0, workers)
	per := total / int64(workers)
	lo, acc := 0, int64(0)
	for i, sz := range sizes {
		acc += sz
		if acc >= per*int64(len(parts)+1) && len(parts) < workers-1 {
			parts = append(parts, span{lo, i + 1})
			lo = i + 1
		}
	}
	return append(parts, span{lo, len(sizes)})
}

// hostCopyFunc copies every block (blocks to refs when unpack) with the
// parts running in parallel. It runs inside Stream.Enqueue.
func hostCopyFunc(dst, src []unsafe.Pointer, sizes []uintptr, parts []span) func() error {
	copyRange := func(p span) {
		for i := p.lo; i < p.hi; i++ {
			copy(unsafe.Slice((*byte)(dst[i]), sizes[i]), unsafe.Slice((*byte)(src[i]), sizes[i]))
		}
	}
	return func() error {
		if len(parts) == 1 {
			copyRange(parts[0])
			return nil
		}
		var g errgroup.Group
		for _, p := range parts {
			g.Go(func() error { copyRange(p); return nil })
		}
		return g.Wait()
	}
}

// Method says how the Mover copies: "host", "kernel", "memcpy-batch" or
// "memcpy-per-block", followed, when the gather kernel was wanted but could
// not be had, by why.
func (m *Mover) Method() string {
	if m.fallback != "" {
		return m.method.String() + " (" + m.fallback + ")"
	}
	return m.method.String()
}

// Pack copies every ref into its block of the coalesced buffer, in the order
// of s: it waits for the refs' writers and the buffer's readers through the
// ledger and records its own completion.
func (m *Mover) Pack(s *devalloc.Stream) error { return m.run(s, false) }

// Unpack copies every block of the coalesced buffer out to its ref.
func (m *Mover) Unpack(s *devalloc.Stream) error { return m.run(s, true) }

func (m *Mover) run(s *devalloc.Stream, unpack bool) (err error) {
	if m.closed {
		return fmt.Errorf("packing: mover used after Close: %w", distbuf.ErrInvalid)
	}
	if err := m.c.check(); err != nil {
		return err
	}
	// Declare: the coalesced side is written by a pack and read by an
	// unpack; the refs the other way round; the kernel table is read.
	var open []*devalloc.Access
	defer func() {
		for _, x := range open {
			if derr := x.Done(); derr != nil && err == nil {
				err = fmt.Errorf("packing: %w", derr)
			}
		}
	}()
	declare := func(b *devalloc.Buffer, write bool) error {
		var x *devalloc.Access
		var err error
		if write {
			x, err = b.Write(s)
		} else {
			x, err = b.Read(s)
		}
		if err != nil {
			return fmt.Errorf("packing: %w", err)
		}
		open = append(open, x)
		return nil
	}
	if err := declare(m.c.buf, !unpack); err != nil {
		return err
	}
	for _, b := range m.bufs {
		if err := declare(b, unpack); err != nil {
			return err
		}
	}
	if m.table != nil {
		if err := declare(m.table, false); err != nil {
			return err
		}
	}
	if m.method == copyHost {
		dst, src := m.blkHost, m.refHost
		if unpack {
			dst, src = src, dst
		}
		return s.Enqueue(hostCopyFunc(dst, src, m.sizes, m.parts))
	}
	return m.runDevice(s, unpack)
}

// Close releases the device table. The Mover cannot be used afterwards.
func (m *Mover) Close() error {
	if m.closed {
		return fmt.Errorf("packing: mover closed twice: %w", distbuf.ErrInvalid)
	}
	m.closed = true
	if m.table != nil {
		return m.table.Free()
	}
	return nil
}

// transfer copies src's whole layout into dst with one copy, in the order of
// s: the move between device memory and a pinned staging copy (OnHost,
// PackHost, UnpackHost, Alloc's CopyOf), either way. Both must hold the same
// group of the same plan.
func transfer(s *devalloc.Stream, dst, src *Coalesced) error {
	if err := dst.check(); err != nil {
		return err
	}
	if err := src.check(); err != nil {
		return err
	}
	if dst.plan != src.plan || dst.group != src.group {
		return fmt.Errorf("packing: transfer between different layouts: %w", distbuf.ErrInvalid)
	}
	if dst.buf == src.buf {
		return fmt.Errorf("packing: transfer of a buffer onto itself: source and destination overlap: %w", distbuf.ErrInvalid)
	}
	if src.size == 0 {
		return nil
	}
	if err := s.Copy(dst.buf, dst.start, src.buf, src.start, src.size); err != nil {
		return fmt.Errorf("packing: transfer: %w", err)
	}
	return nil
}

// checkSlices validates one Go slice per block, each exactly a block's size.
func checkSlices(c *Coalesced, blocks [][]byte) ([]int64, int64, error) {
	if len(blocks) != c.Len() {
		return nil, 0, fmt.Errorf("packing: %d slices for %d blocks: %w", len(blocks), c.Len(), distbuf.ErrInvalid)
	}
	sizes := make([]int64, len(blocks))
	var total int64
	for k, b := range blocks {
		v := c.viewAt(k)
		if int64(len(b)) != v.bytes() {
			return nil, 0, fmt.Errorf("packing: slice %d (block id %d) has %d bytes, the block %d: %w", k, v.id(), len(b), v.bytes(), distbuf.ErrInvalid)
		}
		sizes[k] = v.bytes()
		total += sizes[k]
	}
	return sizes, total, nil
}

// hostSide checks c and the slices of PackHost or UnpackHost, and returns
// the layout that the host copy works on: c where its memory is
// host-accessible, else a pinned staging copy of its layout, whose padding
// is zeroed when clearPadding. sizes and total are checkSlices's.
func hostSide(s *devalloc.Stream, c *Coalesced, slices [][]byte, clearPadding bool) (host *Coalesced, sizes []int64, total int64, err error) {
	if err = c.check(); err != nil {
		return nil, nil, 0, err
	}
	if sizes, total, err = checkSlices(c, slices); err != nil {
		return nil, nil, 0, err
	}
	if c.host != nil {
		return c, sizes, total, nil
	}
	if host, err = allocLayout(c.buf.Allocator(), c.plan, c.group, 0, s, true, clearPadding); err != nil {
		return nil, nil, 0, err
	}
	return host, sizes, total, nil
}

// enqueueHostCopy enqueues on s the copy of the slices into c's blocks on
// the host, or of the blocks into the slices when unpack, under the caller's
// hold on c's buffer. sizes and total are checkSlices's.
func enqueueHostCopy(s *devalloc.Stream, c *Coalesced, slices [][]byte, sizes []int64, total int64, unpack bool) error {
	blks, ptrs, usz := make([]unsafe.Pointer, len(slices)), make([]unsafe.Pointer, len(slices)), make([]uintptr, len(slices))
	for k := range slices {
		blks[k] = unsafe.Add(c.host, c.viewAt(k).Offset())
		usz[k] = uintptr(sizes[k])
	}
	parts := splitByBytes(sizes, total)
	return s.Enqueue(func() error {
		for k, b := range slices {
			if len(b) > 0 {
				ptrs[k] = unsafe.Pointer(unsafe.SliceData(b))
			}
		}
		if unpack {
			return hostCopyFunc(ptrs, blks, usz, parts)()
		}
		return hostCopyFunc(blks, ptrs, usz, parts)()
	})
}

// PackHost copies Go slices, one per block in group-position order, into
// dst in the order of s, with parallel goroutines. The slices are read when
// the stream reaches this point: do not modify them before it has (an event
// or Synchronize). On device memory the blocks are packed into a pinned
// staging buffer first and moved by one copy.
func PackHost(s *devalloc.Stream, dst *Coalesced, src [][]byte) error {
	target, sizes, total, err := hostSide(s, dst, src, true)
	if err != nil {
		return err
	}
	w, err := target.buf.Write(s)
	if err != nil {
		return err
	}
	err = enqueueHostCopy(s, target, src, sizes, total, false)
	if derr := w.Done(); err == nil {
		err = derr
	}
	if target != dst {
		if err == nil {
			err = transfer(s, dst, target)
		}
		if ferr := target.Free(); err == nil {
			err = ferr
		}
	}
	return err
}

// UnpackHost copies src's blocks into Go slices, one per block in
// group-position order, in the order of s. The slices are written when the
// stream reaches this point: read them after an event or Synchronize.
func UnpackHost(s *devalloc.Stream, src *Coalesced, dst [][]byte) error {
	from, sizes, total, err := hostSide(s, src, dst, false)
	if err != nil {
		return err
	}
	if from != src {
		if err = transfer(s, from, src); err != nil {
			_ = from.Free()
			return err
		}
	}
	r, err := from.buf.Read(s)
	if err == nil {
		err = enqueueHostCopy(s, from, dst, sizes, total, true)
		if derr := r.Done(); err == nil {
			err = derr
		}
	}
	if from != src {
		if ferr := from.Free(); err == nil {
			err = ferr
		}
	}
	return err
}
