package packing

import (
	"cmp"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/stretchr/testify/require"
)

// interval is the bytes [lo, hi) of one block.
type interval struct{ lo, hi int64 }

// firstOverlap sorts a group's block intervals by offset and returns the
// first two non-empty ones that overlap, if any.
func firstOverlap(ivs []interval) (a, b interval, found bool) {
	slices.SortFunc(ivs, func(x, y interval) int { return cmp.Or(cmp.Compare(x.lo, y.lo), cmp.Compare(x.hi, y.hi)) })
	var prev *interval
	for i := range ivs {
		v := &ivs[i]
		if v.hi == v.lo {
			continue // an empty block occupies nothing
		}
		if prev != nil && prev.hi > v.lo {
			return *prev, *v, true
		}
		prev = v
	}
	return interval{}, interval{}, false
}

// blockIntervals lists every block's bytes, by group.
func blockIntervals(t *testing.T, p *Plan) [][]interval {
	t.Helper()
	perGroup := make([][]interval, len(p.Groups()))
	for i := range p.Len() {
		d, off, err := p.block(i)
		require.NoError(t, err)
		g := p.Classes()[p.classIndex(i)].Group
		perGroup[g] = append(perGroup[g], interval{off, off + d.Bytes()})
	}
	return perGroup
}

// checkLayout verifies the invariants every NewPlan layout must have.
func checkLayout(t *testing.T, p *Plan, descs []Desc) {
	t.Helper()
	o := p.Options()
	require.Equal(t, len(descs), p.Len())
	rank := make([]int, len(p.Classes()))
	for i, d := range descs {
		got, off, err := p.block(i)
		require.NoError(t, err)
		require.Equal(t, d, got)
		ci := p.classIndex(i)
		cl := p.Classes()[ci]
		require.True(t, cl.Regular)
		require.Equal(t, cl.Offset+int64(rank[ci])*cl.Stride, off, "block %d is at its class offset plus rank times stride", i)
		rank[ci]++
		require.Zero(t, cl.Offset%o.Align, "class start aligned")
		require.Zero(t, off%max(o.BlockAlign, d.DType.Size()))
		g := p.Groups()[cl.Group]
		require.Equal(t, d.Dest, g.Dest)
		require.LessOrEqual(t, off+d.Bytes(), g.Bytes)
	}
	for ci, cl := range p.Classes() {
		require.Equal(t, cl.Count, rank[ci])
		require.GreaterOrEqual(t, cl.Stride, cl.BlockBytes)
	}
	for g, ivs := range blockIntervals(t, p) {
		require.Zero(t, p.Groups()[g].Bytes%o.Align)
		a, b, found := firstOverlap(ivs)
		require.False(t, found, "blocks [%d, %d) and [%d, %d) of group %d overlap", a.lo, a.hi, b.lo, b.hi, g)
	}
}

// TestFirstOverlap makes sure the layout check's overlap test finds two
// blocks at one offset (identical intervals, which a check comparing
// intervals by value would take for one block), in a plan of any size.
func TestFirstOverlap(t *testing.T) {
	descs := mixedDescs(1000, 9)
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	for _, ivs := range blockIntervals(t, p) {
		_, _, found := firstOverlap(ivs)
		require.False(t, found)
	}
	// Give every block of the last class the class's first place.
	last := p.classIndex(p.Len() - 1)
	require.Greater(t, p.Classes()[last].Count, 1)
	p.classes[last].Stride = 0
	overlap := false
	for _, ivs := range blockIntervals(t, p) {
		_, _, found := firstOverlap(ivs)
		overlap = overlap || found
	}
	require.True(t, overlap, "two blocks at one offset went unnoticed")
}

func TestPlanLayout(t *testing.T) {
	descs := mixedDescs(300, 3)
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	checkLayout(t, p, descs)
	require.Len(t, p.Groups(), 1)
	// Deterministic: the same list gives the same layout.
	q, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	for i := range descs {
		_, a, _ := p.block(i)
		_, b, _ := q.block(i)
		require.Equal(t, a, b)
	}
	// Classes come in first-appearance order, each a contiguous strided run.
	first := descs[0]
	cl := p.Classes()[0]
	require.Equal(t, [3]any{first.DType, first.Rows, first.Cols}, [3]any{cl.DType, cl.Rows, cl.Cols})
	require.Zero(t, cl.Offset)
	require.Equal(t, cl.BlockBytes, cl.Stride, "tightly packed by default")
}

