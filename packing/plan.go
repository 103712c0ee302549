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

	"github.com/distbuf/distbuf"
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
	// 0 means 256 bytes (Plan.Options reports the alignment in use).
	Align int64
	// BlockAlign is the alignment of every block inside its class, so the
	// class stride is the block size rounded up to it: a power of two no
	// larger than Align. 0 means the element size (no padding between
	// blocks of one class). Set it to Align to start every block on its own
	// aligned boundary.
	BlockAlign int64
}

// defaultAlign is the alignment of shape classes when Options.Align is 0.
const defaultAlign = 256

// MaxBytes bounds the size of one group's buffer (the allocator's own limit).
const MaxBytes = 1 << 50

// maxDim keeps every dimension usable by a 32-bit BLAS.
const maxDim = math.MaxInt32

// NoDest is the destination of a group that goes to no rank: the one group
// of a received layout (FromManifest, Detached) and of a joined one
// (Plan.Joined). msg refuses such a buffer as a send buffer.
const NoDest = -1

// maxDest bounds destination ranks.
const maxDest = math.MaxInt32

func (o Options) resolve() (Options, error) {
	if o.Align == 0 {
		o.Align = defaultAlign
	}
	if o.Align < 16 || o.Align > 1<<20 || o.Align&(o.Align-1) != 0 {
		return o, fmt.Errorf("packing: Options.Align %d misaligned: want a power of two in [16, 1048576]: %w", o.Align, distbuf.ErrInvalid)
	}
	if o.BlockAlign < 0 || o.BlockAlign > o.Align || o.BlockAlign&(o.BlockAlign-1) != 0 {
		return o, fmt.Errorf("packing: Options.BlockAlign %d misaligned: want 0 or a power of two no larger than Align (%d): %w", o.BlockAlign, o.Align, distbuf.ErrInvalid)
	}
	return o, nil
}

// Class is one shape class of a group: blocks of equal dtype and shape, laid
// out from Offset at a constant Stride, in the order of the descriptor list.
// A class is therefore one strided batch.
type Class struct {
	Group int
	DType DType
	// Regular is true when the blocks sit at a constant Stride. Plans made by
	// NewPlan are always regular; FromManifest keeps the sender's offsets.
	// (It sits beside DType so that a Class is 64 bytes: a plan allocates
	// less, and views find a class with a shift.)
	Regular    bool
	Rows, Cols int
	Count      int
	Offset     int64 // byte offset of the first block in the group's buffer
	Stride     int64 // bytes from one block to the next; 0 when !Regular
	BlockBytes int64 // rows * cols * element size
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
	// ids holds the id of each block, or is nil when they count in steps:
	// block i has id id0 + i*idStep.
	ids         []uint64
	id0, idStep uint64
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
	group0   [1]Group // room for the first group, so that most plans allocate no groups

	// groupStart, for a plan of several groups that the list gave one
	// after another (destinations in non-decreasing order, as a solver
	// that sorts its blocks by owner lists them), is each group's first
	// plan index: group position k of group g is plan index
	// groupStart[g]+k, with no member list to build. nil otherwise.
	groupStart []int32

	membersOnce sync.Once
	members     [][]int32 // per group: plan indices in list order (nil for a single group or groupStart)

	indexOnce sync.Once
	ids2index map[uint64]int32

	join *joinInfo // set on a plan made by Joined
}

// manifest reports whether the plan came from FromManifest, whose classes
// may interleave (NewPlan always resolves a non-zero Align).
func (p *Plan) manifest() bool { return p.opts.Align == 0 }

// id is the id of block i.
func (p *Plan) id(i int) uint64 {
	if p.ids != nil {
		return p.ids[i]
	}
	return p.id0 + uint64(i)*p.idStep
}

// class is the class of block i. (rankBits is below 32; masking it lets the
// compiler drop the check for longer shifts here and in offset.)
func (p *Plan) class(i int) *Class {
	return &p.classes[p.meta[i]>>(p.rankBits&31)]
}

// classKey is a class's shape and its destination and dtype, packed.
type classKey struct{ rc, dd uint64 }

// keyOf packs a block's class key. ok is false when a field lies outside
// the range in which the packing is one to one (rows and cols in [1, 2^31],
// dest in [0, 2^31)), which holds every valid block. A block inside it may
// still be invalid (its dtype, 2^31 rows), but then no class has its key:
// only blocks that passed validation create classes.
func keyOf(d *Desc) (k classKey, ok bool) {
	r, c, dst := uint64(d.Rows-1), uint64(d.Cols-1), uint64(d.Dest)
	return classKey{rc: uint64(d.Rows)<<32 | uint64(d.Cols), dd: dst<<8 | uint64(d.DType)}, r|c|dst <= math.MaxInt32
}

