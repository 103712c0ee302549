package packing

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

func TestCoalescedOneAllocation(t *testing.T) {
	forBackends(t, func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream) {
		descs := mixedDescs(10000, 21)
		p, err := NewPlan(descs, Options{})
		require.NoError(t, err)
		before := a.Stats()
		c, err := Alloc(a, p, s)
		require.NoError(t, err)
		after := a.Stats()
		require.EqualValues(t, 1, after.AllocCalls-before.AllocCalls, "one Alloc for 10000 blocks")
		require.EqualValues(t, 1, after.BackendCalls-before.BackendCalls, "one backend call for 10000 blocks")
		require.EqualValues(t, 1, after.LiveBuffers-before.LiveBuffers)
		require.Equal(t, p.Groups()[0].Bytes, c.Size())
		require.NoError(t, c.Free())
		require.EqualValues(t, 1, a.Stats().Frees-before.Frees, "one free")
	})
}

func TestCoalescedGroupsOneAllocationEach(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	descs := mixedDescs(3000, 22)
	for i := range descs {
		descs[i].Dest = i % 4
	}
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	_, err = Alloc(a, p, s)
	requireProblem(t, err, "msg.AllocSend", "a multi-destination plan needs an explicit group")
	before := a.Stats()
	cs, err := allocGroups(a, p, s)
	require.NoError(t, err)
	require.EqualValues(t, 4, a.Stats().AllocCalls-before.AllocCalls, "one allocation per destination, not per block")
	require.EqualValues(t, 4, a.Stats().BackendCalls-before.BackendCalls)
	for g, c := range cs {
		require.Equal(t, g, c.Dest())
		require.Equal(t, 750, c.Len())
		views, err := views(c)
		require.NoError(t, err)
		for k, v := range views {
			require.Equal(t, descs[4*k+g].ID, v.id(), "group positions follow list order")
			require.Equal(t, g, v.Desc().Dest)
			at, err := c.Position(v.id())
			require.NoError(t, err)
			require.Equal(t, k, at, "Position is the view's group position")
		}
		_, err = c.Position(descs[(g+1)%4].ID)
		require.ErrorIs(t, err, distbuf.ErrInvalid, "a block of another group")
		_, err = c.Position(1 << 62)
		require.ErrorIs(t, err, distbuf.ErrInvalid, "no such id")
		require.NoError(t, c.Free())
		_, err = c.Position(views[0].id())
		require.ErrorIs(t, err, distbuf.ErrFreed)
	}
}

func TestCoalescedPaddingZero(t *testing.T) {
	forBackends(t, func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream) {
		// Padding between a few classes (one memset per gap on a device),
		// between many (one memset of everything), and none at all.
		few := []Desc{
			{ID: 1, DType: Float32, Rows: 3, Cols: 1}, // 12 bytes, then padding to 256
			{ID: 2, DType: Complex128, Rows: 2, Cols: 1},
			{ID: 3, DType: Float32, Rows: 3, Cols: 1},
			{ID: 4, DType: Float64, Rows: 1, Cols: 3},
		}
		var many, none []Desc
		for i := range 7 {
			many = append(many, Desc{ID: uint64(i), DType: Float32, Rows: 1, Cols: i + 1})
			none = append(none, Desc{ID: uint64(i), DType: Float32, Rows: 1, Cols: 64 * (i%3 + 1)})
		}
		for _, tc := range []struct {
			descs []Desc
			opts  Options
		}{{few, Options{}}, {few, Options{BlockAlign: 64}}, {many, Options{}}, {none, Options{}}, {none, Options{BlockAlign: 256}}} {
			descs, opts := tc.descs, tc.opts
			p, err := NewPlan(descs, opts)
			require.NoError(t, err)
			leaveJunk(t, a, s, p.Groups()[0].Bytes, 0xAB)
			require.NoError(t, s.Synchronize())
			c, err := Alloc(a, p, s)
			require.NoError(t, err)
			views, err := views(c)
			require.NoError(t, err)
			// Fill every block with 0xFF; everything else must read zero.
			fill := make([][]byte, len(views))
			for k, v := range views {
				fill[k] = bytes.Repeat([]byte{0xFF}, int(v.bytes()))
			}
			require.NoError(t, PackHost(s, c, fill))
			mem := readAll(t, s, c.Buffer())[:c.Size()]
			inBlock := make([]bool, len(mem))
			for _, v := range views {
				for b := v.Offset(); b < v.Offset()+v.bytes(); b++ {
					inBlock[b] = true
				}
			}
			for i, b := range mem {
				if inBlock[i] {
					require.Equal(t, byte(0xFF), b, "block byte %d", i)
				} else {
					require.Zero(t, b, "padding byte %d (options %+v)", i, opts)
				}
			}
			require.NoError(t, c.Free())
		}
	})
}