func TestPlanAlignment(t *testing.T) {
	descs := mixedDescs(100, 4)
	p, err := NewPlan(descs, Options{Align: 1024, BlockAlign: 256})
	require.NoError(t, err)
	checkLayout(t, p, descs)
	for i := range descs {
		_, off, _ := p.block(i)
		require.Zero(t, off%256)
	}
	for _, o := range []Options{{Align: 100}, {Align: 8}, {Align: 1 << 21}, {Align: -256}, {Align: 256, BlockAlign: 512}, {BlockAlign: 24}, {BlockAlign: -1}} {
		_, err := NewPlan(descs, o)
		requireProblem(t, err, problemAlign, "%+v", o)
		require.ErrorIs(t, err, distbuf.ErrInvalid)
	}
}

func TestPlanBadInput(t *testing.T) {
	ok := Desc{ID: 1, DType: Float64, Rows: 2, Cols: 3}
	cases := []struct {
		name string
		d    Desc
		want string // the problem
	}{
		{"zero rows", Desc{ID: 2, DType: Float64, Rows: 0, Cols: 3}, problemShape},
		{"negative cols", Desc{ID: 2, DType: Float32, Rows: 3, Cols: -1}, problemShape},
		{"rows over 2^31", Desc{ID: 2, DType: Float32, Rows: 1 << 31, Cols: 1}, problemShape},
		{"no dtype", Desc{ID: 2, Rows: 1, Cols: 1}, problemDType},
		{"unknown dtype", Desc{ID: 2, DType: 9, Rows: 1, Cols: 1}, problemDType},
		{"negative dest", Desc{ID: 2, DType: Float64, Rows: 1, Cols: 1, Dest: -1}, "destination rank"},
		{"block over 2^50 bytes", Desc{ID: 2, DType: Complex128, Rows: 1 << 30, Cols: 1 << 30}, problemTooLarge},
		{"duplicate id", Desc{ID: 1, DType: Float64, Rows: 1, Cols: 1}, problemDuplicate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewPlan([]Desc{ok, ok, c.d}[1:], Options{})
			requireProblem(t, err, c.want)
			var be *BlockError
			require.True(t, errors.As(err, &be))
			require.Equal(t, 1, be.Index)
			require.Equal(t, c.d.ID, be.ID)
		})
	}
	// A group whose blocks add up past 2^50 bytes.
	big := Desc{DType: Float64, Rows: 1 << 25, Cols: 1 << 22}
	_, err := NewPlan([]Desc{{ID: 1, DType: big.DType, Rows: big.Rows, Cols: big.Cols}, {ID: 2, DType: big.DType, Rows: big.Rows, Cols: big.Cols}}, Options{})
	requireProblem(t, err, problemTooLarge)
}

func TestPlanDuplicateIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, sparse := range []bool{false, true} {
		descs := make([]Desc, 5000)
		for i := range descs {
			id := uint64(i)
			if sparse {
				id = rng.Uint64() | 1
			}
			descs[i] = Desc{ID: id, DType: Float32, Rows: 1, Cols: 1}
		}
		rng.Shuffle(len(descs), func(i, j int) { descs[i], descs[j] = descs[j], descs[i] })
		_, err := NewPlan(descs, Options{})
		require.NoError(t, err, "sparse=%v", sparse)
		descs[4000].ID = descs[17].ID
		_, err = NewPlan(descs, Options{})
		requireProblem(t, err, problemDuplicate, "sparse=%v", sparse)
		require.ErrorContains(t, err, "block 4000")
		require.ErrorContains(t, err, "block 17")
	}
	// Id 0 is an ordinary id, also in the sparse path.
	_, err := NewPlan([]Desc{{ID: 1 << 60, DType: Float64, Rows: 1, Cols: 1}, {ID: 0, DType: Float64, Rows: 1, Cols: 1}, {ID: 0, DType: Float64, Rows: 1, Cols: 1}}, Options{})
	requireProblem(t, err, problemDuplicate)
}

func TestPlanMillionBlocks(t *testing.T) {
	descs := mixedDescs(1_000_000, 9)
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	require.Equal(t, 1_000_000, p.Len())
	var sum int64
	for _, cl := range p.Classes() {
		sum += int64(cl.Count)
	}
	require.EqualValues(t, 1_000_000, sum)
	// Sampled exact checks: the block's class and rank give its offset.
	rank := make([]int64, len(p.Classes()))
	for i, d := range descs {
		ci := p.classIndex(i)
		if i%9973 == 0 {
			_, off, err := p.block(i)
			require.NoError(t, err)
			cl := p.Classes()[ci]
			require.Equal(t, cl.Offset+rank[ci]*cl.Stride, off)
			require.LessOrEqual(t, off+d.Bytes(), p.Groups()[0].Bytes)
		}
		rank[ci]++
	}
}

