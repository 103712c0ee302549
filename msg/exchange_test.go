package msg

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// These tests run on any number of ranks (one without the mpi tag): each
// rank exchanges with itself only, which every rank does at once.

func selfTraffic(seed uint64) traffic {
	return traffic{seed: seed, density: 1, maxBlocks: 300, selfOnly: true, dims: []int{1, 2, 3, 5, 8},
		dtypes: []packing.DType{packing.Float32, packing.Float64, packing.Complex64, packing.Complex128}}
}

// TestSelfExchange: the message to self, by copy and through MPI, from a
// send buffer of its own (AllocSend) and from a part of a joined one
// (JoinSend).
func TestSelfExchange(t *testing.T) {
	for _, v := range variants(t) {
		for _, viaMPI := range []bool{false, true} {
			for _, joined := range []bool{false, true} {
				name := v.name + "/copy"
				if viaMPI {
					name = v.name + "/mpi"
				}
				if joined {
					name += "/joined"
				}
				t.Run(name, func(t *testing.T) {
					a, x, rank, size := v.exchanger(t, Options{PayloadChecksum: true, SelfViaMPI: viaMPI})
					s := a.DefaultStream()
					tr := selfTraffic(7)
					bufs, free := selfSend(t, a, tr.plan(t, rank, size), joined)
					tr.fill(t, s, rank, bufs)
					r, err := x.Exchange(bufs)
					require.NoError(t, err)
					require.Equal(t, []int{rank}, r.Sources())
					require.EqualValues(t, 1, r.Epoch())
					tr.verify(t, s, rank, size, r)
					require.NoError(t, r.Free())
					free()
					st := x.Stats()
					if v.kind == devalloc.BackendCUDA && !v.aware && viaMPI {
						require.Positive(t, st.BytesStaged, "device memory goes through pinned staging")
					}
					if viaMPI {
						require.EqualValues(t, 1, st.Messages, "one MPI message to self")
						require.EqualValues(t, 1, st.MPISends)
						require.Zero(t, st.Routes[RouteSelf].Messages)
					} else {
						require.EqualValues(t, 1, st.Routes[RouteSelf].Messages)
						require.Positive(t, st.Routes[RouteSelf].Bytes)
						require.Zero(t, st.Messages, "the totals count what went to peers")
						require.Zero(t, st.MPISends, "no MPI for a message to self")
					}
				})
			}
		}
	}
}

// selfSend allocates the send buffers of p, its own buffer each
// (AllocSend) or the parts of one joined buffer (JoinSend), and returns
// them with what frees them.
func selfSend(t *testing.T, a *devalloc.Allocator, p *packing.Plan, joined bool) ([]*packing.Coalesced, func()) {
	t.Helper()
	s := a.DefaultStream()
	if !joined {
		bufs, err := AllocSend(a, p, s)
		require.NoError(t, err)
		return bufs, func() {
			freeAll(t, bufs)
		}
	}
	j, err := JoinSend(p)
	require.NoError(t, err)
	c, err := packing.Alloc(a, j, s)
	require.NoError(t, err)
	parts, err := c.Parts()
	require.NoError(t, err)
	return parts, func() { require.NoError(t, c.Free()) }
}

