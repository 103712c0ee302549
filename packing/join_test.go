package packing

import (
	"bytes"
	"errors"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

// TestJoined: a joined plan places every block of every group at its
// group's start plus its place in the group's own layout, one allocation
// holds them all with zero padding and prefixes, and the parts are the
// groups over that allocation, sharing its memory and its lifetime.
func TestJoined(t *testing.T) {
	forBackends(t, func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream) {
		descs := mixedDescs(400, 7)
		for i := range descs {
			descs[i].Dest = []int{0, 2, 3}[i%3]
		}
		p, err := NewPlan(descs, Options{})
		require.NoError(t, err)
		align := p.Options().Align
		prefix := func(g int) int64 { return align * int64(g+1) }
		j, err := p.Joined(prefix)
		require.NoError(t, err)
		from, starts, ok := j.joinedFrom()
		require.True(t, ok)
		require.Same(t, p, from)
		require.Len(t, j.Groups(), 1)
		require.Equal(t, -1, j.Groups()[0].Dest)
		require.Equal(t, p.Len(), j.Len())
		var end int64
		for g, grp := range p.Groups() {
			require.Equal(t, end+prefix(g), starts[g], "group %d begins after its prefix", g)
			end = starts[g] + grp.Bytes
		}
		require.Equal(t, end, j.Groups()[0].Bytes)
		for i := range descs {
			d, off, err := p.block(i)
			require.NoError(t, err)
			jd, joff, err := j.block(i)
			require.NoError(t, err)
			g := p.Classes()[p.classIndex(i)].Group
			require.Equal(t, starts[g]+off, joff, "block %d", i)
			require.Equal(t, d.ID, jd.ID)
			require.Equal(t, [2]int{d.Rows, d.Cols}, [2]int{jd.Rows, jd.Cols})
		}

		// Garbage first, so that the padding clear shows.
		junk, err := a.Alloc(end, s)
		require.NoError(t, err)
		writeAll(t, s, junk, bytes.Repeat([]byte{0xEE}, int(end)))
		require.NoError(t, junk.Free())
		before := a.Stats()
		c, err := Alloc(a, j, s)
		require.NoError(t, err)
		require.EqualValues(t, 1, a.Stats().AllocCalls-before.AllocCalls, "one allocation for every group")
		parts, err := c.Parts()
		require.NoError(t, err)
		require.Len(t, parts, len(p.Groups()))
		base, _, _, err := c.Buffer().Region()
		require.NoError(t, err)
		want := make([]byte, end)
		for g, part := range parts {
			require.Same(t, p, part.Plan())
			require.Equal(t, g, part.Group())
			require.Equal(t, p.Groups()[g].Dest, part.Dest())
			require.Equal(t, starts[g], part.Start())
			require.Same(t, c.Buffer(), part.Buffer())
			members, err := p.groupMembers(g)
			require.NoError(t, err)
			for k, i := range members {
				v, err := part.View(k)
				require.NoError(t, err)
				jv, err := c.View(int(i))
				require.NoError(t, err)
				require.Equal(t, jv.addr(), v.addr(), "group %d position %d", g, k)
				require.Equal(t, base+uintptr(starts[g]+v.Offset()), v.addr())
				at := starts[g] + v.Offset()
				copy(want[at:at+v.bytes()], bytes.Repeat([]byte{byte(1 + k%200)}, int(v.bytes())))
			}
		}
		got := readAll(t, s, c.Buffer())[:end]
		for i := range got {
			if want[i] == 0 {
				require.Zero(t, got[i], "byte %d is padding or a prefix: cleared at allocation", i)
			}
		}
		// Blocks written through the parts are the joined buffer's.
		writeAll(t, s, c.Buffer(), want)
		for g, part := range parts {
			for k, v := range part.All() {
				jv, err := c.View(int(must(p.groupMembers(g))[k]))
				require.NoError(t, err)
				require.Equal(t, jv.Offset(), starts[g]+v.Offset())
			}
		}

		require.ErrorIs(t, parts[0].Free(), distbuf.ErrInvalid, "a part owns nothing")
		_, err = parts[0].View(0)
		require.NoError(t, err, "a refused Free leaves the part usable")
		require.NoError(t, c.Free())
		for _, part := range parts {
			_, err := part.View(0)
			require.ErrorIs(t, err, distbuf.ErrFreed, "the joined buffer's Free ends its parts")
			_, err = part.Buffer().Read(s)
			require.ErrorIs(t, err, distbuf.ErrFreed, "a part's buffer is the joined buffer")
			_, _, ok := part.Locate(0)
			require.False(t, ok)
		}
		_, err = c.Parts()
		require.ErrorIs(t, err, distbuf.ErrFreed)
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestJoinedRefused: what cannot be joined, and parts of a buffer whose
// plan is not joined.
func TestJoinedRefused(t *testing.T) {
	p, err := NewPlan(mixedDescs(20, 3), Options{})
	require.NoError(t, err)
	_, err = p.Joined(func(int) int64 { return 8 })
	requireProblem(t, err, problemAlign, "a prefix that breaks the alignment")
	_, err = p.Joined(func(int) int64 { return -p.Options().Align })
	requireProblem(t, err, problemAlign)
	_, err = p.Joined(func(int) int64 { return MaxBytes })
	requireProblem(t, err, problemTooLarge)
	var nilPlan *Plan
	_, err = nilPlan.Joined(nil)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	m, err := FromManifest([]Entry{{ID: 1, DType: Float64, Rows: 2, Cols: 2, Offset: 0}}, 32)
	require.NoError(t, err)
	_, err = m.Joined(nil)
	require.ErrorIs(t, err, distbuf.ErrInvalid, "a manifest plan")
	_, _, ok := p.joinedFrom()
	require.False(t, ok)

	a := openHost(t)
	defer closeClean(t, a)
	c, err := Alloc(a, p, a.DefaultStream())
	require.NoError(t, err)
	_, err = c.Parts()
	require.True(t, errors.Is(err, distbuf.ErrInvalid), "parts of a plan not joined: %v", err)
	require.NoError(t, c.Free())
}

// TestWrapRelease: Coalesced made by Wrap with a release over one buffer
// (the receive buffer of several messages) give the buffer back through
// their release, once each, and never free it themselves; their views
// start at their offsets.
func TestWrapRelease(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	p, err := NewPlan(mixedDescs(30, 9), Options{})
	require.NoError(t, err)
	size := p.Groups()[0].Bytes
	buf, err := a.Alloc(2*size, s)
	require.NoError(t, err)
	released := 0
	release := func() error { released++; return nil }
	c0, err := Wrap(buf, 0, p, 0, release)
	require.NoError(t, err)
	c1, err := Wrap(buf, size, p, 0, release)
	require.NoError(t, err)
	_, err = Wrap(buf, 8, p, 0, release)
	requireProblem(t, err, problemAlign)
	_, err = Wrap(buf, size+8*p.Options().Align, p, 0, release)
	require.ErrorIs(t, err, distbuf.ErrInvalid, "past the buffer")
	_, err = Wrap(buf, 0, p, 1, release)
	require.ErrorIs(t, err, distbuf.ErrInvalid, "no group 1")
	live := func() int64 { return a.Stats().LiveBuffers }
	require.NoError(t, c0.Free())
	require.Equal(t, 1, released)
	require.ErrorIs(t, c0.Free(), distbuf.ErrFreed)
	require.Equal(t, 1, released, "a second Free releases nothing")
	require.EqualValues(t, 1, live(), "the buffer is the caller's")
	v, err := c1.View(0)
	require.NoError(t, err)
	base, _, _, err := buf.Region()
	require.NoError(t, err)
	require.Equal(t, base+uintptr(size+v.Offset()), v.addr())
	require.NoError(t, c1.Free())
	require.Equal(t, 2, released)
	require.EqualValues(t, 1, live())
	_, err = c1.View(0)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	require.NoError(t, buf.Free())
	_, err = Wrap(nil, 0, p, 0, nil)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
}

// TestPartsOfConsecutiveGroups: the parts of a joined plan, whether each
// group's blocks are consecutive in the plan (one operand's blocks after
// another's, as the solve's A and B: no member list) or interleave with
// other groups', give the views, lookups, locations, manifests and
// detached layouts that the descriptor list says, block for block: group
// position k of group g is the k-th block bound for g in list order.
func TestPartsOfConsecutiveGroups(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	for _, interleaved := range []bool{false, true} {
		descs := mixedDescs(300, 5)
		var want [2][]int // by group: plan indices in list order
		for i := range descs {
			if interleaved {
				descs[i].Dest = i % 2
			} else {
				descs[i].Dest = i * 2 / len(descs)
			}
			want[descs[i].Dest] = append(want[descs[i].Dest], i)
		}
		p, err := NewPlan(descs, Options{})
		require.NoError(t, err)
		require.Equal(t, interleaved, p.groupStart == nil, "consecutive groups need no member list")
		j, err := p.Joined(nil)
		require.NoError(t, err)
		c, err := Alloc(a, j, s)
		require.NoError(t, err)
		parts, err := c.Parts()
		require.NoError(t, err)
		for g, part := range parts {
			members := want[g]
			require.Equal(t, len(members), part.Len())
			views, err := views(part)
			require.NoError(t, err)
			loc, err := part.Locator()
			require.NoError(t, err)
			entries, _, err := p.Manifest(g)
			require.NoError(t, err)
			det, err := p.Detached(g)
			require.NoError(t, err)
			k := 0
			for pos, v := range part.All() {
				i := members[pos]
				require.Equal(t, i, v.i)
				require.Equal(t, descs[i].ID, v.id())
				require.Equal(t, v, views[pos])
				w, err := part.View(pos)
				require.NoError(t, err)
				require.Equal(t, v, w)
				cls, off, ok := part.Locate(pos)
				require.True(t, ok)
				require.Equal(t, p.classIndex(i), cls)
				require.Equal(t, v.Offset(), off)
				cls, off, ok = loc.Locate(pos)
				require.True(t, ok)
				require.Equal(t, p.classIndex(i), cls)
				require.Equal(t, v.Offset(), off)
				at, err := part.Position(descs[i].ID)
				require.NoError(t, err)
				require.Equal(t, pos, at)
				require.Equal(t, descs[i].ID, entries[pos].ID)
				require.Equal(t, v.Offset(), entries[pos].Offset, "a part's offsets are its group's")
				k++
			}
			require.Equal(t, len(members), k)
			_, _, ok := loc.Locate(len(members))
			require.False(t, ok, "a position past the group")
			_, err = part.Position(descs[want[1-g][0]].ID)
			require.ErrorIs(t, err, distbuf.ErrInvalid, "a block of the other group")
			// The detached layout lists the group's blocks in offset order.
			got := map[uint64]int64{}
			for i := range det.Len() {
				d, off, err := det.block(i)
				require.NoError(t, err)
				got[d.ID] = off
			}
			require.Len(t, got, len(members))
			for _, e := range entries {
				require.Equal(t, e.Offset, got[e.ID], "block %d", e.ID)
			}
		}
		require.NoError(t, c.Free())
	}
}