func TestPlanEmpty(t *testing.T) {
	p, err := NewPlan(nil, Options{})
	require.NoError(t, err)
	require.Len(t, p.Groups(), 1)
	require.Zero(t, p.Groups()[0].Bytes)
	entries, size, err := p.Manifest(0)
	require.NoError(t, err)
	require.Empty(t, entries)
	require.Zero(t, size)
}

func TestPlanGroupsByDest(t *testing.T) {
	descs := []Desc{
		{ID: 10, DType: Float64, Rows: 2, Cols: 2, Dest: 3},
		{ID: 11, DType: Float64, Rows: 2, Cols: 2, Dest: 1},
		{ID: 12, DType: Complex64, Rows: 1, Cols: 5, Dest: 3},
		{ID: 13, DType: Float64, Rows: 2, Cols: 2, Dest: 3},
		{ID: 14, DType: Float32, Rows: 7, Cols: 1, Dest: 0},
	}
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	checkLayout(t, p, descs)
	var dests []int
	for _, g := range p.Groups() {
		dests = append(dests, g.Dest)
	}
	require.Equal(t, []int{0, 1, 3}, dests)
	m, err := p.groupMembers(2)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 2, 3}, m)
	entries, size, err := p.Manifest(2)
	require.NoError(t, err)
	require.Equal(t, p.Groups()[2].Bytes, size)
	require.Equal(t, []uint64{10, 12, 13}, []uint64{entries[0].ID, entries[1].ID, entries[2].ID})
	require.Equal(t, int64(0), entries[0].Offset)
	require.Equal(t, int64(32), entries[2].Offset, "same class as id 10, next slot")
	require.Equal(t, int64(256), entries[1].Offset, "a new class starts on the 256-byte boundary")
	_, _, err = p.Manifest(3)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
}

func TestFromManifest(t *testing.T) {
	descs := mixedDescs(200, 11)
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	q, entries, size := received(t, p, 0)
	require.Equal(t, p.Len(), q.Len())
	for i := range descs {
		a, offA, _ := p.block(i)
		b, offB, _ := q.block(i)
		require.Equal(t, NoDest, b.Dest, "a received layout has no destination")
		b.Dest = a.Dest
		require.Equal(t, a, b)
		require.Equal(t, offA, offB)
	}
	for _, cl := range q.Classes() {
		require.True(t, cl.Regular, "a NewPlan layout stays strided")
	}
	// Hostile manifests.
	bad := func(mut func(e []Entry) ([]Entry, int64), problem string) {
		t.Helper()
		e := append([]Entry(nil), entries...)
		e, sz := mut(e)
		_, err := FromManifest(e, sz)
		requireProblem(t, err, problem)
	}
	bad(func(e []Entry) ([]Entry, int64) { e[3].Offset = size; return e, size }, "out of range")
	bad(func(e []Entry) ([]Entry, int64) { e[3].Offset = -8; return e, size }, "out of range")
	bad(func(e []Entry) ([]Entry, int64) { e[3].Offset++; return e, size }, problemAlign)
	bad(func(e []Entry) ([]Entry, int64) { e[4].Offset = e[3].Offset; return e, size }, problemOverlap)
	bad(func(e []Entry) ([]Entry, int64) { e[4].ID = e[9].ID; return e, size }, problemDuplicate)
	bad(func(e []Entry) ([]Entry, int64) { e[4].Rows = 0; return e, size }, problemShape)
	bad(func(e []Entry) ([]Entry, int64) { e[4].DType = 7; return e, size }, problemDType)
	bad(func(e []Entry) ([]Entry, int64) { return e, -1 }, "payload of -1 bytes")
	bad(func(e []Entry) ([]Entry, int64) { return e, 16 }, "out of range")
	// Irregular but valid: reversed offsets of one class.
	e := []Entry{{ID: 1, DType: Float64, Rows: 1, Cols: 1, Offset: 16}, {ID: 2, DType: Float64, Rows: 1, Cols: 1, Offset: 0}, {ID: 3, DType: Float64, Rows: 1, Cols: 1, Offset: 8}}
	q, err = FromManifest(e, 24)
	require.NoError(t, err)
	require.False(t, q.Classes()[0].Regular)
}