func TestSelfPattern(t *testing.T) {
	for _, v := range variants(t) {
		for _, viaMPI := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/self-mpi=%v", v.name, viaMPI), func(t *testing.T) {
				a, x, rank, size := v.exchanger(t, Options{PayloadChecksum: true, SelfViaMPI: viaMPI})
				s := a.DefaultStream()
				tr := selfTraffic(11)
				bufs, free := selfSend(t, a, tr.plan(t, rank, size), false)
				defer free()
				pat := x.NewPattern()
				for it := range 3 {
					tr.iter = uint64(it)
					r := exchangeVerified(t, pat.Exchange, s, tr, rank, size, bufs)
					if it > 0 {
						require.Same(t, pat.recv[rank].plan, r.From(rank).Plan(), "a learned pattern reuses the receive layout")
					}
					require.NoError(t, r.Free())
				}
				require.EqualValues(t, 1, x.Stats().CountExchanges)
				// Two patterns taking turns, as the bonds of a sweep do: each
				// describes its layout once.
				other := selfTraffic(12)
				obufs, ofree := selfSend(t, a, other.plan(t, rank, size), false)
				opat := x.NewPattern()
				built := x.Stats().ManifestsBuilt
				for it := range 4 {
					p, b, trf := pat, bufs, tr
					if it%2 == 1 {
						p, b, trf = opat, obufs, other
					}
					trf.iter = uint64(10 + it)
					trf.fill(t, s, rank, b)
					r, err := p.Exchange(b)
					require.NoError(t, err)
					trf.verify(t, s, rank, size, r)
					require.NoError(t, r.Free())
				}
				require.EqualValues(t, built+1, x.Stats().ManifestsBuilt, "only the second pattern's first exchange describes its layout")
				ofree()
				// A different layout to self: an error, not a hang.
				other = selfTraffic(12)
				obufs, ofree = selfSend(t, a, other.plan(t, rank, size), false)
				_, err := pat.Exchange(obufs)
				require.ErrorIs(t, err, ErrPatternMismatch)
				require.Equal(t, rank, wireErrorOf(t, err).Peer)
				ofree()
				// Nothing at all for self: also a mismatch.
				_, err = pat.Exchange(nil)
				require.ErrorIs(t, err, ErrPatternMismatch)
				// And the pattern still works.
				r, err := pat.Exchange(bufs)
				require.NoError(t, err)
				require.NoError(t, r.Free())
			})
		}
	}
}

func TestExchangeBadInput(t *testing.T) {
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	_, err := New(Options{Alloc: a})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	_, err = New(Options{Comm: comm, Alloc: a, ChunkBytes: 1000})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	_, err = New(Options{Comm: comm, Alloc: a, Tag: -2})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	_, err = New(Options{Comm: comm, Alloc: a, Window: -1})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	// Every setting read from the environment that is refused names its
	// variable and value.
	for _, env := range []struct{ name, value string }{
		{EnvChunk, "lots"}, {EnvChunk, "1KiB"}, {EnvChunk, "-5"},
		{EnvWindow, "0"}, {EnvWindow, "many"},
		{EnvTransport, "pigeon"},
		{EnvTimeout, "soon"},
	} {
		t.Setenv(env.name, env.value)
		_, err = New(Options{Comm: comm, Alloc: a})
		require.ErrorIs(t, err, distbuf.ErrBadConfig, "%s=%s", env.name, env.value)
		require.ErrorContains(t, err, fmt.Sprintf("%s=%q", env.name, env.value))
		os.Unsetenv(env.name)
	}
	t.Setenv(EnvChunk, "off")
	x := newExchanger(t, Options{Comm: comm, Alloc: a, SelfViaMPI: true})
	require.Zero(t, x.ChunkBytes())

	s := a.DefaultStream()
	tr := selfTraffic(3)
	p := tr.plan(t, rank, size)
	// A buffer without room for the manifest cannot be sent in place
	// (a copy to self needs no room).
	flat := allocBare(t, a, p, s)
	_, err = x.Exchange(flat)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "AllocSend")
	r, err := newExchanger(t, Options{Comm: comm, Alloc: a, Tag: 11}).Exchange(flat)
	require.NoError(t, err)
	require.NoError(t, r.Free())
	// A freed buffer, a nil one.
	bufs, err := AllocSend(a, p, s)
	require.NoError(t, err)
	require.NoError(t, bufs[0].Free())
	_, err = x.Exchange(bufs)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = x.Exchange([]*packing.Coalesced{nil})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	for _, c := range flat {
		require.NoError(t, c.Free())
	}
	// A pattern of another exchanger; a closed exchanger.
	y := newExchanger(t, Options{Comm: comm, Alloc: a, Tag: 9})
	_, err = y.NewPattern().x.exchange(nil, x.NewPattern())
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	z, err := New(Options{Comm: comm, Alloc: a, Tag: 10})
	require.NoError(t, err)
	require.NoError(t, z.Close())
	_, err = z.Exchange(nil)
	require.ErrorIs(t, err, distbuf.ErrClosed)
	require.ErrorIs(t, z.Close(), distbuf.ErrClosed)
}

