package packing

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"sync"
)

// Desc describes one block: a dense rows x cols matrix of DType elements,
// stored row-major (element (r, c) at index r*Cols + c).
type Desc struct {
	ID    uint64 // unique within a plan
	DType DType
	Rows  int
	Cols  int
	// Dest is the destination rank. A plan groups blocks by Dest and lays
	// out each group in its own buffer (one message per destination); leave
	// it 0 for a plan with a single buffer.
	Dest int
}

// Bytes is the size of the block's elements, without padding.
func (d Desc) Bytes() int64 { return int64(d.Rows) * int64(d.Cols) * d.DType.Size() }

// Options configures a layout. The zero Options gives 256-byte aligned shape
// classes with tightly packed blocks inside each class.
type Options struct {
	// Align is the alignment in bytes of the first block of every shape class
	// and the rounding of each group's size: a power of two in [16, 1 MiB].
	// 0 means DefaultAlign.
	Align int64
	// BlockAlign is the alignment of every block inside its class, so the
	// class stride is the block size rounded up to it: a power of two no
	// larger than Align. 0 means the element size (no padding between
	// blocks of one class). Set it to Align to start every block on its own
	// aligned boundary.
	BlockAlign int64
}

// DefaultAlign is the alignment of shape classes when Options.Align is 0.
const DefaultAlign = 256

// MaxBytes bounds the size of one group's buffer (the allocator's own limit).
const MaxBytes = 1 << 50

// maxDim keeps every dimension usable by a 32-bit BLAS.
const maxDim = math.MaxInt32

// maxDest bounds destination ranks.
const maxDest = math.MaxInt32

func (o Options) resolve() (Options, error) {
	if o.Align == 0 {
		o.Align = DefaultAlign
	}
	if o.Align < 16 || o.Align > 1<<20 || o.Align&(o.Align-1) != 0 {
		return o, fmt.Errorf("packing: Options.Align %d: want a power of two in [16, 1048576]: %w", o.Align, ErrBadAlign)
	}
	if o.BlockAlign < 0 || o.BlockAlign > o.Align || o.BlockAlign&(o.BlockAlign-1) != 0 {
		return o, fmt.Errorf("packing: Options.BlockAlign %d: want 0 or a power of two no larger than Align (%d): %w", o.BlockAlign, o.Align, ErrBadAlign)
	}
	return o, nil
}

// Class is one shape class of a group: blocks of equal dtype and shape, laid
// out from Offset at a constant Stride, in the order of the descriptor list.
// A class is therefore one strided batch.
type Class struct {
	Group      int
	DType      DType
	Rows, Cols int
	Count      int
	Offset     int64 // byte offset of the first block in the group's buffer
	Stride     int64 // bytes from one block to the next; 0 when !Regular
	BlockBytes int64 // rows * cols * element size
	// Regular is true when the blocks sit at a constant Stride. Plans made by
	// NewPlan are always regular; FromManifest keeps the sender's offsets.
	Regular bool
}

// Group is the part of a plan bound for one destination: one buffer.
type Group struct {
	Dest   int
	Blocks int   // number of blocks
	Bytes  int64 // payload size, padding included; the buffer size
	// Classes indexes Plan.Classes: the group's classes in layout order.
	Classes []int
}

// Plan maps block descriptors to a layout: for each destination group, one
// buffer in which every block has a byte offset. A Plan is immutable and
// safe for concurrent use.
//
// Blocks are addressed by their index in the descriptor list ("plan index")
// or, inside one group, by their position among that group's blocks in list
// order ("group position"); for a single-group plan the two are equal.
type Plan struct {
	opts Options
	ids  []uint64 // by plan index
	// meta holds each block's class and its rank in the class (offset =
	// class Offset + rank*Stride) as class<<rankBits | rank: four bytes a
	// block, which halves what the views read and shrinks what NewPlan
	// allocates. When the classes outnumber what the bits that ranks leave
	// can count, and for a manifest plan, meta holds the class alone
	// (rankBits 0) and offs every offset.
	meta     []uint32
	rankBits uint8
	rankMask uint32
	offs     []int64 // explicit offsets; nil when meta gives them
	classes  []Class
	groups   []Group

	membersOnce sync.Once
	members     [][]int32 // per group: plan indices in list order (nil for a single group)

	indexOnce sync.Once
	index     map[uint64]int32
}