// FuzzFromManifest decodes arbitrary entries: a manifest comes from another
// rank. It must never panic, and any plan it accepts must be in bounds and
// free of overlaps.
func FuzzFromManifest(f *testing.F) {
	f.Add([]byte{1, 2, 2, 0, 0, 2, 1, 1, 16, 0}, uint16(64))
	f.Add([]byte{4, 1, 1, 0, 0, 4, 1, 1, 0, 0}, uint16(32))
	f.Fuzz(func(t *testing.T, raw []byte, size uint16) {
		var entries []Entry
		for i := 0; i+5 <= len(raw); i += 5 {
			entries = append(entries, Entry{
				ID: uint64(raw[i]), DType: DType(raw[i+1] % 6), Rows: int(int8(raw[i+2])), Cols: int(int8(raw[i+3])),
				Offset: int64(raw[i+4]) * 4,
			})
		}
		p, err := FromManifest(entries, int64(size))
		if err != nil {
			require.ErrorIs(t, err, distbuf.ErrInvalid)
			return
		}
		type iv struct{ lo, hi int64 }
		var ivs []iv
		for i := range entries {
			d, off, err := p.block(i)
			require.NoError(t, err)
			require.GreaterOrEqual(t, off, int64(0))
			require.LessOrEqual(t, off+d.Bytes(), int64(size))
			for _, v := range ivs {
				require.True(t, off+d.Bytes() <= v.lo || v.hi <= off)
			}
			ivs = append(ivs, iv{off, off + d.Bytes()})
		}
	})
}

func TestFromManifestOrderedAndShuffled(t *testing.T) {
	descs := mixedDescs(2000, 12)
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	entries, size, err := p.Manifest(0)
	require.NoError(t, err)
	sorted := append([]Entry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Offset < sorted[j].Offset })
	for _, e := range [][]Entry{entries, sorted} {
		q, err := FromManifest(e, size)
		require.NoError(t, err)
		require.Equal(t, len(e), q.Len())
		// An overlap is found whether the entries come sorted or not.
		bad := append([]Entry(nil), e...)
		last := len(bad) - 1
		for k := range bad {
			if bad[k].Offset == sorted[last].Offset {
				bad[k].Offset = sorted[last-1].Offset
			}
		}
		_, err = FromManifest(bad, size)
		requireProblem(t, err, problemOverlap)
	}
}

// modelLayout is the layout NewPlan documents, computed the plain way:
// groups in increasing Dest, classes in first-appearance order, each on an
// Align boundary, blocks of a class in list order at the class stride.
func modelLayout(descs []Desc, o Options) (offs []int64, dests []int, bytes []int64) {
	o, _ = o.resolve()
	type key struct {
		dest       int
		dt         DType
		rows, cols int
	}
	var keys []key
	index := map[key]int{}
	count := map[key]int64{}
	rank := make([]int64, len(descs))
	for i, d := range descs {
		k := key{d.Dest, d.DType, d.Rows, d.Cols}
		if _, ok := index[k]; !ok {
			index[k] = len(keys)
			keys = append(keys, k)
		}
		rank[i] = count[k]
		count[k]++
	}
	order := append([]key(nil), keys...)
	sort.SliceStable(order, func(a, b int) bool { return order[a].dest < order[b].dest })
	start := map[key]int64{}
	stride := func(k key) int64 {
		bb := int64(k.rows) * int64(k.cols) * k.dt.Size()
		return alignUp(bb, max(o.BlockAlign, k.dt.Size()))
	}
	var cursor int64
	for j, k := range order {
		if j == 0 || k.dest != order[j-1].dest {
			if j > 0 {
				bytes = append(bytes, alignUp(cursor, o.Align))
			}
			dests = append(dests, k.dest)
			cursor = 0
		}
		cursor = alignUp(cursor, o.Align)
		start[k] = cursor
		cursor += stride(k) * count[k]
	}
	bytes = append(bytes, alignUp(cursor, o.Align))
	offs = make([]int64, len(descs))
	for i, d := range descs {
		k := key{d.Dest, d.DType, d.Rows, d.Cols}
		offs[i] = start[k] + rank[i]*stride(k)
	}
	return offs, dests, bytes
}

func requireModelLayout(t *testing.T, descs []Desc, o Options) *Plan {
	t.Helper()
	p, err := NewPlan(descs, o)
	require.NoError(t, err)
	offs, dests, bytes := modelLayout(descs, o)
	require.Len(t, p.Groups(), len(dests))
	for g, gr := range p.Groups() {
		require.Equal(t, dests[g], gr.Dest)
		require.Equal(t, bytes[g], gr.Bytes, "group %d", g)
	}
	for i, d := range descs {
		got, off, err := p.block(i)
		require.NoError(t, err)
		require.Equal(t, d, got)
		require.Equal(t, offs[i], off, "block %d", i)
	}
	return p
}