// hash spreads the key over the high bits, which index the table: Fibonacci
// hashing keeps shapes in arithmetic progression (Cols 64, 128, ...) apart.
func (k classKey) hash() uint64 {
	return (k.rc ^ bits.RotateLeft64(k.dd, 40)) * 0x9E3779B97F4A7C15
}

// classEntry is a class in a classTable; a zero rc (no class has 0 rows)
// marks an empty entry.
type classEntry struct {
	key  classKey
	word uint64
}

// classTable maps class keys to one word each: open addressing with linear
// probes over a power-of-two array, without allocation per class. It grows
// when half full, or a quarter full when there are enough blocks to repay
// the larger table in probes: a few thousand blocks of a hundred classes
// are faster with the table on the stack (see stackTableSize) and a probe
// too many now and then, 10^5 blocks with a larger table and nearly every
// lookup ending at its first probe.
type classTable struct {
	entries []classEntry
	shift   uint // 64 - log2(len(entries))
	n       int  // entries in use
	blocks  int  // lookups to come, about
}

// stackTableSize is the size of the table NewPlan starts with, on its
// stack: up to 256 classes, 12 KiB to clear, enough for the joined A and B
// operands of a solve (a hundred-odd shapes each) without a table on the
// heap. FromManifest's holds 128 classes, 6 KiB: a message of a few blocks
// is decoded often.
const (
	stackTableSize    = 512
	manifestTableSize = 256
)

// newClassTable returns an empty table over entries, which must be zero,
// for about blocks lookups. It returns the table rather than filling one in
// so that entries on the caller's stack can stay there (escape analysis
// sends whatever is stored through a pointer to the heap).
func newClassTable(entries []classEntry, blocks int) classTable {
	return classTable{entries: entries, shift: 64 - uint(bits.TrailingZeros(uint(len(entries)))), blocks: blocks}
}

// find returns k's entry, or the empty entry where k belongs.
func (t *classTable) find(k classKey) *classEntry {
	mask := uint64(len(t.entries) - 1)
	for h := k.hash() >> t.shift; ; h++ {
		if e := &t.entries[h&mask]; e.key == k || e.key.rc == 0 {
			return e
		}
	}
}

// add enters k, which find did not find, with its word, and returns its
// entry, growing the table first when it would be too full.
func (t *classTable) add(k classKey, word uint64) *classEntry {
	t.n++
	if size := len(t.entries); t.n > size/2 || t.n > size/4 && t.blocks >= 32*size {
		old, n := t.entries, t.n
		*t = newClassTable(make([]classEntry, 2*size), t.blocks)
		t.n = n
		for _, e := range old {
			if e.key.rc != 0 {
				*t.find(e.key) = e
			}
		}
	}
	e := t.find(k)
	*e = classEntry{key: k, word: word}
	return e
}

// classifier is pass 1's state apart from the per-block loop. The word of a
// class in its table is the place its next block gets (class<<rankBits |
// rank), so that one probe and one increment give a block both its class
// and its rank, and the tables hold what pass 2 needs.
//
// Plans of many blocks also have a direct table, which holds the words of
// single-destination classes of shapes up to 32x32 instead of tab (where
// their words stay at 0 blocks): such a block finds its word with one load,
// no hash and no key to compare, which is what 10^5 blocks of DMRG-sized
// shapes spend most in. It has 4096 words to fill, too many for a few
// thousand blocks, whose loop is also faster without the branch to it.
type classifier struct {
	rankBits   uint
	maxClasses int // how many classes the plan's place encoding holds
	tab        classTable
	direct     *[directSize]uint64 // nil for plans of fewer than directMinBlocks
}

// errTooManyClasses tells NewPlan to classify again with 64-bit places.
var errTooManyClasses = errors.New("packing: more classes than 32-bit places hold")

func newClassifier(rankBits uint, entries []classEntry, blocks int, direct *[directSize]uint64) classifier {
	cf := classifier{rankBits: rankBits, maxClasses: math.MaxInt, tab: newClassTable(entries, blocks), direct: direct}
	if rankBits < 32 {
		cf.maxClasses = 1 << (32 - rankBits)
	}
	if direct != nil {
		for s := range direct {
			direct[s] = noClass
		}
	}
	return cf
}

const (
	// directSize is the size of the direct table: a slot for each dtype and
	// shape up to 32x32.
	directSize = 4 << 10
	// directMinBlocks is the smallest plan that fills a direct table.
	directMinBlocks = 1 << 12
	// noClass marks an unused direct table slot: no word reaches it, since
	// a class index is below 2^31.
	noClass = math.MaxUint64
)