// manifest reports whether the plan came from FromManifest, whose classes
// may interleave (NewPlan always resolves a non-zero Align).
func (p *Plan) manifest() bool { return p.opts.Align == 0 }

// class is the class of block i. (rankBits is below 32; masking it lets the
// compiler drop the check for longer shifts here and in offset.)
func (p *Plan) class(i int) *Class {
	return &p.classes[p.meta[i]>>(p.rankBits&31)]
}

// classTable finds the class of a (dest, dtype, rows, cols) key: open
// addressing over one flat array of entries, no per-block allocation.
type classTable struct {
	entries []classEntry
	shift   uint // 64 - log2(len(entries))
	keys    []classKey
}

type classKey struct{ rc, dd uint64 }

type classEntry struct {
	key   classKey
	class int32 // class index + 1; 0 marks an empty entry
}

func (t *classTable) init(logSize uint) {
	t.entries = make([]classEntry, 1<<logSize)
	t.shift = 64 - logSize
}

// find returns the class index of k, or -1 and the empty entry to fill.
func (t *classTable) find(k classKey) (int32, int) {
	mask := len(t.entries) - 1
	h := int(((k.rc ^ k.dd<<40 ^ k.dd>>24) * 0x9E3779B97F4A7C15) >> t.shift)
	for {
		e := &t.entries[h]
		if e.class == 0 {
			return -1, h
		}
		if e.key == k {
			return e.class - 1, h
		}
		h = (h + 1) & mask
	}
}

func (t *classTable) insert(k classKey, slot int) int32 {
	t.keys = append(t.keys, k)
	c := int32(len(t.keys))
	t.entries[slot] = classEntry{key: k, class: c}
	if len(t.keys)*2 > len(t.entries) {
		t.init(64 - t.shift + 1)
		for i, ok := range t.keys {
			_, s := t.find(ok)
			t.entries[s] = classEntry{key: ok, class: int32(i + 1)}
		}
	}
	return c - 1
}

// directSize is the size of the direct class table: a slot for each dtype
// and shape up to 32x32.
const directSize = 4 << 10

// directSlot is the direct table slot of a block, and whether the block has
// one: a single-destination block of valid dtype and a shape up to 32x32.
func directSlot(d *Desc) (uint, bool) {
	r, c, t := uint(d.Rows-1), uint(d.Cols-1), uint(d.DType-1)
	return (t<<10 | r<<5 | c) & (directSize - 1), (r|c)>>5|t>>2|uint(d.Dest) == 0
}

// classifier is pass 1's state apart from the per-block loop. A class's
// counter word is the place its next block gets (class<<rankBits | rank),
// so that one load and one increment give a block both its class and its
// rank.
type classifier struct {
	rankBits   uint
	maxClasses int // how many classes the plan's place encoding holds
	tab        classTable
	counts     []uint64 // counter words by class; the direct table holds those of its classes
	lastKey    classKey
	lastClass  int32
}

// noClass marks an unused direct table slot: no counter word reaches it,
// since a class index is below 2^31.
const noClass = math.MaxUint64

// errTooManyClasses tells NewPlan to classify again with 64-bit places.
var errTooManyClasses = errors.New("packing: more classes than 32-bit places hold")

func newClassifier(rankBits uint) classifier {
	cf := classifier{rankBits: rankBits, maxClasses: math.MaxInt, lastClass: -1}
	if rankBits < 32 {
		cf.maxClasses = 1 << (32 - rankBits)
	}
	cf.tab.init(6)
	return cf
}