// TestPlanMatchesModel compares NewPlan with the plain computation on lists
// that take every way through the classification: small and large plans,
// few classes and more than the class table on the stack holds, shapes past
// 32, several destinations, padded blocks.
func TestPlanMatchesModel(t *testing.T) {
	for seed := range uint64(24) {
		rng := rand.New(rand.NewPCG(seed, 21))
		n := []int{1, 7, 600, 5000, 20000}[seed%5]
		maxDim := []int{3, 32, 40}[seed%3]
		dests := 1 + int(seed%4)/2*3
		descs := make([]Desc, n)
		for i := range descs {
			descs[i] = Desc{ID: rng.Uint64(), DType: DType(1 + rng.IntN(4)), Rows: 1 + rng.IntN(maxDim), Cols: 1 + rng.IntN(maxDim), Dest: rng.IntN(dests)}
		}
		o := Options{}
		if seed%3 == 1 {
			o = Options{Align: 64, BlockAlign: 32}
		}
		requireModelLayout(t, descs, o)
	}
}

// TestPlanManyClasses has more classes than a 32-bit place holds beside the
// rank of 2^17 blocks (2^14), which NewPlan lays out with explicit offsets.
func TestPlanManyClasses(t *testing.T) {
	descs := make([]Desc, 1<<17)
	for i := range descs {
		descs[i] = Desc{ID: uint64(i), DType: Float32, Rows: 1 + i%200, Cols: 1 + (i/200)%110, Dest: i / (1 << 16)}
	}
	p := requireModelLayout(t, descs, Options{})
	require.NotNil(t, p.offs, "explicit offsets")
	require.Greater(t, len(p.Classes()), 1<<14)
	checkLayout(t, p, descs)
	// Joined, the explicit offsets move with their groups.
	j, err := p.Joined(func(g int) int64 { return int64(g) * p.Options().Align })
	require.NoError(t, err)
	require.NotNil(t, j.offs)
	_, starts, _ := j.joinedFrom()
	for i := range descs {
		_, off, err := p.block(i)
		require.NoError(t, err)
		_, joff, err := j.block(i)
		require.NoError(t, err)
		if joff != starts[descs[i].Dest]+off {
			t.Fatalf("block %d: joined offset %d, want %d", i, joff, starts[descs[i].Dest]+off)
		}
	}
	// The same with ids in no order, which the plan stores.
	rand.New(rand.NewPCG(5, 5)).Shuffle(len(descs), func(i, j int) { descs[i].ID, descs[j].ID = descs[j].ID, descs[i].ID })
	p = requireModelLayout(t, descs, Options{})
	require.NotNil(t, p.offs, "explicit offsets")
	require.NotNil(t, p.ids, "stored ids")
	checkLayout(t, p, descs)
	// One class fewer than the limit still packs into 32 bits.
	descs = descs[:1<<16]
	for i := range descs {
		descs[i] = Desc{ID: uint64(i), DType: Float32, Rows: 1 + i%(1<<15-1)}
		descs[i].Cols = 1
	}
	p = requireModelLayout(t, descs, Options{})
	require.Nil(t, p.offs)
	require.Equal(t, 1<<15-1, len(p.Classes()))
}

// TestPlanIDOrder covers the shortcut that skips the duplicate check for
// increasing ids, around the ids that could fool it: 0 and 2^64-1.
func TestPlanIDOrder(t *testing.T) {
	const top = ^uint64(0)
	for _, n := range []int{8, 5000} {
		// upFrom is n-k ids counting up from id, then the tail.
		upFrom := func(id uint64, k int, tail ...uint64) []uint64 {
			ids := make([]uint64, 0, n)
			for range n - k {
				ids = append(ids, id)
				id++
			}
			return append(ids, tail...)
		}
		for _, c := range []struct {
			name string
			ids  []uint64
			dup  int // index of the expected duplicate, -1 for none
		}{
			{"from 0", upFrom(0, 0), -1},
			{"up to the top", upFrom(top-uint64(n-1), 0), -1},
			{"top first", append([]uint64{top}, upFrom(0, 1)...), -1},
			{"0 after the top", upFrom(top-uint64(n-2), 1, 0), -1},
			{"the top twice", upFrom(0, 2, top, top), n - 1},
			{"0 again after the top", upFrom(0, 2, top, 0), n - 1},
			{"a repeat", upFrom(0, 1, 3), n - 1},
		} {
			descs := make([]Desc, n)
			for i := range descs {
				descs[i] = Desc{ID: c.ids[i], DType: Float64, Rows: 1 + i%5, Cols: 2}
			}
			_, err := NewPlan(descs, Options{})
			if c.dup < 0 {
				require.NoError(t, err, "%s, %d blocks", c.name, n)
				continue
			}
			requireProblem(t, err, problemDuplicate, "%s, %d blocks", c.name, n)
			var be *BlockError
			require.True(t, errors.As(err, &be))
			require.Equal(t, c.dup, be.Index, "%s, %d blocks", c.name, n)
		}
	}
}