// TestLayoutReuse checks that a message whose entries equal the last ones
// from its source reuses their plan, and that any other is decoded afresh.
func TestLayoutReuse(t *testing.T) {
	for _, viaMPI := range []bool{false, true} {
		t.Run(fmt.Sprintf("self-mpi=%v", viaMPI), func(t *testing.T) {
			a, x, rank, size := onHost(t, Options{SelfViaMPI: viaMPI})
			s := a.DefaultStream()
			exchange := func(tr traffic) *packing.Plan {
				bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
				require.NoError(t, err)
				r := exchangeVerified(t, x.Exchange, s, tr, rank, size, bufs)
				p := r.From(rank).Plan()
				freeBoth(t, r, bufs)
				return p
			}
			a1 := exchange(selfTraffic(21))
			again := selfTraffic(21)
			again.iter = 1 // same layout, other contents, other buffers
			require.Same(t, a1, exchange(again), "byte-equal entries reuse the plan")
			b := exchange(selfTraffic(22))
			require.NotSame(t, a1, b, "another layout is decoded")
			require.NotSame(t, a1, exchange(selfTraffic(21)), "only the last layout of a source is kept")
		})
	}
}

// TestForwardReceivedRefused checks that a received buffer passed back to
// Exchange is refused by name, instead of going to rank 0, and that the
// exchanger and the buffers stay usable.
func TestForwardReceivedRefused(t *testing.T) {
	a, x, rank, size := onHost(t, Options{})
	s := a.DefaultStream()
	tr := selfTraffic(41)
	bufs := sendAll(t, a, tr, rank, size)
	tr.fill(t, s, rank, bufs)
	r, err := x.Exchange(bufs)
	require.NoError(t, err)
	got := r.From(rank)
	require.NotNil(t, got)
	require.Equal(t, packing.NoDest, got.Dest())
	_, err = x.Exchange([]*packing.Coalesced{got})
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "send buffer 0 has no destination rank")
	tr.verify(t, s, rank, size, r)
	require.NoError(t, r.Free())
	tr.iter = 1
	tr.fill(t, s, rank, bufs)
	r, err = x.Exchange(bufs)
	require.NoError(t, err, "the exchanger works after the refusal")
	tr.verify(t, s, rank, size, r)
	require.NoError(t, r.Free())
}

// TestSelfLayout checks that the message to self, copied without a
// manifest, is viewed as a peer's would be: the sender's blocks in offset
// order, at the sender's offsets, with no destination; and that its layout
// is made once per layout (ManifestsBuilt), not once per exchange.
func TestSelfLayout(t *testing.T) {
	a, x, rank, size := onHost(t, Options{})
	s := a.DefaultStream()
	tr := selfTraffic(31)
	bufs := sendAll(t, a, tr, rank, size)
	var self *packing.Coalesced
	for _, c := range bufs {
		if c.Dest() == rank {
			self = c
		}
	}
	require.NotNil(t, self)
	want, wantBytes, err := self.Plan().Manifest(self.Group())
	require.NoError(t, err)
	slices.SortFunc(want, func(a, b packing.Entry) int { return cmp.Compare(a.Offset, b.Offset) })
	require.False(t, slices.IsSortedFunc(want, func(a, b packing.Entry) int { return cmp.Compare(a.ID, b.ID) }),
		"the test needs a layout whose offset order is not its id order")
	before := x.Stats().ManifestsBuilt
	for it := range 3 {
		tr.iter = uint64(it)
		r := exchangeVerified(t, x.Exchange, s, tr, rank, size, bufs)
		got := r.From(rank)
		entries, gotBytes, err := got.Plan().Manifest(got.Group())
		require.NoError(t, err)
		require.Equal(t, want, entries, "the sender's blocks, in offset order, at its offsets")
		require.Equal(t, wantBytes, gotBytes)
		for _, v := range got.All() {
			require.Equal(t, packing.NoDest, v.Desc().Dest, "a received layout has no destination")
		}
		require.NoError(t, r.Free())
	}
	require.EqualValues(t, before+1, x.Stats().ManifestsBuilt, "one layout made for three exchanges of the same buffers")
}

