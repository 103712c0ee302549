package packing

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/gather"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/stretchr/testify/require"
)

// scattered places every block of the plan at a shuffled, gapped position
// in one of three source buffers and fills it with a per-block pattern.
type scattered struct {
	bufs []*devalloc.Buffer
	refs []Ref
	data [][]byte
}

func scatter(t *testing.T, s *devalloc.Stream, p *Plan, seed uint64) *scattered {
	t.Helper()
	a := s.Allocator()
	rng := rand.New(rand.NewPCG(seed, 1))
	n := p.Len()
	sc := &scattered{refs: make([]Ref, n), data: make([][]byte, n)}
	cursor := make([]int64, 3)
	which := make([]int, n)
	order := rng.Perm(n)
	offs := make([]int64, n)
	for _, i := range order {
		d, _, _ := p.block(i)
		b := rng.IntN(3)
		which[i] = b
		offs[i] = cursor[b] + int64(rng.IntN(4))*8
		cursor[b] = offs[i] + d.Bytes()
		sc.data[i] = make([]byte, d.Bytes())
		for j := range sc.data[i] {
			sc.data[i][j] = byte(i*31 + j)
		}
	}
	contents := make([][]byte, 3)
	for b := range 3 {
		buf, err := a.Alloc(cursor[b]+8, s)
		require.NoError(t, err)
		sc.bufs = append(sc.bufs, buf)
		contents[b] = make([]byte, buf.Size())
	}
	for i := range n {
		sc.refs[i] = Ref{Buf: sc.bufs[which[i]], Off: offs[i]}
		copy(contents[which[i]][offs[i]:], sc.data[i])
	}
	for b, buf := range sc.bufs {
		writeAll(t, s, buf, contents[b])
	}
	return sc
}

func (sc *scattered) read(t *testing.T, s *devalloc.Stream) [][]byte {
	t.Helper()
	contents := make(map[*devalloc.Buffer][]byte)
	for _, b := range sc.bufs {
		contents[b] = readAll(t, s, b)
	}
	out := make([][]byte, len(sc.refs))
	for i, r := range sc.refs {
		out[i] = contents[r.Buf][r.Off : r.Off+int64(len(sc.data[i]))]
	}
	return out
}

func (sc *scattered) free(t *testing.T) {
	for _, b := range sc.bufs {
		require.NoError(t, b.Free())
	}
}

// blocksOf reads every block of c back to the host.
func blocksOf(t *testing.T, s *devalloc.Stream, c *Coalesced) [][]byte {
	t.Helper()
	mem := readAll(t, s, c.Buffer())
	views, err := views(c)
	require.NoError(t, err)
	out := make([][]byte, len(views))
	for k, v := range views {
		out[k] = mem[v.Offset() : v.Offset()+v.bytes()]
	}
	return out
}

func testPackRoundTrip(t *testing.T, a *devalloc.Allocator, method copyMethod, n int) {
	s := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	p, err := NewPlan(mixedDescs(n, 40), Options{})
	require.NoError(t, err)
	sc := scatter(t, s, p, 41)
	defer sc.free(t)
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Free()) }()
	// Pack on another stream: the ledger orders it after the fills on s.
	m, err := newMover(s2, c, sc.refs, method)
	require.NoError(t, err)
	if method != copyAuto {
		require.Equal(t, method.String(), m.Method())
	}
	t.Logf("method %s, %d bytes", m.Method(), m.bytes)
	require.NoError(t, m.Pack(s2))
	require.Equal(t, sc.data, blocksOf(t, s2, c))
	// Scribble over the scattered side, then unpack: the original returns.
	for _, b := range sc.bufs {
		require.NoError(t, s.Memset(b, 0, b.Size(), 0x5A))
	}
	require.NoError(t, m.Unpack(s2))
	require.Equal(t, sc.data, sc.read(t, s2))
	require.NoError(t, m.Close())
	require.ErrorIs(t, m.Pack(s), distbuf.ErrInvalid, "use after Close")
}