// classify is pass 1: it records each block's id and place and counts the
// classes. It reports whether ids may repeat: ids that increase cannot.
// direct, when not nil, is room for the counter words of single-destination
// classes of small shapes by directSlot, so that most blocks find theirs
// with one load. The inner loop leaves for the others only, which keeps the
// call to slow, and the registers it needs saved, out of its way.
func classify[P uint32 | int64](cf *classifier, descs []Desc, ids []uint64, places []P, direct *[directSize]uint64) (unordered bool, err error) {
	n := len(descs)
	ids, places = ids[:n], places[:n]
	if direct != nil {
		for s := range direct {
			direct[s] = noClass
		}
	}
	// prev is the last id, or MaxUint64 for good once an id does not
	// increase (an id of MaxUint64 itself only costs the full check).
	var prev uint64
	for i := 0; i < n; i++ {
		if direct != nil {
			for ; i < n; i++ {
				d := &descs[i]
				s, ok := directSlot(d)
				if !ok || direct[s] == noClass {
					break
				}
				if d.ID > prev {
					prev = d.ID
				} else {
					prev = math.MaxUint64
				}
				e := direct[s]
				direct[s] = e + 1
				ids[i] = d.ID
				places[i] = P(e)
			}
			if i == n {
				break
			}
		}
		// Block 0 always comes here, the direct table being empty.
		d := &descs[i]
		if i == 0 || d.ID > prev {
			prev = d.ID
		} else {
			prev = math.MaxUint64
		}
		w, err := cf.slow(i, d, direct)
		if err != nil {
			return false, err
		}
		e := *w
		*w = e + 1
		ids[i] = d.ID
		places[i] = P(e)
	}
	return prev == math.MaxUint64, nil
}

// slow returns the counter word of block i's class for every block the
// direct table does not hold, after validating the block, and creates the
// class on its first block. direct is an argument rather than a field so
// that it can stay on NewPlan's stack.
func (cf *classifier) slow(i int, d *Desc, direct *[directSize]uint64) (*uint64, error) {
	if uint64(d.Rows-1) >= maxDim || uint64(d.Cols-1) >= maxDim || uint8(d.DType-1) > 3 || uint64(d.Dest) > maxDest {
		return nil, badDesc(i, d)
	}
	k := classKey{rc: uint64(d.Rows)<<32 | uint64(d.Cols), dd: uint64(d.Dest)<<8 | uint64(d.DType)}
	s, inDirect := directSlot(d)
	inDirect = inDirect && direct != nil
	if !inDirect && cf.lastClass >= 0 && k == cf.lastKey {
		return &cf.counts[cf.lastClass], nil
	}
	c, slot := cf.tab.find(k)
	if c < 0 {
		if !fits(d) {
			return nil, &BlockError{Index: i, ID: d.ID, Reason: fmt.Sprintf("%dx%d %s is more than 2^50 bytes", d.Rows, d.Cols, d.DType), Err: ErrOverflow}
		}
		if len(cf.counts) == cf.maxClasses {
			return nil, errTooManyClasses
		}
		c = cf.tab.insert(k, slot)
		cf.counts = append(cf.counts, uint64(c)<<cf.rankBits)
	}
	if inDirect {
		// The class counts in the direct table; its word in counts stays at
		// 0 blocks until NewPlan adds the two.
		direct[s] = uint64(c) << cf.rankBits
		return &direct[s], nil
	}
	cf.lastKey, cf.lastClass = k, c
	return &cf.counts[c], nil
}