// TestPlanCountedIDs covers ids that count in steps, which a plan keeps as
// two words, and lists that look like it at the first, second and last
// blocks but not in between.
func TestPlanCountedIDs(t *testing.T) {
	const top = ^uint64(0)
	for _, n := range []int{1, 2, 3, 600, 5000} {
		mid := -1 // the block in the middle, where it is not an end
		if n > 2 {
			mid = n / 2
		}
		for _, c := range []struct {
			name    string
			id      func(i int) uint64
			counted bool
			dup     int // index of the expected duplicate, -1 for none
		}{
			{"from 0", func(i int) uint64 { return uint64(i) }, true, -1},
			{"in threes", func(i int) uint64 { return 7 + 3*uint64(i) }, true, -1},
			{"down from the top", func(i int) uint64 { return top - uint64(i) }, true, -1},
			{"across 0", func(i int) uint64 { return top - uint64(n/2) + uint64(i) }, true, -1},
			{"steps of 2^32", func(i int) uint64 { return uint64(i) << 32 }, true, -1},
			{"steps of 2^33", func(i int) uint64 { return uint64(i) << 33 }, n < 2, -1},
			{"one off in the middle", func(i int) uint64 {
				if i == mid {
					return 2*uint64(i) + 1
				}
				return 2 * uint64(i)
			}, mid < 0, -1},
			{"repeat in the middle", func(i int) uint64 {
				if i == mid {
					return 0
				}
				return 2 * uint64(i)
			}, mid < 0, mid},
			{"all equal", func(int) uint64 { return 9 }, n < 2, min(1, n-1)},
		} {
			if c.dup == 0 {
				c.dup = -1 // a single block cannot repeat
			}
			descs := make([]Desc, n)
			for i := range descs {
				descs[i] = Desc{ID: c.id(i), DType: Float32, Rows: 1, Cols: 64 * (1 + i%7)}
			}
			if c.dup >= 0 {
				_, err := NewPlan(descs, Options{})
				requireProblem(t, err, problemDuplicate, "%s, %d blocks", c.name, n)
				var be *BlockError
				require.True(t, errors.As(err, &be))
				require.Equal(t, c.dup, be.Index, "%s, %d blocks", c.name, n)
				continue
			}
			p := requireModelLayout(t, descs, Options{})
			require.Equal(t, c.counted, p.ids == nil, "%s, %d blocks: ids kept as a step", c.name, n)
			for i, d := range descs {
				j, ok := p.index(d.ID)
				require.True(t, ok)
				require.Equal(t, i, j)
			}
			m, _, err := p.Manifest(0)
			require.NoError(t, err)
			for k, e := range m {
				require.Equal(t, descs[k].ID, e.ID)
			}
		}
	}
}

// TestClassSize keeps Class at 64 bytes, which plans of few blocks pay for
// in allocation.
func TestClassSize(t *testing.T) {
	if unsafe.Sizeof(0) == 8 {
		require.EqualValues(t, 64, unsafe.Sizeof(Class{}))
	}
}