func TestViewsAndAccessors(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	descs := []Desc{
		{ID: 7, DType: Float64, Rows: 2, Cols: 3},
		{ID: 8, DType: Float32, Rows: 1, Cols: 4},
		{ID: 9, DType: Complex64, Rows: 2, Cols: 2},
		{ID: 10, DType: Complex128, Rows: 1, Cols: 1},
	}
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	require.NoError(t, s.Synchronize())
	base, _, _, err := c.Buffer().Region()
	require.NoError(t, err)
	for k, d := range descs {
		v, err := c.View(k)
		require.NoError(t, err)
		_, off, _ := p.block(k)
		require.Equal(t, d.ID, v.id())
		require.Equal(t, off, v.Offset())
		require.Equal(t, base+uintptr(off), v.addr())
		require.Equal(t, [3]any{d.DType, d.Rows, d.Cols}, [3]any{v.dtype(), v.Desc().Rows, v.Desc().Cols})
		require.Equal(t, d.Bytes(), v.bytes())
		raw, err := viewSlice[byte](v, 0)
		require.NoError(t, err)
		require.Len(t, raw, int(d.Bytes()))
	}
	v0, _ := c.View(0)
	f64, err := viewSlice[float64](v0, Float64)
	require.NoError(t, err)
	require.Len(t, f64, 6)
	f64[5] = math.Pi
	raw, _ := viewSlice[byte](v0, 0)
	require.Equal(t, math.Float64bits(math.Pi), binary.LittleEndian.Uint64(raw[40:]))
	_, err = viewSlice[float32](v0, Float32)
	require.ErrorIs(t, err, distbuf.ErrInvalid, "dtype mismatch")
	v1, _ := c.View(1)
	f32, err := viewSlice[float32](v1, Float32)
	require.NoError(t, err)
	require.Len(t, f32, 4)
	v2, _ := c.View(2)
	c64, err := viewSlice[complex64](v2, Complex64)
	require.NoError(t, err)
	require.Len(t, c64, 4)
	v3, err := viewByID(c, 10)
	require.NoError(t, err)
	c128, err := viewSlice[complex128](v3, Complex128)
	require.NoError(t, err)
	require.Len(t, c128, 1)
	_, err = viewByID(c, 99)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	_, err = c.View(4)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	_, err = c.View(-1)
	require.ErrorIs(t, err, distbuf.ErrInvalid)

	// Use after free: the Coalesced, every view, a second Free.
	require.NoError(t, c.Free())
	_, err = c.View(0)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = viewSlice[float64](v0, Float64)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = viewSlice[byte](v3, 0)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = views(c)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = c.Buffer().Write(s)
	require.ErrorIs(t, err, distbuf.ErrFreed, "the buffer went with the Coalesced")
	require.ErrorIs(t, c.Free(), distbuf.ErrFreed)
}

func TestDeviceViewsHaveNoHostSlice(t *testing.T) {
	a := openCUDA(t)
	defer closeClean(t, a)
	p, err := NewPlan([]Desc{{ID: 1, DType: Float64, Rows: 2, Cols: 2}}, Options{})
	require.NoError(t, err)
	c, err := Alloc(a, p, a.DefaultStream())
	require.NoError(t, err)
	v, err := c.View(0)
	require.NoError(t, err)
	require.NotZero(t, v.addr())
	_, err = viewSlice[float64](v, Float64)
	require.ErrorIs(t, err, distbuf.ErrNotHostAccessible)
	require.NoError(t, c.Free())
}