// directTables holds direct tables (*[directSize]uint64) between plans.
var directTables sync.Pool

// directSlot is the direct table slot of a block, and whether the block has
// one: a single-destination block of valid dtype and a shape up to 32x32.
func directSlot(d *Desc) (uint, bool) {
	r, c, t := uint(d.Rows-1), uint(d.Cols-1), uint(d.DType-1)
	return (t<<10 | r<<5 | c) & (directSize - 1), (r|c)>>5|t>>2|uint(d.Dest) == 0
}

// idStep returns the step of ids that count in steps (id0, id0+step, ...),
// as when a solver numbers its blocks in list order, as far as the first,
// second and last blocks tell: classify checks the others. Such ids need no
// check for duplicates and a plan keeps them as two words. ok is false
// unless the step gives distinct ids: it is not 0 and its multiples below
// 2^31 differ modulo 2^64 (it has at most 32 trailing zeros).
func idStep(descs []Desc) (step uint64, ok bool) {
	n := len(descs)
	if n < 2 {
		return 0, true
	}
	step = descs[1].ID - descs[0].ID
	return step, step != 0 && bits.TrailingZeros64(step) <= 32 && descs[n-1].ID == descs[0].ID+uint64(n-1)*step
}

// classify is pass 1: it gives each block its place and counts the
// classes. ids is nil while the ids count in steps (id0, id0+step, ...):
// at the first block whose id does not, classify allocates ids, fills in
// the ids before it and copies the others. It returns ids. The known loops
// take the blocks of known classes; classify comes back for the first
// block of each class, for invalid blocks and for the end of counted ids
// only.
func classify[P uint32 | int64](cf *classifier, descs []Desc, places []P, ids []uint64, id0, step uint64) ([]uint64, error) {
	n := len(descs)
	places = places[:n]
	for i := 0; i < n; i++ {
		switch {
		case ids != nil:
			i += knownStored(&cf.tab, cf.direct, descs[i:], places[i:], ids[i:n])
		case cf.direct != nil:
			i += knownCountedDirect(&cf.tab, cf.direct, descs[i:], places[i:], id0+uint64(i)*step, step)
		default:
			i += knownCounted(&cf.tab, descs[i:], places[i:], id0+uint64(i)*step, step)
		}
		if i == n {
			break
		}
		d := &descs[i]
		if ids == nil && d.ID != id0+uint64(i)*step {
			ids = make([]uint64, n)
			for j := range i {
				ids[j] = id0 + uint64(j)*step
			}
		}
		w, err := cf.slow(i, d)
		if err != nil {
			return nil, err
		}
		if ids != nil {
			ids[i] = d.ID
		}
		e := *w
		*w = e + 1
		places[i] = P(e)
	}
	return ids, nil
}

// knownCounted places the blocks of known classes from the start of descs,
// of any shape and destination, whose ids count on from next in steps, up
// to the first other block, and returns how many it placed. A block costs
// its key, one probe (rarely more) and one increment; a key in the table
// proves the block valid, since only validated blocks enter it. The loop
// is alone in its function, and apart from the others, so that its values
// stay in registers.
func knownCounted[P uint32 | int64](tab *classTable, descs []Desc, places []P, next, step uint64) int {
	places = places[:len(descs)]
	entries, shift := tab.entries, tab.shift
	for i := range descs {
		d := &descs[i]
		k, ok := keyOf(d)
		if !ok || d.ID != next {
			return i
		}
		e := lookup(entries, shift, k)
		if e == nil {
			return i
		}
		next += step
		w := e.word
		e.word = w + 1
		places[i] = P(w)
	}
	return len(descs)
}

// knownCountedDirect is knownCounted for a plan with a direct table.
func knownCountedDirect[P uint32 | int64](tab *classTable, direct *[directSize]uint64, descs []Desc, places []P, next, step uint64) int {
	places = places[:len(descs)]
	entries, shift := tab.entries, tab.shift
	for i := range descs {
		d := &descs[i]
		if d.ID != next {
			return i
		}
		var w *uint64
		if s, ok := directSlot(d); ok {
			if w = &direct[s]; *w == noClass {
				return i
			}
		} else {
			k, ok := keyOf(d)
			if !ok {
				return i
			}
			e := lookup(entries, shift, k)
			if e == nil {
				return i
			}
			w = &e.word
		}
		next += step
		v := *w
		*w = v + 1
		places[i] = P(v)
	}
	return len(descs)
}