// TestSelfPatternLayout: a learned pattern's message to self, copied
// without a manifest, is checked against the pattern where it is copied.
// The same blocks from another plan reuse the learned layout; other blocks
// of the same size are a mismatch naming this rank; the pattern then still
// works.
func TestSelfPatternLayout(t *testing.T) {
	a, x, rank, size := onHost(t, Options{})
	tr := selfTraffic(35)
	bufs := sendAll(t, a, tr, rank, size)
	pat := x.NewPattern()
	r, err := pat.Exchange(bufs)
	require.NoError(t, err)
	require.NoError(t, r.Free())
	learned := pat.recv[rank].plan

	descs := tr.blocks(rank, rank)
	exchangeWith := func(descs []packing.Desc) (*Received, error) {
		p, err := packing.NewPlan(descs, packing.Options{})
		require.NoError(t, err)
		other, err := AllocSend(a, p, a.DefaultStream())
		require.NoError(t, err)
		require.Equal(t, bufs[0].Size(), other[0].Size(), "the same payload size: only the layout check can tell")
		defer func() { require.NoError(t, other[0].Free()) }()
		return pat.Exchange(other)
	}
	built := x.Stats().ManifestsBuilt
	r, err = exchangeWith(descs)
	require.NoError(t, err, "the same blocks from another plan")
	require.Same(t, learned, r.From(rank).Plan(), "the learned layout serves")
	require.NoError(t, r.Free())
	require.EqualValues(t, built+1, x.Stats().ManifestsBuilt, "the other plan's layout was made once, to compare")

	// Another order of classes: the same blocks at other offsets.
	moved := slices.Clone(descs)
	k := slices.IndexFunc(moved, func(d packing.Desc) bool {
		return d.Rows != moved[0].Rows || d.Cols != moved[0].Cols || d.DType != moved[0].DType
	})
	require.Positive(t, k, "the test needs two shapes")
	moved[0], moved[k] = moved[k], moved[0]
	_, err = exchangeWith(moved)
	require.ErrorIs(t, err, ErrPatternMismatch)
	w := wireErrorOf(t, err)
	require.Equal(t, rank, w.Peer)
	require.Equal(t, "manifest", w.Field)

	r, err = pat.Exchange(bufs)
	require.NoError(t, err, "the pattern still works")
	require.Same(t, learned, r.From(rank).Plan())
	require.NoError(t, r.Free())
}

// TestSelfCopyStream: the message to self, its send buffers filled on the
// allocator's default stream, is copied on that stream behind the fill:
// no event is recorded and no stream waits for another one to copy it.
// (Staged: the node-local windows' own events would be counted too.)
func TestSelfCopyStream(t *testing.T) {
	for _, v := range variants(t) {
		if v.kind != devalloc.BackendCUDA || v.transport != "staged" {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			a, x, rank, size := v.exchanger(t, Options{})
			s := a.DefaultStream()
			tr := selfTraffic(33)
			bufs := sendAll(t, a, tr, rank, size)
			before := cudart.Calls()
			r, err := x.Exchange(bufs)
			require.NoError(t, err)
			calls := cudart.Calls().Sub(before)
			require.Zero(t, calls["cudaStreamWaitEvent"], "calls: %v", calls)
			require.Zero(t, calls["cudaEventRecord"], "calls: %v", calls)
			require.EqualValues(t, 1, calls["cudaMemcpyAsync"], "one copy of the blocks: %v", calls)
			tr.verify(t, s, rank, size, r)
			require.NoError(t, r.Free())
		})
	}
}