func TestPackUnpackHost(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	t.Run("small", func(t *testing.T) { testPackRoundTrip(t, a, copyAuto, 50) })
	// Over 512 KiB, so the copies run on parallel goroutines.
	t.Run("parallel", func(t *testing.T) { testPackRoundTrip(t, a, copyHost, 20000) })
	require.Greater(t, len(splitByBytes([]int64{1 << 20, 1 << 20, 1 << 20}, 3<<20)), 1, "large copies are split among workers")
}

func TestPackUnpackCUDA(t *testing.T) {
	a := openCUDA(t)
	defer closeClean(t, a)
	for _, m := range []copyMethod{copyAuto, copyKernel, copyBatch, copyPerBlock} {
		t.Run(m.String(), func(t *testing.T) {
			if m == copyKernel {
				if err := gather.Status(a.Info().Device); err != nil {
					gputest.Unavailable(t, "the gather kernel", err)
				}
			}
			testPackRoundTrip(t, a, m, 3000)
		})
	}
}

func TestMoverBadInput(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	p, err := NewPlan([]Desc{{ID: 1, DType: Float64, Rows: 2, Cols: 2}, {ID: 2, DType: Float64, Rows: 1, Cols: 2}}, Options{})
	require.NoError(t, err)
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	src, err := a.Alloc(64, s)
	require.NoError(t, err)
	cases := []struct {
		name string
		refs []Ref
		want string // the problem
	}{
		{"too few", []Ref{{src, 0}}, "1 refs for 2 blocks"},
		{"nil buffer", []Ref{{src, 0}, {nil, 0}}, "nil buffer"},
		{"past the end", []Ref{{src, 0}, {src, 56}}, "outside buffer"},
		{"negative", []Ref{{src, -8}, {src, 40}}, "outside buffer"},
		{"overlapping refs", []Ref{{src, 0}, {src, 24}}, problemOverlap},
		{"into itself", []Ref{{src, 0}, {c.Buffer(), 0}}, problemOverlap},
	}
	for _, tc := range cases {
		_, err := NewMover(s, c, tc.refs)
		requireProblem(t, err, tc.want, tc.name)
	}
	_, err = newMover(s, c, []Ref{{src, 0}, {src, 32}}, copyKernel)
	require.ErrorIs(t, err, distbuf.ErrUnavailable, "no kernel on host memory")
	_, err = newMover(s, c, []Ref{{src, 0}, {src, 32}}, copyMethod(42))
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	m, err := newMover(s, c, []Ref{{src, 0}, {src, 32}}, copyAuto)
	require.NoError(t, err)
	require.NoError(t, src.Free())
	require.ErrorIs(t, m.Pack(s), distbuf.ErrFreed, "a freed source is caught")
	require.NoError(t, c.Free())
	require.ErrorIs(t, m.Unpack(s), distbuf.ErrFreed)
	require.NoError(t, m.Close())
	require.ErrorIs(t, m.Close(), distbuf.ErrInvalid)
}