// TestFreeAfterLastViewCompletion: work on a view declared on another
// stream keeps the memory until it completes, and Free neither blocks nor
// frees twice.
func TestFreeAfterLastViewCompletion(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	p, err := NewPlan(mixedDescs(100, 30), Options{})
	require.NoError(t, err)
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	v, err := c.View(0)
	require.NoError(t, err)
	f, err := viewSlice[float64](v, Float64)
	require.NoError(t, err)
	gate := make(chan struct{})
	wrote := make(chan struct{})
	w, err := c.Buffer().Write(s2)
	require.NoError(t, err)
	require.NoError(t, s2.Enqueue(func() error {
		<-gate
		f[0] = 42 // the memory is still ours: Free waits for this completion
		close(wrote)
		return nil
	}))
	require.NoError(t, w.Done())
	before := a.Stats()
	require.NoError(t, c.Free()) // must not block on the gated work
	require.EqualValues(t, 1, a.Stats().Frees-before.Frees)
	select {
	case <-wrote:
		t.Fatal("the write ran before the gate opened")
	default:
	}
	close(gate)
	require.NoError(t, s2.Synchronize())
	require.NoError(t, a.Sync())
	require.EqualValues(t, before.LiveBuffers-1, a.Stats().LiveBuffers, "released once, after the view's work")
	_, err = c.View(0)
	require.ErrorIs(t, err, distbuf.ErrFreed)
}

func TestWrapReceivedBuffer(t *testing.T) {
	forBackends(t, func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream) {
		descs := mixedDescs(500, 31)
		p, err := NewPlan(descs, Options{})
		require.NoError(t, err)
		sender, err := Alloc(a, p, s)
		require.NoError(t, err)
		src := make([][]byte, len(descs))
		for k, d := range descs {
			src[k] = bytes.Repeat([]byte{byte(k)}, int(d.Bytes()))
		}
		require.NoError(t, PackHost(s, sender, src))
		// The "message": manifest plus payload copied into a fresh buffer.
		entries, size, err := p.Manifest(0)
		require.NoError(t, err)
		recvBuf, err := a.Alloc(size, s)
		require.NoError(t, err)
		require.NoError(t, s.Copy(recvBuf, 0, sender.Buffer(), 0, size))
		q, err := FromManifest(entries, size)
		require.NoError(t, err)
		before := a.Stats()
		recv, err := Wrap(recvBuf, 0, q, 0, nil)
		require.NoError(t, err)
		require.Equal(t, before.AllocCalls, a.Stats().AllocCalls, "wrapping allocates nothing")
		require.Equal(t, src, unpacked(t, s, recv))
		require.NoError(t, recv.Free())
		_, _, _, err = recvBuf.Region()
		require.ErrorIs(t, err, distbuf.ErrFreed, "the Coalesced owns the wrapped buffer")
		// A buffer too small for the layout.
		small, err := a.Alloc(size/2, s)
		require.NoError(t, err)
		_, err = Wrap(small, 0, q, 0, nil)
		require.ErrorIs(t, err, distbuf.ErrInvalid)
		_, err = Wrap(small, 0, q, 1, nil)
		require.ErrorIs(t, err, distbuf.ErrInvalid)
		require.NoError(t, small.Free())
		require.NoError(t, sender.Free())
	})
}

func TestAllocManifestLayoutZeroed(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	// Two classes interleaved, with holes: only a manifest can say this.
	entries := []Entry{
		{ID: 1, DType: Float64, Rows: 1, Cols: 1, Offset: 0},
		{ID: 2, DType: Float32, Rows: 1, Cols: 2, Offset: 16},
		{ID: 3, DType: Float64, Rows: 1, Cols: 1, Offset: 40},
	}
	p, err := FromManifest(entries, 64)
	require.NoError(t, err)
	leaveJunk(t, a, s, 64, 0xCD)
	require.NoError(t, s.Synchronize())
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 64), readAll(t, s, c.Buffer())[:64])
	require.NoError(t, c.Free())
}