// knownStored is knownCountedDirect for ids that do not count in steps,
// which it copies to ids; direct may be nil.
func knownStored[P uint32 | int64](tab *classTable, direct *[directSize]uint64, descs []Desc, places []P, ids []uint64) int {
	places, ids = places[:len(descs)], ids[:len(descs)]
	entries, shift := tab.entries, tab.shift
	for i := range descs {
		d := &descs[i]
		var w *uint64
		s, small := uint(0), false
		if direct != nil {
			s, small = directSlot(d)
		}
		if small {
			if w = &direct[s]; *w == noClass {
				return i
			}
		} else {
			k, ok := keyOf(d)
			if !ok {
				return i
			}
			e := lookup(entries, shift, k)
			if e == nil {
				return i
			}
			w = &e.word
		}
		ids[i] = d.ID
		v := *w
		*w = v + 1
		places[i] = P(v)
	}
	return len(descs)
}

// lookup is find for the known loops, which keep the table in registers:
// it returns k's entry, or nil.
func lookup(entries []classEntry, shift uint, k classKey) *classEntry {
	h := k.hash() >> (shift & 63)
	e := &entries[h]
	for e.key != k {
		if e.key.rc == 0 {
			return nil
		}
		h = (h + 1) & uint64(len(entries)-1)
		e = &entries[h]
	}
	return e
}

// slow validates block i, which the known loops did not place, and returns
// the word of its class, which it creates on the class's first block.
func (cf *classifier) slow(i int, d *Desc) (*uint64, error) {
	if uint64(d.Rows-1) >= maxDim || uint64(d.Cols-1) >= maxDim || uint8(d.DType-1) > 3 || uint64(d.Dest) > maxDest {
		return nil, badDesc(i, d)
	}
	k, _ := keyOf(d)
	e := cf.tab.find(k)
	if e.key.rc == 0 {
		if !fits(d) {
			return nil, &BlockError{Index: i, ID: d.ID, Reason: fmt.Sprintf("%dx%d %s: too large, more than 2^50 bytes", d.Rows, d.Cols, d.DType)}
		}
		if cf.tab.n == cf.maxClasses {
			return nil, errTooManyClasses
		}
		e = cf.tab.add(k, uint64(cf.tab.n)<<cf.rankBits)
		if s, ok := directSlot(d); ok && cf.direct != nil {
			cf.direct[s] = e.word
		}
	}
	if s, ok := directSlot(d); ok && cf.direct != nil {
		return &cf.direct[s], nil
	}
	return &e.word, nil
}