// NewPlan lays out the blocks. It runs in two passes over the descriptors,
// as DBCSR does: the first classifies each block into its (destination,
// dtype, shape) class and counts it, the second prefix-sums the class sizes
// into offsets. The layout depends only on the list and the options: groups
// in increasing Dest, classes in order of first appearance, blocks of a
// class in list order.
func NewPlan(descs []Desc, opts Options) (*Plan, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	n := len(descs)
	if int64(n) > math.MaxInt32 {
		return nil, fmt.Errorf("packing: %d blocks: at most 2^31-1 per plan: %w", n, ErrOverflow)
	}
	// A block's class and rank fit in 32 bits unless the classes outnumber
	// what the bits that ranks leave can count; then classify again with 64
	// bits, kept in offs until pass 2 turns them into offsets.
	rankBits := uint(bits.Len(uint(n)))
	p := &Plan{opts: o, ids: make([]uint64, n), meta: make([]uint32, n), rankBits: uint8(rankBits), rankMask: 1<<rankBits - 1}
	// Only plans large enough to repay filling the direct table use it.
	var direct *[directSize]uint64
	if n >= 1<<12 {
		direct = new([directSize]uint64)
	}
	cf := newClassifier(rankBits)
	unordered, err := classify(&cf, descs, p.ids, p.meta, direct)
	if err == errTooManyClasses {
		p.offs, p.rankBits, p.rankMask = make([]int64, n), 0, 0
		cf = newClassifier(32)
		unordered, err = classify(&cf, descs, p.ids, p.offs, direct)
	}
	if err != nil {
		return nil, err
	}
	if unordered {
		minID, maxID := uint64(math.MaxUint64), uint64(0)
		for _, id := range p.ids {
			minID = min(minID, id)
			maxID = max(maxID, id)
		}
		if err := checkUniqueIDs(p.ids, minID, maxID); err != nil {
			return nil, err
		}
	}
	counts := cf.counts
	countMask := uint64(1)<<cf.rankBits - 1
	if direct != nil {
		for _, e := range direct {
			if e != noClass {
				counts[e>>cf.rankBits] += e & countMask
			}
		}
	}
	tab := &cf.tab

	// Pass 2: order the classes (by destination, then first appearance) and
	// prefix-sum their sizes into class offsets. A block's offset is its
	// class's offset plus rank times stride, computed when asked for, so this
	// pass touches classes only (but for the explicit offsets of a plan with
	// too many classes for 32-bit places).
	p.classes = make([]Class, len(tab.keys))
	order := make([]int, len(tab.keys))
	for c, k := range tab.keys {
		dt := DType(k.dd & 0xff)
		rows, cols := int(k.rc>>32), int(k.rc&0xffffffff)
		bb := int64(rows) * int64(cols) * dt.Size()
		ba := max(o.BlockAlign, dt.Size())
		p.classes[c] = Class{DType: dt, Rows: rows, Cols: cols, Count: int(counts[c] & countMask), BlockBytes: bb, Stride: alignUp(bb, ba), Regular: true}
		order[c] = c
	}
	dest := func(c int) int { return int(tab.keys[c].dd >> 8) }
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(dest(a), dest(b)) })
	// Each group's Classes is its run of order, capped so that an append
	// cannot reach the next group's.
	var cursor int64
	first := 0 // where the current group's run of order begins
	closeGroup := func(end int) {
		g := &p.groups[len(p.groups)-1]
		g.Bytes = alignUp(cursor, o.Align)
		g.Classes = order[first:end:end]
	}
	for k, c := range order {
		cl := &p.classes[c]
		if len(p.groups) == 0 || p.groups[len(p.groups)-1].Dest != dest(c) {
			if len(p.groups) > 0 {
				closeGroup(k)
			}
			p.groups = append(p.groups, Group{Dest: dest(c)})
			cursor, first = 0, k
		}
		g := &p.groups[len(p.groups)-1]
		cl.Group = len(p.groups) - 1
		cursor = alignUp(cursor, o.Align)
		if int64(cl.Count) > (MaxBytes-cursor)/cl.Stride {
			return nil, fmt.Errorf("packing: group for rank %d exceeds 2^50 bytes: %w", g.Dest, ErrOverflow)
		}
		cl.Offset = cursor
		cursor += cl.Stride * int64(cl.Count)
		g.Blocks += cl.Count
	}
	if len(p.groups) > 0 {
		closeGroup(len(order))
	} else {
		p.groups = []Group{{}}
	}
	if p.offs != nil {
		// Classified with 64 bits: the class goes to meta, the offset to offs.
		for i, w := range p.offs {
			c := uint32(uint64(w) >> 32)
			cl := &p.classes[c]
			p.meta[i] = c
			p.offs[i] = cl.Offset + int64(uint32(w))*cl.Stride
		}
	}
	return p, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