func TestMillionBlocksOneAllocation(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	descs := make([]Desc, 1_000_000)
	for i := range descs {
		descs[i] = Desc{ID: uint64(i), DType: Float32, Rows: 1 + i%2, Cols: 1 + i%3}
	}
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	before := a.Stats()
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	require.EqualValues(t, 1, a.Stats().BackendCalls-before.BackendCalls)
	views, err := views(c)
	require.NoError(t, err)
	require.Len(t, views, 1_000_000)
	base, _, _, err := c.Buffer().Region()
	require.NoError(t, err)
	last := views[len(views)-1]
	require.LessOrEqual(t, last.addr()+uintptr(last.bytes()), base+uintptr(c.Size()))
	// Write every block through its view, read a few back.
	w, err := c.Buffer().Write(s)
	require.NoError(t, err)
	require.NoError(t, s.Enqueue(func() error {
		for _, v := range views {
			f, err := viewSlice[float32](v, Float32)
			if err != nil {
				return err
			}
			f[len(f)-1] = float32(v.id())
		}
		return nil
	}))
	require.NoError(t, w.Done())
	require.NoError(t, s.Synchronize())
	for _, k := range []int{0, 1, 499_999, 999_999} {
		f, err := viewSlice[float32](views[k], Float32)
		require.NoError(t, err)
		require.Equal(t, float32(k), f[len(f)-1])
	}
	require.NoError(t, c.Free())
}

func TestAllViews(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	descs := mixedDescs(50, 70)
	for i := range descs {
		descs[i].Dest = i % 2
	}
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	cs, err := allocGroups(a, p, a.DefaultStream())
	require.NoError(t, err)
	for g, c := range cs {
		want, err := views(c)
		require.NoError(t, err)
		var got []View
		for k, v := range c.All() {
			require.Equal(t, len(got), k)
			got = append(got, v)
			require.Equal(t, descs[2*k+g].ID, v.id())
		}
		require.Equal(t, want, got)
		for range c.All() {
			break // stopping early is fine
		}
		require.NoError(t, c.Free())
		for range c.All() {
			t.Fatal("a freed buffer yields no views")
		}
	}
}

func TestAllocPrefixedAndWrapAt(t *testing.T) {
	forBackends(t, func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream) {
		descs := mixedDescs(300, 41)
		for i := range descs {
			descs[i].Dest = i % 2
		}
		p, err := NewPlan(descs, Options{})
		require.NoError(t, err)
		const prefix = 512
		before := a.Stats()
		c, err := Alloc(a, p, s, AllocOptions{Group: 1, Prefix: prefix})
		require.NoError(t, err)
		require.EqualValues(t, 1, a.Stats().AllocCalls-before.AllocCalls, "prefix and layout are one allocation")
		require.EqualValues(t, prefix, c.Start())
		require.Equal(t, p.Groups()[1].Bytes, c.Size())
		require.Equal(t, prefix+c.Size(), c.Buffer().Size())
		require.Equal(t, 1, c.Dest())
		base, _, _, err := c.Buffer().Region()
		require.NoError(t, err)
		members, err := p.groupMembers(1)
		require.NoError(t, err)
		src := make([][]byte, c.Len())
		for k := range src {
			v, err := c.View(k)
			require.NoError(t, err)
			require.Equal(t, base+prefix+uintptr(v.Offset()), v.addr(), "views start after the prefix")
			require.Equal(t, descs[members[k]].ID, v.id())
			src[k] = bytes.Repeat([]byte{byte(k + 1)}, int(v.bytes()))
		}
		// Write the prefix and the blocks; the prefix must survive the
		// padding clear and the packing.
		pre, err := a.AllocPinned(prefix, s)
		require.NoError(t, err)
		mem, err := pre.Bytes()
		require.NoError(t, err)
		for i := range mem {
			mem[i] = 0xAB
		}
		require.NoError(t, s.Copy(c.Buffer(), 0, pre, 0, prefix))
		require.NoError(t, pre.Free())
		require.NoError(t, PackHost(s, c, src))
		all := readAll(t, s, c.Buffer())
		require.Equal(t, bytes.Repeat([]byte{0xAB}, prefix), all[:prefix])

		// The same bytes seen through Wrap at the prefix over a copy of the buffer.
		cp, err := a.Alloc(c.Buffer().Size(), s)
		require.NoError(t, err)
		require.NoError(t, s.Copy(cp, 0, c.Buffer(), 0, cp.Size()))
		w, err := Wrap(cp, prefix, p, 1, nil)
		require.NoError(t, err)
		require.EqualValues(t, prefix, w.Start())
		require.Equal(t, src, unpacked(t, s, w))

		// Transfer between layouts at different starts.
		flat, err := allocGroups(a, p, s)
		require.NoError(t, err)
		require.NoError(t, transfer(s, flat[1], w))
		require.Equal(t, src, unpacked(t, s, flat[1]))
		for _, f := range flat {
			require.NoError(t, f.Free())
		}

		// Bad starts.
		_, err = Alloc(a, p, s, AllocOptions{Group: 0, Prefix: 100})
		requireProblem(t, err, problemAlign, "a prefix that would misalign the classes")
		_, err = Alloc(a, p, s, AllocOptions{Prefix: -256})
		requireProblem(t, err, problemAlign)
		_, err = Alloc(a, p, s, AllocOptions{Group: 2, Prefix: 256})
		require.ErrorIs(t, err, distbuf.ErrInvalid)
		_, err = Wrap(cp, 8, p, 1, nil)
		requireProblem(t, err, problemAlign)
		_, err = Wrap(cp, prefix+256, p, 1, nil)
		require.ErrorIs(t, err, distbuf.ErrInvalid, "the layout would run past the buffer")
		require.NoError(t, w.Free())
		require.NoError(t, c.Free())
	})
}