// NewPlan lays out the blocks. It runs in two passes over the descriptors,
// as DBCSR does: the first classifies each block into its (destination,
// dtype, shape) class and counts it, the second prefix-sums the class sizes
// into offsets. The layout depends only on the list and the options: groups
// in increasing Dest, classes in order of first appearance, blocks of a
// class in list order.
//
// At a few thousand blocks, what a plan allocates costs about as much as
// classifying the blocks (the collector reclaims every byte, and pages it
// gives back fault in again), so a plan keeps 4 bytes a block when the ids
// count in steps, 12 otherwise, and its class table lives on the stack.
func NewPlan(descs []Desc, opts Options) (*Plan, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	n := len(descs)
	if int64(n) > math.MaxInt32 {
		return nil, fmt.Errorf("packing: %d blocks: too large: at most 2^31-1 per plan: %w", n, distbuf.ErrInvalid)
	}
	// A block's class and rank fit in 32 bits unless the classes outnumber
	// what the bits that ranks leave can count; then classify again with 64
	// bits, kept in offs until pass 2 turns them into offsets.
	rankBits := uint(bits.Len(uint(n)))
	p := &Plan{opts: o, rankBits: uint8(rankBits), rankMask: 1<<rankBits - 1}
	// Ids that count in steps need no array; classify allocates one if they
	// stop counting, and others get one here.
	var id0, step uint64
	if s, counted := idStep(descs); counted {
		p.meta = make([]uint32, n)
		if n > 0 {
			id0, step = descs[0].ID, s
		}
	} else {
		p.ids, p.meta = make([]uint64, n), make([]uint32, n)
	}
	var direct *[directSize]uint64
	if n >= directMinBlocks {
		direct, _ = directTables.Get().(*[directSize]uint64)
		if direct == nil {
			direct = new([directSize]uint64)
		}
		defer directTables.Put(direct)
	}
	var stackTable [stackTableSize]classEntry
	cf := newClassifier(rankBits, stackTable[:], n, direct)
	ids, err := classify(&cf, descs, p.meta, p.ids, id0, step)
	if err == errTooManyClasses {
		p.offs, p.rankBits, p.rankMask = make([]int64, n), 0, 0
		clear(stackTable[:])
		cf = newClassifier(32, stackTable[:], n, direct)
		ids, err = classify(&cf, descs, p.offs, p.ids, id0, step)
	}
	if err != nil {
		return nil, err
	}
	if p.ids = ids; ids == nil {
		p.id0, p.idStep = id0, step
	} else if err := checkIDs(ids); err != nil {
		return nil, err
	}

	// Pass 2: order the classes (by destination, then first appearance) and
	// prefix-sum their sizes into class offsets. A block's offset is its
	// class's offset plus rank times stride, computed when asked for, so this
	// pass touches classes only (but for the explicit offsets of a plan with
	// too many classes for 32-bit places). Until the groups are known, a
	// class's Group holds its destination.
	nc := cf.tab.n
	countMask := uint64(1)<<cf.rankBits - 1
	p.classes = make([]Class, nc)
	for _, e := range cf.tab.entries {
		if e.key.rc == 0 {
			continue
		}
		dt := DType(e.key.dd & 0xff)
		rows, cols := int(e.key.rc>>32), int(e.key.rc&0xffffffff)
		d := Desc{DType: dt, Rows: rows, Cols: cols, Dest: int(e.key.dd >> 8)}
		if s, ok := directSlot(&d); ok && direct != nil {
			e.word = direct[s]
		}
		bb := int64(rows) * int64(cols) * dt.Size()
		ba := max(o.BlockAlign, dt.Size())
		p.classes[e.word>>cf.rankBits] = Class{Group: d.Dest, DType: dt, Rows: rows, Cols: cols, Count: int(e.word & countMask), BlockBytes: bb, Stride: alignUp(bb, ba), Regular: true}
	}
	order := make([]int, nc)
	sorted := true
	for c := range order {
		order[c] = c
		sorted = sorted && (c == 0 || p.classes[c-1].Group <= p.classes[c].Group)
	}
	if !sorted {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(p.classes[a].Group, p.classes[b].Group) })
	}
	// Each group's Classes is its run of order, capped so that an append
	// cannot reach the next group's. The first group lives in the Plan.
	p.groups = p.group0[:0]
	var cursor int64
	first := 0 // where the current group's run of order begins
	closeGroup := func(end int) {
		g := &p.groups[len(p.groups)-1]
		g.Bytes = alignUp(cursor, o.Align)
		g.Classes = order[first:end:end]
	}
	for k, c := range order {
		cl := &p.classes[c]
		if dest := cl.Group; len(p.groups) == 0 || p.groups[len(p.groups)-1].Dest != dest {
			if len(p.groups) > 0 {
				closeGroup(k)
			}
			p.groups = append(p.groups, Group{Dest: dest})
			cursor, first = 0, k
		}
		g := &p.groups[len(p.groups)-1]
		cl.Group = len(p.groups) - 1
		cursor = alignUp(cursor, o.Align)
		if int64(cl.Count) > (MaxBytes-cursor)/cl.Stride {
			return nil, fmt.Errorf("packing: group for rank %d too large: more than 2^50 bytes: %w", g.Dest, distbuf.ErrInvalid)
		}
		cl.Offset = cursor
		cursor += cl.Stride * int64(cl.Count)
		g.Blocks += cl.Count
	}
	if len(p.groups) > 0 {
		closeGroup(len(order))
	} else {
		p.groups = p.group0[:]
	}
	if len(p.groups) > 1 {
		p.groupStart = groupStarts(descs, p.groups)
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

// groupStarts returns each group's first plan index when the list gives
// the groups one after another (its destinations never decrease), else
// nil. Groups are in increasing Dest, so group g is then the list's run of
// its destination.
func groupStarts(descs []Desc, groups []Group) []int32 {
	for i := 1; i < len(descs); i++ {
		if descs[i].Dest < descs[i-1].Dest {
			return nil
		}
	}
	starts := make([]int32, len(groups))
	at := 0
	for g := range groups {
		starts[g] = int32(at)
		at += groups[g].Blocks
	}
	return starts
}

// checkIDs checks stored ids for duplicates. Ids that increase, the usual
// case, cannot repeat and cost one compare each; others are usually in no
// order at all, and leave that loop at once.
func checkIDs(ids []uint64) error {
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			minID, maxID := ids[0], ids[0]
			for _, id := range ids {
				minID = min(minID, id)
				maxID = max(maxID, id)
			}
			return checkUniqueIDs(ids, minID, maxID)
		}
	}
	return nil
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
	case !d.DType.valid():
		e.Reason = fmt.Sprintf("unknown dtype %d: want float32, float64, complex64 or complex128", uint8(d.DType))
	case d.Rows <= 0 || d.Cols <= 0:
		e.Reason = fmt.Sprintf("shape %dx%d: dimensions must be positive", d.Rows, d.Cols)
	case d.Dest < 0 || d.Dest > maxDest:
		e.Reason = fmt.Sprintf("destination rank %d outside [0, 2^31)", d.Dest)
	default:
		e.Reason = fmt.Sprintf("shape %dx%d: dimensions must be below 2^31", d.Rows, d.Cols)
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
	return &BlockError{Index: dup, ID: ids[dup], Reason: fmt.Sprintf("duplicate id: already used by block %d", first)}
}