func TestPackHostSlicesAndTransfer(t *testing.T) {
	forBackends(t, func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream) {
		descs := mixedDescs(4000, 50)
		p, err := NewPlan(descs, Options{})
		require.NoError(t, err)
		src := make([][]byte, len(descs))
		for k, d := range descs {
			src[k] = bytes.Repeat([]byte{byte(k % 251), byte(k / 251)}, int(d.Bytes()/2))
		}
		// Pack on the host into pinned memory, one copy to the buffer.
		pin, err := Alloc(a, p, s, AllocOptions{Group: 0, Pinned: true})
		require.NoError(t, err)
		require.Equal(t, devalloc.Pinned, pin.Buffer().Location())
		require.NoError(t, PackHost(s, pin, src))
		dev, err := Alloc(a, p, s)
		require.NoError(t, err)
		require.NoError(t, transfer(s, dev, pin))
		require.Equal(t, src, blocksOf(t, s, dev))
		// CopyOf: the same layout and bytes, padding (zero) included,
		// in memory that held junk before.
		leaveJunk(t, a, s, dev.Buffer().Size(), 0xAB)
		cp, err := Alloc(a, p, s, AllocOptions{CopyOf: pin})
		require.NoError(t, err)
		require.Same(t, p, cp.Plan())
		require.Equal(t, (a.Info().Backend == devalloc.BackendCUDA), cp.Buffer().Location() == devalloc.OnDevice, "the allocator's own memory")
		require.Equal(t, readAll(t, s, pin.Buffer())[:pin.Size()], readAll(t, s, cp.Buffer())[:cp.Size()])
		require.NoError(t, cp.Free())
		_, err = Alloc(a, p, s, AllocOptions{Group: 1, CopyOf: pin})
		require.ErrorIs(t, err, distbuf.ErrInvalid, "no group 1")
		_, err = Alloc(a, p, s, AllocOptions{}, AllocOptions{})
		require.ErrorIs(t, err, distbuf.ErrInvalid, "two options")
		// PackHost straight into the buffer, UnpackHost back.
		for k := range src {
			src[k][0] ^= 0xFF
		}
		require.NoError(t, PackHost(s, dev, src))
		require.Equal(t, src, unpacked(t, s, dev))
		// Bad input.
		require.ErrorIs(t, PackHost(s, dev, src[1:]), distbuf.ErrInvalid)
		short := append([][]byte(nil), src...)
		short[3] = short[3][1:]
		require.ErrorIs(t, UnpackHost(s, dev, short), distbuf.ErrInvalid)
		q, err := NewPlan(descs[:10], Options{})
		require.NoError(t, err)
		other, err := Alloc(a, q, s)
		require.NoError(t, err)
		require.ErrorIs(t, transfer(s, other, pin), distbuf.ErrInvalid)
		_, err = Alloc(a, q, s, AllocOptions{CopyOf: pin})
		require.ErrorIs(t, err, distbuf.ErrInvalid, "CopyOf of another plan")
		requireProblem(t, transfer(s, pin, pin), problemOverlap)
		require.NoError(t, other.Free())
		require.NoError(t, pin.Free())
		require.NoError(t, dev.Free())
		require.ErrorIs(t, transfer(s, dev, pin), distbuf.ErrFreed)
		_, err = Alloc(a, p, s, AllocOptions{CopyOf: pin})
		require.ErrorIs(t, err, distbuf.ErrFreed)
	})
}

// TestMoverRefsByGroupPosition: a program that keeps each block's storage
// in list order packs the groups of a plan whose destinations interleave by
// building each group's Refs with Plan.GroupPosition, and unpacks them back.
func TestMoverRefsByGroupPosition(t *testing.T) {
	forBackends(t, func(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream) {
		descs := mixedDescs(500, 43)
		for i := range descs {
			descs[i].Dest = (i * 5) % 3
		}
		p, err := NewPlan(descs, Options{})
		require.NoError(t, err)
		sc := scatter(t, s, p, 44) // sc.refs[i] and sc.data[i]: block i's storage
		defer sc.free(t)
		cs, err := allocGroups(a, p, s)
		require.NoError(t, err)
		refs := make([][]Ref, len(cs))
		want := make([][][]byte, len(cs))
		for g, c := range cs {
			refs[g], want[g] = make([]Ref, c.Len()), make([][]byte, c.Len())
		}
		for i := range descs {
			g, k, err := p.GroupPosition(i)
			require.NoError(t, err)
			refs[g][k], want[g][k] = sc.refs[i], sc.data[i]
		}
		movers := make([]*Mover, len(cs))
		for g, c := range cs {
			movers[g], err = NewMover(s, c, refs[g])
			require.NoError(t, err)
			require.NoError(t, movers[g].Pack(s))
			require.Equal(t, want[g], blocksOf(t, s, c), "group %d packed", g)
		}
		for _, b := range sc.bufs {
			require.NoError(t, s.Memset(b, 0, b.Size(), 0x5A))
		}
		for _, m := range movers {
			require.NoError(t, m.Unpack(s))
		}
		require.Equal(t, sc.data, sc.read(t, s), "every block back in its storage")
		for g, c := range cs {
			require.NoError(t, errors.Join(movers[g].Close(), c.Free()))
		}
	})
}