func TestWrapAtManifestPlan(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	entries := []Entry{
		{ID: 9, DType: Complex128, Rows: 1, Cols: 2, Offset: 0},
		{ID: 4, DType: Float32, Rows: 3, Cols: 1, Offset: 32},
	}
	q, err := FromManifest(entries, 48)
	require.NoError(t, err)
	buf, err := a.Alloc(16+48, s)
	require.NoError(t, err)
	_, err = Wrap(buf, 8, q, 0, nil)
	requireProblem(t, err, problemAlign, "complex128 elements need 16-byte alignment")
	c, err := Wrap(buf, 16, q, 0, nil)
	require.NoError(t, err)
	v, err := viewByID(c, 4)
	require.NoError(t, err)
	f, err := viewSlice[float32](v, Float32)
	require.NoError(t, err)
	mem, err := buf.Bytes()
	require.NoError(t, err)
	f[0] = 1.5
	require.Equal(t, math.Float32bits(1.5), binary.LittleEndian.Uint32(mem[16+32:]))
	require.NoError(t, c.Free())
}

// A layout of blocks that fill their alignment has no padding to clear, so
// allocating it enqueues no clearing at all.
func TestPaddingSpans(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	for _, tc := range []struct {
		name  string
		descs []Desc
		gaps  int
	}{
		{"aligned blocks", []Desc{{ID: 1, DType: Float32, Rows: 1, Cols: 64}, {ID: 2, DType: Float64, Rows: 4, Cols: 8}}, 0},
		{"gap after each class", []Desc{{ID: 1, DType: Float32, Rows: 1, Cols: 3}, {ID: 2, DType: Float64, Rows: 1, Cols: 1}}, 2},
	} {
		p, err := NewPlan(tc.descs, Options{})
		require.NoError(t, err)
		c, err := Alloc(a, p, s)
		require.NoError(t, err)
		gaps, whole := c.appendPaddingSpans(nil, -1)
		require.False(t, whole, tc.name)
		require.Len(t, gaps, tc.gaps, tc.name)
		for limit := 1; limit <= tc.gaps; limit++ {
			some, _ := c.appendPaddingSpans(nil, limit)
			require.Equal(t, gaps[:limit], some, "%s: the first %d spans", tc.name, limit)
		}
		require.NoError(t, c.Free())
	}
}