// Options returns the resolved options (defaults filled in).
func (p *Plan) Options() Options { return p.opts }

// Len is the number of blocks.
func (p *Plan) Len() int { return len(p.meta) }

// Groups lists the destination groups in increasing Dest. A plan always has
// at least one group (an empty plan has one empty group).
func (p *Plan) Groups() []Group { return p.groups }

// Classes lists the shape classes; Group.Classes says which belong to a group.
func (p *Plan) Classes() []Class { return p.classes }

// block returns the descriptor and offset of the block at plan index i.
func (p *Plan) block(i int) (Desc, int64, error) {
	if i < 0 || i >= p.Len() {
		return Desc{}, 0, fmt.Errorf("packing: block index %d outside a plan of %d blocks: %w", i, p.Len(), distbuf.ErrInvalid)
	}
	cl := p.class(i)
	return Desc{ID: p.id(i), DType: cl.DType, Rows: cl.Rows, Cols: cl.Cols, Dest: p.groups[cl.Group].Dest}, p.offset(i), nil
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

// classIndex returns the index in Classes of the class of block i.
func (p *Plan) classIndex(i int) int { return int(p.meta[i] >> (p.rankBits & 31)) }

// index returns the plan index of the block with the given id. The first
// call builds a map of all ids.
func (p *Plan) index(id uint64) (int, bool) {
	p.indexOnce.Do(func() {
		p.ids2index = make(map[uint64]int32, p.Len())
		for i := range p.Len() {
			p.ids2index[p.id(i)] = int32(i)
		}
	})
	i, ok := p.ids2index[id]
	return int(i), ok
}

// groupIndex returns how group g's positions map to plan indices: the
// block at group position k is members[k], or first+k when members is nil
// (a single group, or groups the list gave one after another). Do not
// modify members.
func (p *Plan) groupIndex(g int) (members []int32, first int, err error) {
	if g < 0 || g >= len(p.groups) {
		return nil, 0, fmt.Errorf("packing: group %d of a plan with %d groups: %w", g, len(p.groups), distbuf.ErrInvalid)
	}
	if p.groupStart != nil {
		return nil, int(p.groupStart[g]), nil
	}
	p.buildMembers()
	if p.members == nil {
		return nil, 0, nil
	}
	return p.members[g], 0, nil
}

// GroupPosition returns the group (an index in Groups) and the group
// position of the block at plan index i: where block i of the descriptor
// list sits in the Coalesced of its group, as View, Locate, HostBlocks and
// NewMover's Refs count. A program that keeps each block's own storage in
// list order builds each group's Refs with it, before or after allocating:
//
//	g, k, err := plan.GroupPosition(i)
//	refs[g][k] = storage[i]
//
// It costs a few nanoseconds where the list gives the groups one after
// another (or there is one group), and otherwise a binary search in a
// member list built on the first call.
func (p *Plan) GroupPosition(i int) (group, position int, err error) {
	if i < 0 || i >= p.Len() {
		return 0, 0, fmt.Errorf("packing: group position of block index %d outside a plan of %d blocks: %w", i, p.Len(), distbuf.ErrInvalid)
	}
	g := p.class(i).Group
	members, first, err := p.groupIndex(g)
	if err != nil {
		return 0, 0, err
	}
	if members == nil {
		return g, i - first, nil
	}
	k, _ := slices.BinarySearch(members, int32(i)) // members are in list order
	return g, k, nil
}

func (p *Plan) buildMembers() {
	p.membersOnce.Do(func() {
		if len(p.groups) <= 1 || p.groupStart != nil {
			return
		}
		p.members = make([][]int32, len(p.groups))
		for g := range p.groups {
			p.members[g] = make([]int32, 0, p.groups[g].Blocks)
		}
		for i := range p.meta {
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
	members, first, err := p.groupIndex(g)
	if err != nil {
		return nil, 0, err
	}
	out := make([]Entry, p.groups[g].Blocks)
	for k := range out {
		i := first + k
		if members != nil {
			i = int(members[k])
		}
		cl := p.class(i)
		out[k] = Entry{ID: p.id(i), DType: cl.DType, Rows: cl.Rows, Cols: cl.Cols, Offset: p.offset(i)}
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
		return nil, fmt.Errorf("packing: manifest payload of %d bytes out of range: want [0, 2^50]: %w", size, distbuf.ErrInvalid)
	}
	n := len(entries)
	if int64(n) > math.MaxInt32 {
		return nil, fmt.Errorf("packing: manifest of %d blocks: too large: %w", n, distbuf.ErrInvalid)
	}
	p := &Plan{ids: make([]uint64, n), meta: make([]uint32, n), offs: make([]int64, n)}
	var stackTable [manifestTableSize]classEntry
	tab := newClassTable(stackTable[:], n)
	var last []int64 // offset of each class's latest block
	for i := range entries {
		e := &entries[i]
		d := Desc{ID: e.ID, DType: e.DType, Rows: e.Rows, Cols: e.Cols}
		if uint64(d.Rows-1) >= maxDim || uint64(d.Cols-1) >= maxDim || !d.DType.valid() {
			return nil, badDesc(i, &d)
		}
		if !fits(&d) {
			return nil, &BlockError{Index: i, ID: e.ID, Reason: fmt.Sprintf("%dx%d %s: too large, more than 2^50 bytes", d.Rows, d.Cols, d.DType)}
		}
		bb := d.Bytes()
		if e.Offset < 0 || bb > size || e.Offset > size-bb {
			return nil, &BlockError{Index: i, ID: e.ID, Reason: fmt.Sprintf("out of range: bytes [%d, %d+%d) outside a payload of %d bytes", e.Offset, e.Offset, bb, size)}
		}
		if e.Offset%d.DType.Size() != 0 {
			return nil, &BlockError{Index: i, ID: e.ID, Reason: fmt.Sprintf("misaligned: offset %d not a multiple of the %s element size", e.Offset, d.DType)}
		}
		k := classKey{rc: uint64(d.Rows)<<32 | uint64(d.Cols), dd: uint64(d.DType)}
		ce := tab.find(k)
		if ce.key.rc == 0 {
			ce = tab.add(k, uint64(len(p.classes)))
			p.classes = append(p.classes, Class{DType: d.DType, Rows: d.Rows, Cols: d.Cols, BlockBytes: bb, Offset: e.Offset, Regular: true})
		}
		c := ce.word
		if int(c) == len(last) {
			last = append(last, 0)
		}
		p.classes[c].place(e.Offset, &last[c])
		p.ids[i] = e.ID
		p.meta[i] = uint32(c)
		p.offs[i] = e.Offset
	}
	if err := checkIDs(p.ids); err != nil {
		return nil, err
	}
	if err := checkDisjoint(p); err != nil {
		return nil, err
	}
	p.endManifest(size)
	return p, nil
}

// place adds a block at offset off to a class of a manifest layout, whose
// blocks come in offset order; last is the offset of the class's previous
// block. A class is Regular while its blocks sit at the step between its
// first two, no shorter than a block.
func (cl *Class) place(off int64, last *int64) {
	switch cl.Count {
	case 0:
		cl.Stride = cl.BlockBytes
	case 1:
		cl.Stride = off - cl.Offset
		cl.Regular = cl.Stride >= cl.BlockBytes
	default:
		cl.Regular = cl.Regular && off-*last == cl.Stride
	}
	*last = off
	cl.Count++
}

// endManifest makes p's classes one group of size bytes, with no
// destination (NoDest), and clears the stride of the classes that are not
// regular.
func (p *Plan) endManifest(size int64) {
	g := Group{Dest: NoDest, Blocks: len(p.meta), Bytes: size}
	for c := range p.classes {
		if !p.classes[c].Regular {
			p.classes[c].Stride = 0
		}
		g.Classes = append(g.Classes, c)
	}
	p.groups = []Group{g}
}

// Detached is group g of p alone, as a receiver of the group's manifest
// sees it: the single-group plan FromManifest makes from Manifest(g) in
// offset order (the blocks in offset order, at their offsets in the
// group's buffer, with no destination). It is made from p directly, in one
// pass over the group's blocks for a NewPlan layout, without the checks a
// manifest from elsewhere needs: what a rank delivering a group to itself
// views the copy through.
func (p *Plan) Detached(g int) (*Plan, error) {
	members, from, err := p.groupIndex(g) // members nil: the blocks from plan index from on, in order
	if err != nil {
		return nil, err
	}
	n := p.groups[g].Blocks
	member := func(k int) int {
		if members == nil {
			return from + k
		}
		return int(members[k])
	}
	q := &Plan{ids: make([]uint64, n), meta: make([]uint32, n)}
	grp := &p.groups[g]
	strided := !p.manifest()
	for _, ci := range grp.Classes {
		cl := &p.classes[ci]
		strided = strided && cl.Regular && (cl.Count == 1 || cl.Stride > 0)
	}
	if strided {
		// A NewPlan group lays its classes out one after another in
		// Group.Classes order, each class's blocks at its stride: the
		// detached classes are the group's, in that order, with
		// FromManifest's strides (a lone block's is its size), and a
		// block's place in offset order follows from its class and rank.
		q.classes = make([]Class, len(grp.Classes))
		first := make([]int32, len(p.classes))  // a source class's first place
		index := make([]uint32, len(p.classes)) // a source class's detached class, in place in meta
		shift := p.rankBits & 31                // 0 when p keeps offsets
		next := int32(0)
		for c, ci := range grp.Classes {
			src := &p.classes[ci]
			stride := src.Stride
			if src.Count == 1 {
				stride = src.BlockBytes
			}
			q.classes[c] = Class{DType: src.DType, Rows: src.Rows, Cols: src.Cols, Count: src.Count, BlockBytes: src.BlockBytes,
				Offset: src.Offset, Stride: stride, Regular: true}
			first[ci], index[ci] = next, uint32(c)<<shift
			next += int32(src.Count)
		}
		if p.offs == nil {
			// The rank is in meta: a block lies at its class's offset plus
			// its rank times the stride, in p as in q, so q keeps the ranks
			// as p does, and no offsets.
			q.rankBits, q.rankMask = p.rankBits, p.rankMask
			ids, meta, mask := q.ids, q.meta, p.rankMask
			place := func(i int, m uint32) {
				ci, rank := m>>shift, m&mask
				at := first[ci] + int32(rank)
				ids[at], meta[at] = p.id(i), index[ci]|rank
			}
			if members == nil {
				// The group's blocks are a run of the plan's: no member
				// list to read.
				for k, m := range p.meta[from : from+n] {
					place(from+k, m)
				}
			} else {
				for _, i := range members {
					place(int(i), p.meta[i])
				}
			}
		} else {
			q.offs = make([]int64, n)
			for k := range n {
				i := member(k)
				ci := p.meta[i] // the class alone: shift is 0
				cl := &p.classes[ci]
				off, at := p.offs[i], first[ci]
				if cl.Stride > 0 {
					at += int32((off - cl.Offset) / cl.Stride)
				}
				q.ids[at], q.offs[at], q.meta[at] = p.id(i), off, index[ci]
			}
		}
		q.endManifest(grp.Bytes)
		return q, nil
	}
	q.offs = make([]int64, n)
	// A manifest plan's blocks may interleave: sorted by offset, then
	// classes numbered in order of first appearance, with FromManifest's
	// strides: the step between the first two blocks, kept when every
	// step is the same and no shorter than a block.
	order := make([]int32, n)
	for k := range order {
		order[k] = int32(member(k))
	}
	slices.SortFunc(order, func(x, y int32) int { return cmp.Compare(p.offset(int(x)), p.offset(int(y))) })
	for k, i := range order {
		q.ids[k], q.offs[k], q.meta[k] = p.id(int(i)), p.offset(int(i)), uint32(p.classIndex(int(i)))
	}
	place := make([]int32, len(p.classes))
	for i := range place {
		place[i] = -1
	}
	q.classes = make([]Class, 0, len(grp.Classes))
	last := make([]int64, 0, len(grp.Classes))
	for k := range q.meta {
		src := &p.classes[q.meta[k]]
		c := place[q.meta[k]]
		if c < 0 {
			c = int32(len(q.classes))
			place[q.meta[k]] = c
			q.classes = append(q.classes, Class{DType: src.DType, Rows: src.Rows, Cols: src.Cols, BlockBytes: src.BlockBytes,
				Offset: q.offs[k], Regular: true})
			last = append(last, 0)
		}
		q.classes[c].place(q.offs[k], &last[c])
		q.meta[k] = uint32(c)
	}
	q.endManifest(grp.Bytes)
	return q, nil
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
			return &BlockError{Index: int(cur), ID: p.ids[cur], Reason: fmt.Sprintf("overlap: bytes from %d overlap block %d (id %d) ending at %d", offs[cur], prev, p.ids[prev], end)}
		}
	}
	return nil
}