// fits reports whether a block of valid dims and dtype is at most MaxBytes,
// without overflowing (rows*cols < 2^62, but times 16 would not fit).
func fits(d *Desc) bool {
	return int64(d.Rows)*int64(d.Cols) <= MaxBytes/d.DType.Size()
}

func badDesc(i int, d *Desc) error {
	e := &BlockError{Index: i, ID: d.ID}
	switch {
	case !d.DType.Valid():
		e.Reason, e.Err = fmt.Sprintf("dtype %d", uint8(d.DType)), ErrBadDType
	case d.Rows <= 0 || d.Cols <= 0:
		e.Reason, e.Err = fmt.Sprintf("shape %dx%d: dimensions must be positive", d.Rows, d.Cols), ErrBadShape
	case d.Dest < 0 || d.Dest > maxDest:
		e.Reason, e.Err = fmt.Sprintf("destination rank %d", d.Dest), ErrInvalid
	default:
		e.Reason, e.Err = fmt.Sprintf("shape %dx%d: dimensions must be below 2^31", d.Rows, d.Cols), ErrBadShape
	}
	return e
}

// checkUniqueIDs finds a duplicate id with a bitmap when the ids are dense
// and an open-addressing set otherwise.
func checkUniqueIDs(ids []uint64, lo, hi uint64) error {
	n := len(ids)
	if n < 2 {
		return nil
	}
	dup := -1
	if span := hi - lo; span < uint64(n)*32 {
		bitmap := make([]uint64, span/64+1)
		for i, id := range ids {
			v := id - lo
			w, b := v>>6, uint64(1)<<(v&63)
			if bitmap[w]&b != 0 {
				dup = i
				break
			}
			bitmap[w] |= b
		}
	} else {
		size := 1 << bits.Len(uint(2*n-1))
		set := make([]uint64, size)
		mask := uint64(size - 1)
		zero := false
		for i, id := range ids {
			if id == 0 {
				if zero {
					dup = i
					break
				}
				zero = true
				continue
			}
			h := id * 0x9E3779B97F4A7C15
			for h = (h ^ h>>29) & mask; set[h] != 0 && set[h] != id; h = (h + 1) & mask {
			}
			if set[h] == id {
				dup = i
				break
			}
			set[h] = id
		}
	}
	if dup < 0 {
		return nil
	}
	first := 0
	for ids[first] != ids[dup] {
		first++
	}
	return &BlockError{Index: dup, ID: ids[dup], Reason: fmt.Sprintf("id already used by block %d", first), Err: ErrDuplicateID}
}

// Options returns the resolved options (defaults filled in).
func (p *Plan) Options() Options { return p.opts }

// Len is the number of blocks.
func (p *Plan) Len() int { return len(p.ids) }

// Groups lists the destination groups in increasing Dest. A plan always has
// at least one group (an empty plan has one empty group).
func (p *Plan) Groups() []Group { return p.groups }

// Classes lists the shape classes; Group.Classes says which belong to a group.
func (p *Plan) Classes() []Class { return p.classes }

// Block returns the descriptor and offset of the block at plan index i.
func (p *Plan) Block(i int) (Desc, int64, error) {
	if i < 0 || i >= len(p.ids) {
		return Desc{}, 0, fmt.Errorf("packing: block index %d outside a plan of %d blocks: %w", i, len(p.ids), ErrOutOfRange)
	}
	cl := p.class(i)
	return Desc{ID: p.ids[i], DType: cl.DType, Rows: cl.Rows, Cols: cl.Cols, Dest: p.groups[cl.Group].Dest}, p.offset(i), nil
}