// TestHeaderOnlyRewrite: a buffer sent again with the same layout gets only
// a new header; its entries are vouched for by their known CRC, so bytes
// changed in the prefix meanwhile make the message fail its checksum
// instead of passing for a valid manifest.
func TestHeaderOnlyRewrite(t *testing.T) {
	a, x, rank, size := onHost(t, Options{SelfViaMPI: true, PayloadChecksum: true})
	s := a.DefaultStream()
	tr := selfTraffic(41)
	tr.maxBlocks = 1 // one block: 96 bytes of manifest, 160 of padding, on every rank alike
	bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
	require.NoError(t, err)
	defer func() {
		freeAll(t, bufs)
	}()
	prefix := func() []byte {
		require.NoError(t, a.Sync())
		c := bufs[0]
		mem, err := c.Buffer().Bytes()
		require.NoError(t, err)
		return mem[c.Start()-int64(wire.PayloadOffset(c.Len())) : c.Start()]
	}
	for it := range 3 {
		tr.iter = uint64(it)
		tr.fill(t, s, rank, bufs)
		r, err := x.Exchange(bufs)
		require.NoError(t, err, "exchange %d", it)
		tr.verify(t, s, rank, size, r)
		require.NoError(t, r.Free())
		m, err := wire.DecodeManifest(append(prefix(), make([]byte, bufs[0].Size())...), rank, x.Tag())
		require.NoError(t, err, "the prefix holds a valid manifest")
		require.EqualValues(t, it+1, m.Epoch)
	}
	for _, tc := range []struct {
		field string
		at    func(p []byte) int
	}{
		{"manifest_checksum", func([]byte) int { return wire.HeaderSize + 3 }}, // inside entry 0
		{"padding", func(p []byte) int { return len(p) - 1 }},
	} {
		p := prefix()
		require.Greater(t, len(p), wire.HeaderSize+bufs[0].Len()*wire.EntrySize, "the layout has padding")
		r, err := x.Exchange(bufs) // records what the prefix holds
		require.NoError(t, err)
		require.NoError(t, r.Free())
		p[tc.at(p)] ^= 0x40
		_, err = x.Exchange(bufs)
		require.ErrorIs(t, err, ErrMalformed)
		require.Equal(t, tc.field, wireErrorOf(t, err).Field)
		// After a failure the next exchange writes the whole manifest again.
		r, err = x.Exchange(bufs)
		require.NoError(t, err)
		require.NoError(t, r.Free())
	}
}

// TestSendBuffersOfAnotherAllocator sends, to this rank itself, buffers of
// another allocator than the exchanger's, of every kind: the copy to self
// and the staging of device memory go through that allocator's own stream
// and pinned memory.
func TestSendBuffersOfAnotherAllocator(t *testing.T) {
	vs := variants(t)
	for _, xv := range vs {
		for _, sv := range vs {
			for _, viaMPI := range []bool{false, true} {
				t.Run(fmt.Sprintf("exchanger=%s/buffers=%s/self-mpi=%v", xv.name, sv.name, viaMPI), func(t *testing.T) {
					if xv.aware != sv.aware {
						t.Skip("one CUDA-awareness setting per process")
					}
					a := xv.open(t)
					b := sv.open(t)
					comm := world(t)
					rank, size := comm.Rank(), comm.Size()
					x := newExchanger(t, Options{Comm: comm, Alloc: a, PayloadChecksum: true, SelfViaMPI: viaMPI})
					tr := selfTraffic(17)
					bufs, err := AllocSend(b, tr.plan(t, rank, size), b.DefaultStream())
					require.NoError(t, err)
					defer func() {
						for _, c := range bufs {
							require.NoError(t, c.Free())
						}
					}()
					tr.fill(t, b.DefaultStream(), rank, bufs)
					for range 2 {
						r, err := x.Exchange(bufs)
						require.NoError(t, err)
						require.Same(t, a, r.From(rank).Buffer().Allocator(), "received into the exchanger's allocator")
						tr.verify(t, a.DefaultStream(), rank, size, r)
						require.NoError(t, r.Free())
					}
					require.NoError(t, b.Sync())
				})
			}
		}
	}
}