// TestDetached checks that Detached(g) is the plan a receiver rebuilds from
// group g's manifest in offset order, for NewPlan layouts (several groups,
// block alignment, shuffled ids, dense ids) and for manifest plans whose
// classes interleave.
func TestDetached(t *testing.T) {
	withDests := func(descs []Desc, ranks int, seed uint64) []Desc {
		rng := rand.New(rand.NewPCG(seed, 3))
		out := slices.Clone(descs)
		for i := range out {
			out[i].Dest = rng.IntN(ranks)
		}
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		return out
	}
	dense := make([]Desc, 500)
	for i := range dense {
		dense[i] = Desc{ID: uint64(i), DType: Float32, Rows: 1 + i%3, Cols: 2}
	}
	plans := map[string]*Plan{}
	mk := func(name string, descs []Desc, o Options) {
		p, err := NewPlan(descs, o)
		require.NoError(t, err)
		plans[name] = p
	}
	mk("one group", mixedDescs(700, 1), Options{})
	mk("dense ids", dense, Options{})
	mk("five groups, shuffled", withDests(mixedDescs(900, 2), 5, 9), Options{})
	mk("block align", withDests(mixedDescs(300, 3), 3, 4), Options{Align: 512, BlockAlign: 64})
	// A manifest whose classes interleave: two shapes taking turns.
	var inter []Entry
	for k := range 40 {
		inter = append(inter, Entry{ID: uint64(1000 - k), DType: Float64, Rows: 1 + k%2, Cols: 1, Offset: int64(16 * k)})
	}
	rng := rand.New(rand.NewPCG(5, 5))
	rng.Shuffle(len(inter), func(i, j int) { inter[i], inter[j] = inter[j], inter[i] })
	q, err := FromManifest(inter, 16*40)
	require.NoError(t, err)
	plans["interleaved manifest"] = q
	// A class at uneven steps, a class of one and one at an even step.
	q, err = FromManifest([]Entry{
		{ID: 5, DType: Float64, Rows: 1, Cols: 1, Offset: 24}, {ID: 6, DType: Float64, Rows: 1, Cols: 1, Offset: 0},
		{ID: 7, DType: Float64, Rows: 1, Cols: 1, Offset: 8}, {ID: 8, DType: Float32, Rows: 1, Cols: 2, Offset: 40},
		{ID: 9, DType: Float64, Rows: 2, Cols: 1, Offset: 48}, {ID: 10, DType: Float64, Rows: 2, Cols: 1, Offset: 64},
	}, 96)
	require.NoError(t, err)
	plans["irregular manifest"] = q

	for name, p := range plans {
		if p.manifest() {
			require.NotNil(t, p.offs, name)
		} else {
			require.Nil(t, p.offs, "%s: a plan of a few classes keeps ranks, not offsets", name)
		}
		for g := range p.Groups() {
			got, entries := checkDetached(t, p, g, name)
			checkManifestClasses(t, got)
			for _, e := range entries {
				i, ok := got.index(e.ID)
				require.True(t, ok)
				d, off, err := got.block(i)
				require.NoError(t, err)
				require.Equal(t, e.Offset, off)
				require.Equal(t, NoDest, d.Dest, "a received layout has no destination")
			}
		}
		_, err := p.Detached(len(p.Groups()))
		require.ErrorIs(t, err, distbuf.ErrInvalid)
	}
}

// TestDetachedWidePlaces: a plan with more classes than 32-bit places hold
// beside its ranks keeps every block's offset, and Detached makes its
// groups' layouts from those (the other plans keep ranks instead).
func TestDetachedWidePlaces(t *testing.T) {
	p, err := NewPlan(wideDescs(), Options{})
	require.NoError(t, err)
	require.NotNil(t, p.offs, "a plan of 40000 classes keeps its offsets")
	require.Greater(t, p.Classes()[0].Count, 1)
	for g := range p.Groups() {
		checkDetached(t, p, g, "wide places")
	}
}

// checkDetached checks p.Detached(g) against the plan FromManifest makes of
// group g's manifest: the same classes and groups, and the same blocks in
// offset order. It returns the detached plan and those blocks.
func checkDetached(t *testing.T, p *Plan, g int, name string) (*Plan, []Entry) {
	t.Helper()
	entries, size, err := p.Manifest(g)
	require.NoError(t, err)
	slices.SortFunc(entries, func(a, b Entry) int { return cmp.Compare(a.Offset, b.Offset) })
	want, err := FromManifest(entries, size)
	require.NoError(t, err)
	got, err := p.Detached(g)
	require.NoError(t, err, "%s, group %d", name, g)
	require.Equal(t, want.Classes(), got.Classes(), "%s, group %d: classes", name, g)
	require.Equal(t, want.Groups(), got.Groups(), "%s, group %d: groups", name, g)
	gotEntries, gotSize, err := got.Manifest(0)
	require.NoError(t, err)
	require.Equal(t, entries, gotEntries, "%s, group %d: blocks in offset order", name, g)
	require.Equal(t, size, gotSize)
	return got, entries
}

// checkManifestClasses checks a single-group plan's classes against its
// blocks, computed the plain way: each shape's blocks in offset order,
// Regular when they sit at one step no shorter than a block (that step is
// the Stride; the block size for a class of one; 0 when not Regular).
func checkManifestClasses(t *testing.T, q *Plan) {
	t.Helper()
	entries, _, err := q.Manifest(0)
	require.NoError(t, err)
	slices.SortFunc(entries, func(a, b Entry) int { return cmp.Compare(a.Offset, b.Offset) })
	for ci, cl := range q.Classes() {
		var offs []int64
		for _, e := range entries {
			if e.Rows == cl.Rows && e.Cols == cl.Cols && e.DType == cl.DType {
				offs = append(offs, e.Offset)
			}
		}
		require.Len(t, offs, cl.Count, "class %d", ci)
		require.Equal(t, offs[0], cl.Offset, "class %d starts at its first block", ci)
		step, regular := cl.BlockBytes, true
		if len(offs) > 1 {
			step = offs[1] - offs[0]
			regular = step >= cl.BlockBytes
			for k := 2; k < len(offs); k++ {
				regular = regular && offs[k]-offs[k-1] == step
			}
		}
		if !regular {
			step = 0
		}
		require.Equal(t, regular, cl.Regular, "class %d", ci)
		require.Equal(t, step, cl.Stride, "class %d", ci)
	}
}