// offset is the byte offset of block i in its group's buffer.
func (p *Plan) offset(i int) int64 {
	// The class first, as class does it, so that a caller that also asks
	// for the shape loads the block's meta and class once.
	m := p.meta[i]
	cl := &p.classes[m>>(p.rankBits&31)]
	if p.offs != nil {
		return p.offs[i]
	}
	return cl.Offset + int64(m&p.rankMask)*cl.Stride
}

// Class returns the index in Classes of the class of block i.
func (p *Plan) Class(i int) int { return int(p.meta[i] >> (p.rankBits & 31)) }

// Index returns the plan index of the block with the given id. The first call
// builds a map of all ids.
func (p *Plan) Index(id uint64) (int, bool) {
	p.indexOnce.Do(func() {
		p.index = make(map[uint64]int32, len(p.ids))
		for i, id := range p.ids {
			p.index[id] = int32(i)
		}
	})
	i, ok := p.index[id]
	return int(i), ok
}

// Members returns the plan indices of group g's blocks in list order: the
// block at group position k is Members(g)[k]. Do not modify the result.
func (p *Plan) Members(g int) ([]int32, error) {
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("packing: group %d of a plan with %d groups: %w", g, len(p.groups), ErrOutOfRange)
	}
	p.buildMembers()
	if p.members == nil {
		all := make([]int32, len(p.ids))
		for i := range all {
			all[i] = int32(i)
		}
		return all, nil
	}
	return p.members[g], nil
}

func (p *Plan) buildMembers() {
	p.membersOnce.Do(func() {
		if len(p.groups) <= 1 {
			return
		}
		p.members = make([][]int32, len(p.groups))
		for g := range p.groups {
			p.members[g] = make([]int32, 0, p.groups[g].Blocks)
		}
		for i := range p.ids {
			g := p.class(i).Group
			p.members[g] = append(p.members[g], int32(i))
		}
	})
}

// Entry is one row of a group's manifest: what a receiver needs to turn the
// group's buffer back into blocks.
type Entry struct {
	ID     uint64
	DType  DType
	Rows   int
	Cols   int
	Offset int64 // byte offset in the group's buffer
}

// Manifest lists group g's blocks in group-position order, and the payload
// size in bytes (the buffer size, padding included).
func (p *Plan) Manifest(g int) ([]Entry, int64, error) {
	members, err := p.Members(g)
	if err != nil {
		return nil, 0, err
	}
	out := make([]Entry, len(members))
	for k, i := range members {
		cl := p.class(int(i))
		out[k] = Entry{ID: p.ids[i], DType: cl.DType, Rows: cl.Rows, Cols: cl.Cols, Offset: p.offset(int(i))}
	}
	return out, p.groups[g].Bytes, nil
}