func TestTimeoutSetting(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"90s": 90 * time.Second, "2m30s": 150 * time.Second, "45": 45 * time.Second, "0.5": 500 * time.Millisecond, " off ": -1,
		"1e-9": time.Nanosecond, "6e-10": time.Nanosecond, "1ns": time.Nanosecond, "1e9": 1e9 * time.Second,
	} {
		got, err := ParseTimeout(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	// Nothing that is not a positive, finite duration of at least a
	// nanosecond passes for one, and no refusal is read as "no limit".
	for in, why := range map[string]string{
		"": "not a duration", "soon": "not a duration", "OFF": "not a duration",
		"NaN": "not a number", "nan": "not a number", "-NaN": "not a duration",
		"Inf": "beyond", "+Inf": "beyond", "infinity": "beyond", "1e300": "beyond", "1e400": "beyond", "1.1e9": "beyond",
		"-Inf": "negative", "-3": "negative", "-0": "negative", "-1m": "negative", "-1e-10": "negative",
		"0": "zero", "0s": "zero", "1e-10": "rounds to zero", "4e-10": "rounds to zero", "1e-400": "rounds to zero", "0.1ns": "zero",
	} {
		d, err := ParseTimeout(in)
		require.ErrorIs(t, err, distbuf.ErrBadConfig, in)
		require.ErrorContains(t, err, fmt.Sprintf("%s=%q: %s", EnvTimeout, strings.TrimSpace(in), why), in)
		require.Zero(t, d, in)
	}
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	comm := world(t)
	require.Equal(t, DefaultTimeout, newExchanger(t, Options{Comm: comm, Alloc: a}).lim.timeout)
	require.Equal(t, 3*time.Second, newExchanger(t, Options{Comm: comm, Alloc: a, Timeout: 3 * time.Second}).lim.timeout)
	require.Zero(t, newExchanger(t, Options{Comm: comm, Alloc: a, Timeout: -1}).lim.timeout, "no limit")
	t.Setenv(EnvTimeout, "off")
	require.Zero(t, newExchanger(t, Options{Comm: comm, Alloc: a}).lim.timeout)
	t.Setenv(EnvTimeout, "7s")
	require.Equal(t, 7*time.Second, newExchanger(t, Options{Comm: comm, Alloc: a}).lim.timeout)
	require.Equal(t, time.Second, newExchanger(t, Options{Comm: comm, Alloc: a, Timeout: time.Second}).lim.timeout, "the option wins over the environment")
	t.Setenv(EnvTimeout, "whenever")
	_, err := New(Options{Comm: comm, Alloc: a})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, EnvTimeout)
}

// TestJoinSend: the joined send layout reserves each group's manifest room
// before it (TestSelfExchange sends from it).
func TestJoinSend(t *testing.T) {
	_, err := JoinSend(nil)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	descs := make([]packing.Desc, 60)
	for i := range descs {
		descs[i] = packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: 1 + i%5, Cols: 1 + i%3, Dest: i % 3}
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	j, err := JoinSend(p)
	require.NoError(t, err)
	var end int64
	for g, grp := range p.Groups() {
		pre, err := SendPrefix(p, g)
		require.NoError(t, err)
		ci := grp.Classes[0] // a group's first class begins where the group does
		start := j.Classes()[ci].Offset - p.Classes()[ci].Offset
		require.Equal(t, end+pre, start, "group %d begins after its manifest's room", g)
		end = start + grp.Bytes
	}
}