// TestLocate: Locate gives View's class and offset for every block of
// grouped, single-group and manifest layouts, and fails where View fails.
func TestLocate(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	same := func(t *testing.T, c *Coalesced) {
		t.Helper()
		for k := range c.Len() {
			v, err := c.View(k)
			require.NoError(t, err)
			class, off, ok := c.Locate(k)
			require.True(t, ok)
			require.Equal(t, c.Plan().classIndex(v.i), class, "block %d", k)
			require.Equal(t, v.Offset(), off, "block %d", k)
		}
		for _, k := range []int{-1, c.Len(), 1 << 40} {
			_, _, ok := c.Locate(k)
			require.False(t, ok, "position %d", k)
		}
	}
	descs := mixedDescs(3000, 23)
	for i := range descs {
		descs[i].Dest = i % 3
	}
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)
	cs, err := allocGroups(a, p, s)
	require.NoError(t, err)
	for _, c := range cs {
		same(t, c)
	}
	single, err := NewPlan(mixedDescs(500, 24), Options{})
	require.NoError(t, err)
	c1, err := Alloc(a, single, s)
	require.NoError(t, err)
	same(t, c1)
	q, err := FromManifest([]Entry{
		{ID: 9, DType: Complex128, Rows: 1, Cols: 2, Offset: 64},
		{ID: 4, DType: Float32, Rows: 3, Cols: 1, Offset: 0},
	}, 96)
	require.NoError(t, err)
	buf, err := a.Alloc(96, s)
	require.NoError(t, err)
	cm, err := Wrap(buf, 0, q, 0, nil)
	require.NoError(t, err)
	same(t, cm)
	for _, c := range append(cs, c1, cm) {
		require.NoError(t, c.Free())
		_, _, ok := c.Locate(0)
		require.False(t, ok, "a freed buffer")
	}
	var none *Coalesced
	_, _, ok := none.Locate(0)
	require.False(t, ok)
}

// TestLocatorAgreesWithLocate: a Locator finds every block where Locate
// does, in a single group, in a group that is a run of the plan's blocks, in
// one whose blocks interleave with another group's, in plans that keep
// offsets (more classes than 32-bit places hold) and in a received layout;
// positions past the group are not found, and a freed buffer has none.
func TestLocatorAgreesWithLocate(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	wide := wideDescs()
	wideRuns := slices.Clone(wide)
	for i := range wideRuns {
		wideRuns[i].Dest = i * 2 / len(wideRuns)
	}
	runs, mixed := mixedDescs(300, 21), mixedDescs(300, 21)
	for i := range runs {
		runs[i].Dest, mixed[i].Dest = i*3/len(runs), i%3
	}
	check := func(name string, c *Coalesced) {
		t.Helper()
		loc, err := c.Locator()
		require.NoError(t, err, name)
		for k := range c.Len() {
			wc, wo, wok := c.Locate(k)
			gc, gotOff, ok := loc.Locate(k)
			require.True(t, wok && ok, "%s: block %d", name, k)
			require.Equal(t, wc, gc, "%s: block %d's class", name, k)
			require.Equal(t, wo, gotOff, "%s: block %d's offset", name, k)
		}
		for _, k := range []int{-1, c.Len(), c.Len() + 1} {
			_, _, ok := loc.Locate(k)
			require.False(t, ok, "%s: position %d", name, k)
		}
	}
	for _, tc := range []struct {
		name  string
		descs []Desc
	}{{"one group", mixedDescs(300, 21)}, {"runs", runs}, {"interleaved", mixed}, {"wide places", wide}, {"wide places in runs", wideRuns}} {
		p, err := NewPlan(tc.descs, Options{})
		require.NoError(t, err)
		for g := range p.Groups() {
			c, err := Alloc(a, p, s, AllocOptions{Group: g})
			require.NoError(t, err)
			check(fmt.Sprintf("%s, group %d", tc.name, g), c)
			require.NoError(t, c.Free())
		}
	}
	p, err := NewPlan(mixed, Options{})
	require.NoError(t, err)
	m, _, _ := received(t, p, 1)
	c, err := Alloc(a, m, s)
	require.NoError(t, err)
	check("received", c)
	require.NoError(t, c.Free())
	_, err = c.Locator()
	require.ErrorIs(t, err, distbuf.ErrFreed)
}