// FromManifest rebuilds a single-group plan from a received manifest with
// the sender's offsets, so a received buffer of size bytes can be viewed
// without a copy (see Wrap). It checks everything a malformed or hostile
// manifest could get wrong: shapes, dtypes, duplicate ids, offsets that are
// negative, misaligned for the element type, past size, or overlapping
// another block. Classes keep first-appearance order; a class is Regular
// when its blocks happen to sit at a constant stride.
func FromManifest(entries []Entry, size int64) (*Plan, error) {
	if size < 0 || size > MaxBytes {
		return nil, fmt.Errorf("packing: manifest payload of %d bytes: want [0, 2^50]: %w", size, ErrOutOfRange)
	}
	n := len(entries)
	if int64(n) > math.MaxInt32 {
		return nil, fmt.Errorf("packing: manifest of %d blocks: %w", n, ErrOverflow)
	}
	p := &Plan{ids: make([]uint64, n), meta: make([]uint32, n), offs: make([]int64, n)}
	var tab classTable
	tab.init(6)
	var last []int64 // offset of each class's latest block
	minID, maxID := uint64(math.MaxUint64), uint64(0)
	for i := range entries {
		e := &entries[i]
		d := Desc{ID: e.ID, DType: e.DType, Rows: e.Rows, Cols: e.Cols}
		if uint64(d.Rows-1) >= maxDim || uint64(d.Cols-1) >= maxDim || !d.DType.Valid() {
			return nil, badDesc(i, &d)
		}
		if !fits(&d) {
			return nil, &BlockError{Index: i, ID: e.ID, Reason: fmt.Sprintf("%dx%d %s is more than 2^50 bytes", d.Rows, d.Cols, d.DType), Err: ErrOverflow}
		}
		bb := d.Bytes()
		if e.Offset < 0 || bb > size || e.Offset > size-bb {
			return nil, &BlockError{Index: i, ID: e.ID, Reason: fmt.Sprintf("bytes [%d, %d+%d) outside a payload of %d bytes", e.Offset, e.Offset, bb, size), Err: ErrOutOfRange}
		}
		if e.Offset%d.DType.Size() != 0 {
			return nil, &BlockError{Index: i, ID: e.ID, Reason: fmt.Sprintf("offset %d not a multiple of the %s element size", e.Offset, d.DType), Err: ErrOutOfRange}
		}
		k := classKey{rc: uint64(d.Rows)<<32 | uint64(d.Cols), dd: uint64(d.DType)}
		c, slot := tab.find(k)
		if c < 0 {
			c = tab.insert(k, slot)
			p.classes = append(p.classes, Class{DType: d.DType, Rows: d.Rows, Cols: d.Cols, BlockBytes: bb, Offset: e.Offset, Regular: true})
		}
		cl := &p.classes[c]
		switch cl.Count {
		case 0:
			cl.Stride = bb
		case 1:
			cl.Stride = e.Offset - cl.Offset
			cl.Regular = cl.Stride >= bb
		default:
			cl.Regular = cl.Regular && e.Offset-last[c] == cl.Stride
		}
		if int(c) == len(last) {
			last = append(last, 0)
		}
		last[c] = e.Offset
		cl.Count++
		p.ids[i] = e.ID
		p.meta[i] = uint32(c)
		p.offs[i] = e.Offset
		minID = min(minID, e.ID)
		maxID = max(maxID, e.ID)
	}
	if err := checkUniqueIDs(p.ids, minID, maxID); err != nil {
		return nil, err
	}
	if err := checkDisjoint(p); err != nil {
		return nil, err
	}
	g := Group{Blocks: n, Bytes: size}
	for c := range p.classes {
		if !p.classes[c].Regular {
			p.classes[c].Stride = 0
		}
		g.Classes = append(g.Classes, c)
	}
	p.groups = []Group{g}
	return p, nil
}

func checkDisjoint(p *Plan) error {
	offs := p.offs
	// A manifest in offset order (what a sender writes when it lists blocks
	// as they lie in its buffer) needs one pass, not a sort.
	sorted := true
	for i := 1; i < len(offs) && sorted; i++ {
		sorted = offs[i-1] <= offs[i]
	}
	var order []int32 // nil: the identity
	if !sorted {
		order = make([]int32, len(offs))
		for i := range order {
			order[i] = int32(i)
		}
		sort.Slice(order, func(x, y int) bool { return offs[order[x]] < offs[order[y]] })
	}
	at := func(k int) int32 {
		if order == nil {
			return int32(k)
		}
		return order[k]
	}
	for k := 1; k < len(offs); k++ {
		prev, cur := at(k-1), at(k)
		if end := offs[prev] + p.class(int(prev)).BlockBytes; end > offs[cur] {
			return &BlockError{Index: int(cur), ID: p.ids[cur], Reason: fmt.Sprintf("bytes from %d overlap block %d (id %d) ending at %d", offs[cur], prev, p.ids[prev], end), Err: ErrOverlap}
		}
	}
	return nil
}