// TestStagedRing: a device message of many chunks, sent to itself through
// MPI without a CUDA-aware MPI, goes through the staged route's ring:
// every byte arrives, through a few slots of one chunk each reused chunk
// after chunk (each direction's ring holds at most stageDepth slots more
// than one message's chunks need at once), also with one request in flight
// at a time, and the slots are the exchanger's, not the allocator's.
func TestStagedRing(t *testing.T) {
	v := variant{name: "cuda-staged", kind: devalloc.BackendCUDA, transport: "staged"}
	if fakeCUDA.path == "" && fakeCUDA.why != "" {
		t.Skipf("no CUDA variant: %s", fakeCUDA.why)
	}
	for _, window := range []int{1, DefaultWindow} {
		t.Run(fmt.Sprintf("window=%d", window), func(t *testing.T) {
			a := v.open(t)
			comm := world(t)
			rank := comm.Rank()
			x := newExchanger(t, Options{Comm: comm, Alloc: a, SelfViaMPI: true, ChunkBytes: MinChunkBytes, Window: window})
			mpi := x.routes[rank].(*mpiRoute)
			require.NotNil(t, mpi.stage, "staged, with rings for chunks of %d bytes", MinChunkBytes)
			// 24 blocks of 64 KiB: 25 chunks with the manifest.
			tr := traffic{seed: 3, density: 1, maxBlocks: 1, selfOnly: true, dims: []int{64}, dtypes: []packing.DType{packing.Complex128}}
			var descs []packing.Desc
			for k := range 24 {
				descs = append(descs, packing.Desc{ID: uint64(k), DType: packing.Complex128, Rows: 64, Cols: 64, Dest: rank})
			}
			p, err := packing.NewPlan(descs, packing.Options{})
			require.NoError(t, err)
			s := a.DefaultStream()
			bufs, err := AllocSend(a, p, s)
			require.NoError(t, err)
			defer func() { require.NoError(t, bufs[0].Free()) }()
			tr.fill(t, s, rank, bufs)
			live := a.Stats().LiveBuffers
			for round := range 3 {
				r, err := x.Exchange(bufs)
				require.NoError(t, err, "round %d", round)
				got := readBlocks(t, s, r.From(rank))
				for k := range 24 {
					require.Equal(t, string(tr.content(rank, uint64(k), 64*64*16)), string(got[uint64(k)]), "block %d, round %d", k, round)
				}
				require.NoError(t, r.Free())
				require.Equal(t, live, a.Stats().LiveBuffers, "the slots are not the allocator's")
			}
			chunks := chunkCount(int64(wire.PayloadOffset(24))+24*64*64*16, MinChunkBytes)
			require.Greater(t, chunks, stageDepth)
			require.LessOrEqual(t, len(mpi.stage.out.all), stageDepth, "the message's chunks go through at most stageDepth slots")
			require.Less(t, len(mpi.stage.in.all), chunks, "the received chunks reuse their slots")
			require.Positive(t, x.Stats().BytesStaged)
		})
	}
}

// TestAgreeTimeout: the agreement waits the timeout and a grace of a
// second (the timeout itself when shorter), and only the grace once the
// rank's own data phase timed out; no limit without a timeout.
func TestAgreeTimeout(t *testing.T) {
	for _, tc := range []struct{ timeout, normal, stalled time.Duration }{
		{0, 0, 0},
		{500 * time.Millisecond, time.Second, 500 * time.Millisecond},
		{3 * time.Second, 4 * time.Second, time.Second},
		{DefaultTimeout, DefaultTimeout + time.Second, time.Second},
	} {
		x := &Exchanger{lim: limits{timeout: tc.timeout}}
		require.Equal(t, tc.normal, x.agreeTimeout(false), "timeout %v", tc.timeout)
		require.Equal(t, tc.stalled, x.agreeTimeout(true), "timeout %v, after the data phase timed out", tc.timeout)
	}
}