// TestPlanClassTableOnStack: a plan of up to 256 classes, as the joined A
// and B operands of a solve with a hundred-odd shapes each, keeps its class
// table on the stack: it allocates the plan, its block and class arrays
// and the class order, nothing for the table.
func TestPlanClassTableOnStack(t *testing.T) {
	descs := make([]Desc, 2000)
	for i := range descs {
		c := i % 250 // 250 shapes
		descs[i] = Desc{ID: uint64(i), DType: Float64, Rows: 1 + c/16, Cols: 1 + c%16}
	}
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	require.Len(t, p.Classes(), 250)
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := NewPlan(descs, Options{}); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 4.0)
}

// TestGroupPosition: every block of the list is found at the group and
// group position its plan lays it out at, counted here from the list alone
// (groups in increasing destination, positions in list order), in a single
// group, in groups the list gives one after another, in interleaved ones,
// in a joined plan (one group, positions the plan indices) and in a
// received layout; the buffers agree.
func TestGroupPosition(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	runs, mixed, sparse := mixedDescs(300, 21), mixedDescs(300, 21), mixedDescs(300, 21)
	for i := range runs {
		runs[i].Dest, mixed[i].Dest = i*3/len(runs), (i*7)%3
		sparse[i].Dest = []int{9, 2, 5, 2}[i%4] // groups 2, 5, 9: not the dests
	}
	// expected counts each block's group and position from the list.
	expected := func(descs []Desc) (gs, ks []int) {
		dests := map[int]bool{}
		for _, d := range descs {
			dests[d.Dest] = true
		}
		order := slices.Sorted(maps.Keys(dests))
		seen := map[int]int{}
		for _, d := range descs {
			gs = append(gs, slices.Index(order, d.Dest))
			ks = append(ks, seen[d.Dest])
			seen[d.Dest]++
		}
		return gs, ks
	}
	check := func(name string, p *Plan, ids []uint64, gs, ks []int) {
		t.Helper()
		cs, err := allocGroups(a, p, s)
		require.NoError(t, err, name)
		for i, id := range ids {
			g, k, err := p.GroupPosition(i)
			require.NoError(t, err, "%s: block %d", name, i)
			require.Equal(t, gs[i], g, "%s: block %d's group", name, i)
			require.Equal(t, ks[i], k, "%s: block %d's position", name, i)
			v, err := cs[g].View(k)
			require.NoError(t, err)
			require.Equal(t, id, v.Desc().ID, "%s: the view at block %d's group position", name, i)
		}
		for _, i := range []int{-1, p.Len(), 1 << 40} {
			_, _, err := p.GroupPosition(i)
			requireProblem(t, err, "outside a plan", "%s: index %d", name, i)
		}
		for _, c := range cs {
			require.NoError(t, c.Free())
		}
	}
	for _, tc := range []struct {
		name  string
		descs []Desc
	}{{"one group", mixedDescs(300, 21)}, {"runs", runs}, {"interleaved", mixed}, {"sparse dests", sparse}} {
		p, err := NewPlan(tc.descs, Options{})
		require.NoError(t, err)
		ids := make([]uint64, len(tc.descs))
		for i, d := range tc.descs {
			ids[i] = d.ID
		}
		gs, ks := expected(tc.descs)
		check(tc.name, p, ids, gs, ks)
		j, err := p.Joined(nil)
		require.NoError(t, err)
		all := make([]int, len(ids))
		for i := range all {
			all[i] = i
		}
		check(tc.name+", joined", j, ids, make([]int, len(ids)), all)
	}
	p, err := NewPlan(mixed, Options{})
	require.NoError(t, err)
	m, entries, _ := received(t, p, 1)
	ids := make([]uint64, len(entries))
	ks := make([]int, len(entries))
	for k, e := range entries {
		ids[k], ks[k] = e.ID, k
	}
	check("received", m, ids, make([]int, len(ids)), ks)
}

func TestDTypeSizeAndString(t *testing.T) {
	for _, tc := range []struct {
		d    DType
		size int64
		name string
	}{
		{0, 0, "DType(0)"},
		{Float32, 4, "float32"},
		{Float64, 8, "float64"},
		{Complex64, 8, "complex64"},
		{Complex128, 16, "complex128"},
		{5, 0, "DType(5)"},
		{255, 0, "DType(255)"},
	} {
		require.Equal(t, tc.size, tc.d.Size(), "%d", uint8(tc.d))
		require.Equal(t, tc.name, tc.d.String())
	}
}
