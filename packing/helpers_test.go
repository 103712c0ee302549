package packing

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/alloctest"
	"github.com/stretchr/testify/require"
)

var (
	backends   = alloctest.Backends()
	openHost   = alloctest.OpenHost
	openCUDA   = alloctest.OpenCUDA
	closeClean = alloctest.CloseClean
	readAll    = alloctest.ReadAll
	writeAll   = alloctest.WriteAll
)

// Words that the text of a bad-argument error contains, naming its problem.
const (
	problemShape     = "shape"
	problemDType     = "dtype"
	problemDuplicate = "duplicate id"
	problemTooLarge  = "too large"
	problemAlign     = "misaligned"
	problemOverlap   = "overlap"
	problemAny       = "" // any bad argument
)

// forBackends runs test as a subtest on an allocator of each backend, with
// its default stream, and closes the allocator after.
func forBackends(t *testing.T, test func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream)) {
	for _, bc := range backends {
		t.Run(bc.Name, func(t *testing.T) {
			a := bc.Open(t)
			defer closeClean(t, a)
			test(t, a, a.DefaultStream())
		})
	}
}

// leaveJunk leaves size bytes of b in freed memory, where the pool puts the
// next allocation, so that a test sees what that allocation clears.
func leaveJunk(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream, size int64, b byte) {
	t.Helper()
	junk, err := a.Alloc(size, s)
	require.NoError(t, err)
	require.NoError(t, s.Memset(junk, 0, size, b))
	require.NoError(t, junk.Free())
}

// unpacked is c's blocks in group-position order, copied out by UnpackHost
// on s once s has run.
func unpacked(t *testing.T, s *devalloc.Stream, c *Coalesced) [][]byte {
	t.Helper()
	views, err := views(c)
	require.NoError(t, err)
	out := make([][]byte, len(views))
	for k, v := range views {
		out[k] = make([]byte, v.bytes())
	}
	require.NoError(t, UnpackHost(s, c, out))
	require.NoError(t, s.Synchronize())
	return out
}

// requireProblem checks that err reports a bad argument
// (distbuf.ErrInvalid) whose text names the problem.
func requireProblem(t *testing.T, err error, problem string, msgAndArgs ...any) {
	t.Helper()
	require.ErrorIs(t, err, distbuf.ErrInvalid, msgAndArgs...)
	require.ErrorContains(t, err, problem, msgAndArgs...)
}

// views returns every view of c in group-position order.
func views(c *Coalesced) ([]View, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	out := make([]View, c.Len())
	for k := range out {
		out[k] = c.viewAt(k)
	}
	return out, nil
}

// viewByID returns the view of the block with the given id.
func viewByID(c *Coalesced, id uint64) (View, error) {
	k, err := c.Position(id)
	if err != nil {
		return View{}, err
	}
	return c.View(k)
}

// viewSlice is the elements of a block of dtype want (0: its bytes) on
// host-accessible memory, for tests that look at a buffer in place.
func viewSlice[T any](v View, want DType) ([]T, error) {
	if err := v.c.check(); err != nil {
		return nil, err
	}
	if want != 0 && v.dtype() != want {
		return nil, fmt.Errorf("block id %d holds %s, not %s: %w", v.id(), v.dtype(), want, distbuf.ErrInvalid)
	}
	if v.c.host == nil {
		return nil, fmt.Errorf("block id %d is in %s memory: %w", v.id(), v.c.buf.Location(), distbuf.ErrNotHostAccessible)
	}
	n := v.length()
	if want == 0 {
		n = int(v.bytes())
	}
	return unsafe.Slice((*T)(unsafe.Add(v.c.host, v.Offset())), n), nil
}

// allocGroups allocates every group of p, in the order of p.Groups, without
// room for a manifest.
func allocGroups(a *devalloc.Allocator, p *Plan, s *devalloc.Stream) ([]*Coalesced, error) {
	var out []*Coalesced
	for g := range p.Groups() {
		c, err := Alloc(a, p, s, AllocOptions{Group: g})
		if err != nil {
			for _, c := range out {
				_ = c.Free()
			}
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// groupMembers lists the plan indices of group g's blocks in list order:
// the block at group position k is groupMembers(g)[k].
func (p *Plan) groupMembers(g int) ([]int32, error) {
	members, first, err := p.groupIndex(g)
	if err != nil || members != nil {
		return members, err
	}
	out := make([]int32, p.groups[g].Blocks)
	for k := range out {
		out[k] = int32(first + k)
	}
	return out, nil
}

// wideDescs is a list with more classes than 32-bit places hold, so that a
// plan of it keeps every block's offset: 70000 blocks leave 32768 classes to
// 32-bit places; 40000 shapes, of which the first 1000 have 31 blocks each
// (their ranks matter), over two destinations.
func wideDescs() []Desc {
	wide := make([]Desc, 70000)
	for i := range wide {
		s := i
		if i >= 40000 {
			s = i % 1000
		}
		wide[i] = Desc{ID: uint64(i), DType: Float32, Rows: 1 + s%256, Cols: 1 + s/256, Dest: s % 2}
	}
	return wide
}

// received is the layout that a rank receiving group g of p makes of its
// manifest, with the manifest's entries and payload size.
func received(t *testing.T, p *Plan, g int) (*Plan, []Entry, int64) {
	t.Helper()
	entries, size, err := p.Manifest(g)
	require.NoError(t, err)
	q, err := FromManifest(entries, size)
	require.NoError(t, err)
	return q, entries, size
}
