//go:build mpi

package msg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// These tests run under mpirun -n 2, 3 and 4 (testdata/mpi-ranks). Every
// rank runs every test in the same order; exchanges are collective.

var mixedTypes = []packing.DType{packing.Float32, packing.Float64, packing.Complex64, packing.Complex128}

// expectedMessages counts the messages rank delivers on its routes: one
// per peer it sends to, itself included when not by a copy.
func expectedMessages(tr traffic, rank, size int, selfViaMPI bool) int64 {
	var n int64
	for d := range size {
		if len(tr.blocks(rank, d)) > 0 && (d != rank || selfViaMPI) {
			n++
		}
	}
	return n
}

// allToAllOptions are the exchanger settings the all-to-all tests run
// under: the defaults, and one request at a time in 64 KiB pieces with the
// message to self through MPI.
var allToAllOptions = []struct {
	name string
	opts Options
}{
	{"defaults", Options{}},
	{"window=1,chunk=64KiB,self=mpi", Options{Window: 1, ChunkBytes: MinChunkBytes, SelfViaMPI: true}},
}

func TestAllToAllRandomSparsity(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	for _, v := range variants(t) {
		for _, o := range allToAllOptions {
			t.Run(v.name+"/"+o.name, func(t *testing.T) {
				a := v.open(t)
				opts := o.opts
				opts.Comm, opts.Alloc, opts.PayloadChecksum = comm, a, true
				x := newExchanger(t, opts)
				for it := range 3 {
					tr := traffic{seed: 100 + uint64(it), density: 0.6, maxBlocks: 250, dims: []int{1, 2, 3, 4, 7, 8}, dtypes: mixedTypes}
					bufs := sendAll(t, a, tr, rank, size)
					before := x.Stats()
					r, err := x.Exchange(bufs)
					require.NoError(t, err)
					tr.verify(t, a.DefaultStream(), rank, size, r)
					require.NoError(t, r.Free())
					st := x.Stats()
					require.Equal(t, expectedMessages(tr, rank, size, opts.SelfViaMPI), st.Messages-before.Messages, "one message per peer with something to send")
					if opts.Window == 1 {
						require.Equal(t, 1, st.MaxInFlight, "the window bounds the requests in flight")
					}
				}
				require.EqualValues(t, 3, x.Stats().CountExchanges)
			})
		}
	}
}

func TestEmptyPeers(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	eachVariant(t, Options{PayloadChecksum: true}, func(t *testing.T, v variant, a *devalloc.Allocator, x *Exchanger) {
		// Nobody sends anything: no message at all.
		r, err := x.Exchange(nil)
		require.NoError(t, err)
		require.Empty(t, r.Sources())
		// Empty groups send nothing either.
		p, err := packing.NewPlan(nil, packing.Options{})
		require.NoError(t, err)
		empty, err := AllocSend(a, p, a.DefaultStream())
		require.NoError(t, err)
		r, err = x.Exchange(empty)
		require.NoError(t, err)
		require.Empty(t, r.Sources())
		require.NoError(t, empty[0].Free())
		require.Zero(t, x.Stats().Messages)
		// Only the last rank hears from rank 0.
		tr := traffic{seed: 5, density: 1, maxBlocks: 20, dims: []int{2}, dtypes: mixedTypes}
		only := func(src, dest int) bool { return src == 0 && dest == size-1 }
		var descs []packing.Desc
		for d := range size {
			if only(rank, d) {
				descs = append(descs, tr.blocks(rank, d)...)
			}
		}
		p, err = packing.NewPlan(descs, packing.Options{})
		require.NoError(t, err)
		bufs, err := AllocSend(a, p, a.DefaultStream())
		require.NoError(t, err)
		tr.fill(t, a.DefaultStream(), rank, bufs)
		r, err = x.Exchange(bufs)
		require.NoError(t, err)
		if rank == size-1 {
			require.Equal(t, []int{0}, r.Sources())
			c := r.From(0)
			require.Equal(t, len(tr.blocks(0, rank)), c.Len())
		} else {
			require.Empty(t, r.Sources())
		}
		freeBoth(t, r, bufs)
	})
}

func TestManyBlocks(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	eachVariant(t, Options{PayloadChecksum: true}, func(t *testing.T, v variant, a *devalloc.Allocator, x *Exchanger) {
		// 10^5 blocks per rank, spread over every rank.
		tr := traffic{seed: 9, density: 1, maxBlocks: 1, dims: []int{1, 2}, dtypes: mixedTypes}
		per := 100000 / size
		var descs []packing.Desc
		for d := range size {
			for k := range per {
				dt := mixedTypes[k%4]
				descs = append(descs, packing.Desc{ID: uint64(d)<<40 | uint64(k*7919%per), DType: dt, Rows: 1 + k%2, Cols: 1 + k%3, Dest: d})
			}
		}
		p, err := packing.NewPlan(descs, packing.Options{})
		require.NoError(t, err)
		bufs, err := AllocSend(a, p, a.DefaultStream())
		require.NoError(t, err)
		tr.fill(t, a.DefaultStream(), rank, bufs)
		r, err := x.Exchange(bufs)
		require.NoError(t, err)
		s := a.DefaultStream()
		for src, c := range fromEach(t, r, size) {
			require.Equal(t, per, c.Len())
			for _, v := range c.All() {
				require.Equal(t, uint64(rank), v.Desc().ID>>40)
			}
			requireContent(t, s, tr, src, c)
		}
		freeBoth(t, r, bufs)
	})
}

func TestPersistentPattern(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	eachVariant(t, Options{PayloadChecksum: true}, func(t *testing.T, v variant, a *devalloc.Allocator, x *Exchanger) {
		pat := x.NewPattern()
		tr := traffic{seed: 31, density: 0.7, maxBlocks: 100, dims: []int{1, 3, 4}, dtypes: mixedTypes}
		bufs := sendAll(t, a, tr, rank, size)
		s := a.DefaultStream()
		for it := range 5 {
			tr.iter = uint64(it)
			tr.fill(t, s, rank, bufs) // the same buffers, refilled: a sweep
			r, err := pat.Exchange(bufs)
			require.NoError(t, err, "iteration %d", it)
			require.True(t, pat.Learned())
			tr.verify(t, s, rank, size, r)
			require.NoError(t, r.Free())
		}
		require.EqualValues(t, 1, x.Stats().CountExchanges, "a learned pattern skips the count exchange")

		// Rank 0 departs from the pattern: one more block for rank 1.
		grown := tr
		descs := []packing.Desc{}
		for d := range size {
			descs = append(descs, tr.blocks(rank, d)...)
		}
		if rank == 0 {
			descs = append(descs, packing.Desc{ID: 1<<60 | 1, DType: packing.Float64, Rows: 3, Cols: 3, Dest: 1})
		}
		p, err := packing.NewPlan(descs, packing.Options{})
		require.NoError(t, err)
		other, err := AllocSend(a, p, s)
		require.NoError(t, err)
		grown.fill(t, s, rank, other)
		r, err := pat.Exchange(other)
		sentToOne := len(tr.blocks(0, 1)) > 0
		switch {
		case rank == 0:
			require.ErrorIs(t, err, ErrPatternMismatch)
			w := wireErrorOf(t, err)
			require.Equal(t, 1, w.Peer)
			require.True(t, w.Outgoing)
			require.Contains(t, []string{"message_size", "dest"}, w.Field)
		case rank == 1 && sentToOne:
			require.ErrorIs(t, err, ErrPeerAborted, "rank 0 sent an abort notice in place of its message")
			require.Equal(t, 0, wireErrorOf(t, err).Peer)
		default:
			// Every rank learns in the agreement that rank 0 failed.
			require.Nil(t, r)
			require.ErrorIs(t, err, ErrPeerAborted)
			w := wireErrorOf(t, err)
			require.Equal(t, 0, w.Peer)
			require.Equal(t, "agreement", w.Field)
		}
		freeAll(t, other)

		// Same sizes, other blocks: two ids of rank 0's message to rank 1
		// swapped. Both sides see the manifest change.
		if n := len(tr.blocks(0, 1)); n >= 2 {
			descs = descs[:0]
			for d := range size {
				descs = append(descs, tr.blocks(rank, d)...)
			}
			if rank == 0 {
				for i := range descs {
					if descs[i].Dest == 1 {
						descs[i].ID ^= 1 << 62
					}
				}
			}
			p, err := packing.NewPlan(descs, packing.Options{})
			require.NoError(t, err)
			other, err := AllocSend(a, p, s)
			require.NoError(t, err)
			r, err := pat.Exchange(other)
			switch rank {
			case 0:
				require.ErrorIs(t, err, ErrPatternMismatch)
				require.Equal(t, "manifest", wireErrorOf(t, err).Field)
			case 1:
				require.ErrorIs(t, err, ErrPatternMismatch)
				w := wireErrorOf(t, err)
				require.Equal(t, 0, w.Peer)
				require.False(t, w.Outgoing)
				require.Equal(t, "manifest", w.Field)
			default:
				require.Nil(t, r)
				require.ErrorIs(t, err, ErrPeerAborted, "ranks 0 and 1 failed their part")
			}
			freeAll(t, other)
		}

		// Back on the pattern: it works again.
		tr.iter = 99
		r = exchangeVerified(t, pat.Exchange, s, tr, rank, size, bufs)
		require.NoError(t, r.Free())
		require.EqualValues(t, 1, x.Stats().CountExchanges)
	})
}

// pairTraffic has rank 0 send to rank 1 only.
// TestSendBufferWithoutRoomRefused checks that host send buffers without
// room for the manifest (packing.Alloc of each group) are refused by name, as
// Exchange's doc says, on every rank, and that AllocSend's buffers of the
// same plan then go through.
func TestSendBufferWithoutRoomRefused(t *testing.T) {
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size < 2 {
		t.Skip("a message to this rank itself is a copy and needs no room")
	}
	x := newExchanger(t, Options{Comm: comm, Alloc: a})
	s := a.DefaultStream()
	tr := traffic{seed: 43, density: 1, maxBlocks: 20, dims: []int{2}, dtypes: mixedTypes}
	plan := tr.plan(t, rank, size)
	bare := allocBare(t, a, plan, s)
	tr.fill(t, s, rank, bare)
	_, err := x.Exchange(bare)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "msg.AllocSend")
	freeAll(t, bare)
	bufs := sendAll(t, a, tr, rank, size)
	r, err := x.Exchange(bufs)
	require.NoError(t, err, "the exchanger works after the refusal")
	tr.verify(t, s, rank, size, r)
	require.NoError(t, r.Free())
}

func pairTraffic(seed uint64) traffic {
	return traffic{seed: seed, density: 1, maxBlocks: 40, dims: []int{2, 3}, dtypes: mixedTypes}
}

func pairSend(t *testing.T, a *devalloc.Allocator, tr traffic, rank int) []*packing.Coalesced {
	var descs []packing.Desc
	if rank == 0 {
		descs = tr.blocks(0, 1)
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	bufs, err := AllocSend(a, p, a.DefaultStream())
	require.NoError(t, err)
	tr.fill(t, a.DefaultStream(), rank, bufs)
	t.Cleanup(func() {
		freeAll(t, bufs)
	})
	return bufs
}

// reseal recomputes the manifest checksum after an edit of the header.
func reseal(b []byte) {
	binary.LittleEndian.PutUint32(b[60:], 0)
	end := wire.HeaderSize + int(binary.LittleEndian.Uint32(b[24:]))*wire.EntrySize
	binary.LittleEndian.PutUint32(b[60:], wire.Checksum(b[:end]))
}

func TestCorruptedMessages(t *testing.T) {
	comm := world(t)
	rank := comm.Rank()
	v := variant{name: "host", kind: devalloc.BackendHost}
	for _, tc := range []struct {
		name, field string
		sentinel    error
		mangle      func(b []byte)
	}{
		{"payload bit", "payload_checksum", ErrChecksum, func(b []byte) { b[len(b)-3] ^= 0x10 }},
		{"manifest bit", "manifest_checksum", ErrChecksum, func(b []byte) { b[wire.HeaderSize+9] ^= 1 }},
		{"magic", "magic", ErrMalformed, func(b []byte) { b[0] = 'X' }},
		{"source", "source", ErrUnexpectedPeer, func(b []byte) { binary.LittleEndian.PutUint32(b[8:], 7); reseal(b) }},
		{"dest", "dest", ErrUnexpectedPeer, func(b []byte) { binary.LittleEndian.PutUint32(b[12:], 5); reseal(b) }},
		{"tag", "tag", ErrUnexpectedPeer, func(b []byte) { binary.LittleEndian.PutUint32(b[16:], 3); reseal(b) }},
		{"epoch", "epoch", ErrUnexpectedPeer, func(b []byte) { binary.LittleEndian.PutUint64(b[32:], 1<<40); reseal(b) }},
		{"block past payload", "entry[0].offset", ErrMalformed, func(b []byte) {
			binary.LittleEndian.PutUint64(b[wire.HeaderSize+8:], binary.LittleEndian.Uint64(b[48:]))
			reseal(b)
		}},
		{"payload length", "payload_length", ErrMalformed, func(b []byte) { binary.LittleEndian.PutUint64(b[48:], 1); reseal(b) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := v.open(t)
			x := newExchanger(t, Options{Comm: comm, Alloc: a, PayloadChecksum: true})
			if rank == 0 {
				x.fault(func(r *faultyRoute) {
					r.mangle = func(dest int, whole []byte) {
						if dest == 1 {
							tc.mangle(whole)
						}
					}
				})
			}
			bufs := pairSend(t, a, pairTraffic(3), rank)
			before := a.Stats()
			r, err := x.Exchange(bufs)
			if rank != 1 {
				require.Nil(t, r)
				require.ErrorIs(t, err, ErrPeerAborted, "rank 1 rejected the message: every rank's exchange fails")
				require.Equal(t, 1, wireErrorOf(t, err).Peer)
				return
			}
			require.ErrorIs(t, err, tc.sentinel)
			w := wireErrorOf(t, err)
			require.Equal(t, 0, w.Peer)
			require.Equal(t, x.Tag(), w.Tag)
			require.Equal(t, tc.field, w.Field)
			require.Nil(t, r)
			require.NoError(t, a.Sync())
			require.Equal(t, before.LiveBuffers, a.Stats().LiveBuffers, "the rejected receive buffer is freed")
		})
	}
}

// TestHandWrittenPeer has rank 0 follow the protocol by hand, as a peer in
// another language would (docs/WIRE.md): an Alltoall of int64 sizes, then
// one message of that size. Rank 1 receives with Exchange.
func TestHandWrittenPeer(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	o := Options{Comm: comm, Alloc: a}
	if rank == 0 {
		// A peer that does not offer reads of its memory: it sends its
		// messages through MPI, and the others read each other's.
		o.Transport = TransportMPI
	}
	x := newExchanger(t, o)
	good := func(epoch uint64) []byte {
		payload := make([]byte, 48)
		for i := range payload {
			payload[i] = byte(i)
		}
		entries := []packing.Entry{{ID: 5, Offset: 0, Rows: 2, Cols: 2, DType: packing.Float64}, {ID: 6, Offset: 32, Rows: 1, Cols: 4, DType: packing.Float32}}
		m := make([]byte, wire.PayloadOffset(2)+48)
		require.NoError(t, wire.EncodeManifest(m, wire.Header{Source: 0, Dest: 1, Tag: int32(x.Tag()), Epoch: epoch, DType: wire.Mixed, PayloadLen: 48,
			HasPayloadChecksum: true, PayloadChecksum: wire.Checksum(payload)}, entries))
		copy(m[wire.PayloadOffset(2):], payload)
		return m
	}
	// A message of blocks of one type whose header says dtype 0 (mixed),
	// and an empty message (no blocks, no payload): both valid.
	oneType := func(epoch uint64) []byte {
		entries := []packing.Entry{{ID: 5, Offset: 0, Rows: 2, Cols: 2, DType: packing.Float64}, {ID: 6, Offset: 32, Rows: 1, Cols: 2, DType: packing.Float64}}
		m := make([]byte, wire.PayloadOffset(2)+48)
		require.NoError(t, wire.EncodeManifest(m, wire.Header{Source: 0, Dest: 1, Tag: int32(x.Tag()), Epoch: epoch, DType: wire.Mixed, PayloadLen: 48}, entries))
		return m
	}
	empty := func(epoch uint64) []byte {
		m := make([]byte, wire.PayloadOffset(0))
		require.NoError(t, wire.EncodeManifest(m, wire.Header{Source: 0, Dest: 1, Tag: int32(x.Tag()), Epoch: epoch, DType: packing.Float32}, nil))
		return m
	}
	for _, tc := range []struct {
		name     string
		announce func(m []byte) int64
		whole    func(m []byte) []byte
		field    string
		sentinel error
		message  func(epoch uint64) []byte // in place of good's
		blocks   int                       // received, when not good's
	}{
		{"well formed", nil, nil, "", nil, nil, 0},
		{"dtype 0 on one type", nil, nil, "", nil, oneType, 2},
		{"empty message", nil, nil, "", nil, empty, 0},
		{"shorter than announced", nil, func(m []byte) []byte { return m[:len(m)-8] }, "message_size", ErrSizeMismatch, nil, 0},
		{"longer than announced", func(m []byte) int64 { return int64(len(m)) - 16 }, nil, "message_size", ErrSizeMismatch, nil, 0},
		{"manifest only", func([]byte) int64 { return 256 }, func(m []byte) []byte { return m[:256] }, "payload_length", ErrMalformed, nil, 0},
		{"header only", func([]byte) int64 { return 40 }, func(m []byte) []byte { return m[:40] }, "count", ErrMalformed, nil, 0},
		{"absurd length", func([]byte) int64 { return 1 << 62 }, nil, "count", ErrTooLarge, nil, 0},
		{"abort notice", nil, func(m []byte) []byte {
			n := make([]byte, wire.AbortSize)
			require.NoError(t, wire.EncodeAbort(n, wire.Header{Source: 0, Dest: 1, Tag: int32(x.Tag()), Epoch: x.Epoch()})) // rank 0 has already counted this exchange
			return n
		}, "flags", ErrPeerAborted, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if rank != 0 {
				r, err := x.Exchange(nil)
				if rank != 1 {
					if tc.sentinel == nil {
						require.NoError(t, err)
						return
					}
					require.ErrorIs(t, err, ErrPeerAborted, "rank 1 (or rank 0's notice) failed the exchange everywhere")
					return
				}
				if tc.sentinel == nil && tc.message != nil {
					require.NoError(t, err)
					c := r.From(0)
					require.NotNil(t, c, "the message is delivered")
					require.Equal(t, tc.blocks, c.Len())
					require.Equal(t, []int{0}, r.Sources())
					require.NoError(t, r.Free())
					return
				}
				if tc.sentinel == nil {
					require.NoError(t, err)
					c := r.From(0)
					require.Equal(t, 2, c.Len())
					k, err := c.Position(6)
					require.NoError(t, err)
					require.NoError(t, c.OnHost(c.Buffer().Allocator().DefaultStream(), devalloc.Read, func(h *packing.HostBlocks) error {
						f, err := h.Float32s(k)
						require.NoError(t, err)
						require.Len(t, f, 4)
						raw, err := h.Bytes(k)
						require.NoError(t, err)
						require.Equal(t, []byte{32, 33, 34, 35}, raw[:4])
						return nil
					}))
					require.NoError(t, r.Free())
					return
				}
				require.ErrorIs(t, err, tc.sentinel)
				w := wireErrorOf(t, err)
				require.Equal(t, 0, w.Peer)
				require.Equal(t, tc.field, w.Field)
				return
			}
			// Rank 0: the exchange by hand, on the exchanger's epoch.
			x.mu.Lock()
			x.stats.Exchanges++
			epoch := uint64(x.stats.Exchanges)
			x.mu.Unlock()
			m := good(epoch)
			if tc.message != nil {
				m = tc.message(epoch)
			}
			announced := int64(len(m))
			if tc.announce != nil {
				announced = tc.announce(m)
			}
			if tc.whole != nil {
				m = tc.whole(m)
			}
			sizes, got := make([]int64, size), make([]int64, size)
			sizes[1] = announced
			require.NoError(t, cluster.AlltoallWithin(x.comm, sizes, got, time.Minute))
			for _, n := range got {
				require.Zero(t, n, "nobody sends to rank 0")
			}
			// The messages travel on the exchanger's own communicator (a
			// peer in another language duplicates the communicator as
			// msg.New does).
			pin := cluster.PinBytes(m)
			req, err := x.comm.Isend(pin, 1, x.Tag())
			require.NoError(t, err)
			require.NoError(t, req.Attach(pin))
			// The agreement (like the count exchange, cluster's bounded
			// Alltoall): one MPI message sent to rank 1; failed when it was
			// an abort notice. The send completes once rank 1 has matched
			// it, which it may do only after the agreement (a length it
			// refused is drained then).
			agree, got := make([]int64, size), make([]int64, size)
			agree[1] = 1
			if tc.name == "abort notice" {
				agree[1] = -1 - 1
			}
			require.NoError(t, cluster.AlltoallWithin(x.comm, agree, got, time.Minute))
			for s, v := range got {
				if s != 1 || tc.sentinel == nil {
					require.Zero(t, v, "rank %d sent nothing to rank 0 and did not fail", s)
				} else if tc.name != "abort notice" {
					require.EqualValues(t, -1, v, "rank 1 failed, having sent nothing to rank 0")
				}
			}
			_, err = req.Wait()
			require.NoError(t, err)
		})
	}
}

func TestAbortBeforeCounts(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	x := newExchanger(t, Options{Comm: comm, Alloc: a})
	tr := traffic{seed: 77, density: 1, maxBlocks: 10, dims: []int{2}, dtypes: mixedTypes}
	bufs := sendAll(t, a, tr, rank, size)
	send := bufs
	if rank == 0 {
		send = append(append([]*packing.Coalesced(nil), bufs...), bufs[0]) // two buffers for one rank
	}
	r, err := x.Exchange(send)
	require.Nil(t, r)
	if rank == 0 {
		// Its own input failed: it hears of no other rank's failure, even
		// though every other failed because of it.
		require.ErrorIs(t, err, distbuf.ErrInvalid)
		require.NotErrorIs(t, err, ErrPeerAborted, "%v", err)
	} else {
		require.ErrorIs(t, err, ErrPeerAborted, "rank 0 announced that it failed")
		for _, w := range wireErrors(err) {
			require.Equal(t, 0, w.Peer, "only rank 0 is named: %v", err)
		}
		require.Equal(t, "count", wireErrorOf(t, err).Field)
	}
	// Nothing is left in flight: the next exchange works everywhere.
	r, err = x.Exchange(bufs)
	require.NoError(t, err)
	tr.verify(t, a.DefaultStream(), rank, size, r)
	require.NoError(t, r.Free())
}

func TestReceiverOutOfMemoryDrains(t *testing.T) {
	comm := world(t)
	rank := comm.Rank()
	conf := devalloc.Config{}
	if rank == 1 {
		// Room for the message in the budget, but not beside what rank 1
		// already holds: the length is accepted, the allocation fails.
		conf.Limit = 3 << 20
	}
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Config: &conf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Sync()); require.NoError(t, a.Close()) })
	x := newExchanger(t, Options{Comm: comm, Alloc: a})
	if rank == 1 {
		hog, err := a.Alloc(2<<20, a.DefaultStream())
		require.NoError(t, err)
		defer func() { require.NoError(t, hog.Free()) }()
	}
	starveReceiver(t, a, x, rank, 512, 512) // 2 MiB
}

// starveReceiver sends one rows x cols float64 block from rank 0 to rank 1,
// whose budget cannot hold it: rank 1 must report the allocation failure
// naming rank 0, and rank 0 must complete, its message drained.
func starveReceiver(t *testing.T, a *devalloc.Allocator, x *Exchanger, rank, rows, cols int) {
	t.Helper()
	var descs []packing.Desc
	if rank == 0 {
		descs = []packing.Desc{{ID: 1, DType: packing.Float64, Rows: rows, Cols: cols, Dest: 1}}
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	bufs, err := AllocSend(a, p, a.DefaultStream())
	require.NoError(t, err)
	r, err := x.Exchange(bufs)
	switch rank {
	case 1:
		require.ErrorIs(t, err, distbuf.ErrOutOfMemory, "the receive buffer does not fit the budget")
		require.ErrorContains(t, err, "rank 0")
	default:
		// The sender completes (the receiver drained its message) and
		// learns that rank 1 failed.
		require.Nil(t, r)
		require.ErrorIs(t, err, ErrPeerAborted)
		require.Equal(t, 1, wireErrorOf(t, err).Peer)
	}
	freeAll(t, bufs)
}

// TestLifetimes checks that a send buffer is a reader and a receive buffer
// a writer until their requests complete. Rank 1 posts no receive until
// rank 0 has made its checks (once it has matched rank 0's message, it
// waits for a side message), so rank 0's send is certainly pending while
// it checks, after its first wait.
func TestLifetimes(t *testing.T) {
	comm := world(t)
	rank := comm.Rank()
	eachVariant(t, Options{}, func(t *testing.T, v variant, a *devalloc.Allocator, x *Exchanger) {
		const sideTag = 77
		tr := traffic{seed: 8, density: 1, maxBlocks: 1, dims: []int{1}, dtypes: mixedTypes}
		var descs []packing.Desc
		if rank <= 1 {
			// 4 MiB each way: far above any eager limit, so a send
			// cannot complete before its receive is posted.
			descs = []packing.Desc{{ID: 1, DType: packing.Float64, Rows: 1024, Cols: 512, Dest: 1 - rank}}
		}
		p, err := packing.NewPlan(descs, packing.Options{})
		require.NoError(t, err)
		bufs, err := AllocSend(a, p, a.DefaultStream())
		require.NoError(t, err)
		tr.fill(t, a.DefaultStream(), rank, bufs)
		other, err := a.NewStream()
		require.NoError(t, err)
		defer func() { require.NoError(t, other.Close()) }()
		var sendWriteRan, recvReadRan chan struct{}
		freedEarly := false
		peer := x.routes[1-min(rank, 1)] // the route of the pair's messages
		switch rank {
		case 1:
			x.fault(func(r *faultyRoute) {
				if r.route != peer {
					return
				}
				r.beforeRecv = func() { sideMessage(t, comm.Irecv, 0, sideTag) }
			})
		case 0:
			x.fault(func(r *faultyRoute) {
				if r.route != peer {
					return
				}
				r.onWaited = func(e *exchange) {
					defer sideMessage(t, comm.Isend, 1, sideTag)
					sendBuf := bufs[0].Buffer()
					if sendBuf.Location() == devalloc.OnDevice && !v.aware {
						return // staged: MPI holds pinned chunks, not the buffer
					}
					// A write to the send buffer waits for the send.
					sendWriteRan = make(chan struct{})
					w, err := sendBuf.Write(other)
					require.NoError(t, err)
					ch := sendWriteRan
					require.NoError(t, other.Enqueue(func() error { close(ch); return nil }))
					require.NoError(t, w.Done())
					// Reading the receive buffer waits for the receive.
					recvReadRan = make(chan struct{})
					require.Len(t, e.ins, 1)
					rd, err := e.ins[0].buf.Read(other)
					require.NoError(t, err)
					ch2 := recvReadRan
					require.NoError(t, other.Enqueue(func() error { close(ch2); return nil }))
					require.NoError(t, rd.Done())
					time.Sleep(30 * time.Millisecond)
					select {
					case <-sendWriteRan:
						t.Error("a write to the send buffer ran while the send was pending")
					case <-recvReadRan:
						t.Error("a read of the receive buffer ran while the receive was pending")
					default:
					}
					// Freeing the send buffer now is deferred until the send completes.
					pending := a.Stats().PendingFrees
					require.NoError(t, bufs[0].Free())
					require.Equal(t, pending+1, a.Stats().PendingFrees, "the free waits for the MPI request")
					freedEarly = true
				}
			})
		}
		r, err := x.Exchange(bufs)
		require.NoError(t, err)
		if rank <= 1 {
			require.Equal(t, []int{1 - rank}, r.Sources())
		}
		require.NoError(t, r.Free())
		require.NoError(t, other.Synchronize())
		if sendWriteRan != nil {
			<-sendWriteRan
			<-recvReadRan
		}
		require.NoError(t, a.Sync())
		require.Zero(t, a.Stats().PendingFrees, "released once the requests completed")
		for _, b := range bufs {
			if !freedEarly {
				require.NoError(t, b.Free())
			}
		}
	})
}

// TestChunkedMessages cuts every message into many MPI messages, with a
// manifest longer than the first chunk, through a small window.
func TestChunkedMessages(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	eachVariant(t, Options{PayloadChecksum: true, Window: 2, ChunkBytes: MinChunkBytes, SelfViaMPI: true}, func(t *testing.T, v variant, a *devalloc.Allocator, x *Exchanger) {
		// 2500 blocks to each peer: a 80 KiB manifest, about 1 MiB of payload.
		tr := traffic{seed: 61, density: 1, maxBlocks: 1, dims: []int{1}, dtypes: mixedTypes}
		var descs []packing.Desc
		for d := range size {
			for k := range 2500 {
				descs = append(descs, packing.Desc{ID: uint64(d)<<40 | uint64(k), DType: mixedTypes[k%4], Rows: 4 + k%5, Cols: 3, Dest: d})
			}
		}
		p, err := packing.NewPlan(descs, packing.Options{})
		require.NoError(t, err)
		bufs, err := AllocSend(a, p, a.DefaultStream())
		require.NoError(t, err)
		tr.fill(t, a.DefaultStream(), rank, bufs)
		require.Greater(t, wire.PayloadOffset(2500), uint64(MinChunkBytes), "the manifest spans chunks")
		r, err := x.Exchange(bufs)
		require.NoError(t, err)
		s := a.DefaultStream()
		for src, c := range fromEach(t, r, size) {
			require.Equal(t, 2500, c.Len())
			requireContent(t, s, tr, src, c)
		}
		st := x.Stats()
		require.EqualValues(t, size, st.Messages)
		var chunks, windowed, read int64
		for _, b := range bufs {
			whole := int64(wire.PayloadOffset(b.Len())) + b.Size()
			routes, _ := x.Routes()
			if routes[b.Dest()] == RouteWindow {
				windowed++
				chunks++ // one notice, whatever the size
				continue
			}
			if routes[b.Dest()] == RouteRead {
				read++
				chunks++ // one read notice, whatever the size
				continue
			}
			chunks += (whole + MinChunkBytes - 1) / MinChunkBytes
		}
		require.EqualValues(t, windowed, st.Routes[RouteWindow].Messages)
		require.EqualValues(t, read, st.Routes[RouteRead].Messages, "every node-local peer's message read")
		require.EqualValues(t, int64(size)-windowed-read, st.Routes[RouteMPI].Messages+st.Routes[RouteStaged].Messages)
		if windowed == 0 && read == 0 {
			require.Greater(t, chunks, 5*st.Messages)
		}
		require.Equal(t, chunks, st.MPISends, "each message travels as ceil(size/chunk) MPI messages, or as one notice through a window or for a read")
		require.LessOrEqual(t, st.MaxInFlight, 2)
		freeBoth(t, r, bufs)
	})
}

// TestConcurrentExchangers runs two exchangers made on one communicator,
// with the same tag, from two goroutines at once: each exchanger has a
// duplicate of the communicator of its own, so their count exchanges,
// messages and agreements cannot cross.
func TestConcurrentExchangers(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	xs := []*Exchanger{newExchanger(t, Options{Comm: comm, Alloc: a}), newExchanger(t, Options{Comm: comm, Alloc: a})}
	require.Equal(t, xs[0].Tag(), xs[1].Tag())
	errs := make([]error, len(xs))
	var wg sync.WaitGroup
	for g, x := range xs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[g] = exchangeRepeatedly(a, x, rank, size, uint64(g), 30)
		}()
	}
	wg.Wait()
	for g, err := range errs {
		require.NoError(t, err, "exchanger %d", g)
	}
}

// exchangeRepeatedly runs iters exchanges of host buffers on x, each with
// another sparsity, and checks every byte received; it reports instead of
// failing, for use from goroutines.
func exchangeRepeatedly(a *devalloc.Allocator, x *Exchanger, rank, size int, g uint64, iters int) error {
	for it := range uint64(iters) {
		tr := traffic{seed: 1000*g + it, iter: it, density: 0.7, maxBlocks: 60, dims: []int{1, 4, 9, 16}, dtypes: mixedTypes}
		var descs []packing.Desc
		for d := range size {
			descs = append(descs, tr.blocks(rank, d)...)
		}
		p, err := packing.NewPlan(descs, packing.Options{})
		if err != nil {
			return err
		}
		bufs, err := AllocSend(a, p, a.DefaultStream())
		if err != nil {
			return err
		}
		free := func() {
			for _, b := range bufs {
				_ = b.Free()
			}
		}
		for _, c := range bufs {
			src := make([][]byte, c.Len())
			for k, v := range c.All() {
				src[k] = tr.content(rank, v.Desc().ID, v.Desc().Bytes())
			}
			if err := packing.PackHost(a.DefaultStream(), c, src); err != nil {
				free()
				return err
			}
		}
		r, err := x.Exchange(bufs)
		free()
		if err != nil {
			return fmt.Errorf("exchange %d: %w", it, err)
		}
		for src := range size {
			want, c := tr.blocks(src, rank), r.From(src)
			if len(want) == 0 {
				if c != nil {
					return fmt.Errorf("exchange %d: rank %d sent nothing, yet a buffer came", it, src)
				}
				continue
			}
			if c == nil || len(want) != c.Len() {
				return fmt.Errorf("exchange %d: blocks from rank %d: got %v, want %d", it, src, c, len(want))
			}
			h, err := c.Buffer().Hold(devalloc.Read)
			if err != nil {
				return err
			}
			err = h.Wait()
			mem, berr := c.Buffer().Bytes()
			if err = errors.Join(err, berr, h.Release()); err != nil {
				return err
			}
			for _, d := range want {
				k, err := c.Position(d.ID)
				if err != nil {
					return fmt.Errorf("exchange %d: %w", it, err)
				}
				v, err := c.View(k)
				if err != nil {
					return fmt.Errorf("exchange %d: %w", it, err)
				}
				got := mem[c.Start()+v.Offset():][:v.Desc().Bytes()]
				if string(got) != string(tr.content(src, d.ID, d.Bytes())) {
					return fmt.Errorf("exchange %d: block %d from rank %d differs", it, d.ID, src)
				}
			}
		}
		if err := r.Free(); err != nil {
			return err
		}
	}
	return nil
}

// TestNewFailsEverywhere: a rank whose options are bad still takes part in
// New's collectives, so that every rank fails alike instead of some waiting
// in the first exchange for a rank that never comes.
func TestNewFailsEverywhere(t *testing.T) {
	comm := world(t)
	rank := comm.Rank()
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	o := Options{Comm: comm, Alloc: a}
	if rank == 1 {
		o.Window = -5
	}
	x, err := New(o)
	require.Nil(t, x)
	if rank == 1 {
		require.ErrorIs(t, err, distbuf.ErrInvalid)
		require.ErrorContains(t, err, "Window")
	} else {
		require.ErrorIs(t, err, ErrPeerAborted)
		require.ErrorContains(t, err, "rank 1 could not set up its exchanger")
	}
	// Ranks that disagree on the tag fail alike too.
	o = Options{Comm: comm, Alloc: a, Tag: 100 + rank%2}
	_, err = New(o)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "disagree on the tag")
	// And the communicator still serves a working exchanger.
	newExchanger(t, Options{Comm: comm, Alloc: a})
}

// TestJoinedSendBuffers: send buffers that are the parts of one joined
// buffer (JoinSend) go out as separate buffers do, on every path: in
// place, where each message's manifest is written before any send holds
// the shared buffer, staged and through the windows; with and without a
// learned pattern. One allocation holds every destination.
func TestJoinedSendBuffers(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	for _, v := range variants(t) {
		for _, o := range allToAllOptions {
			for _, pattern := range []bool{false, true} {
				name := v.name + "/" + o.name
				if pattern {
					name += "/pattern"
				}
				t.Run(name, func(t *testing.T) {
					a := v.open(t)
					s := a.DefaultStream()
					opts := o.opts
					opts.Comm, opts.Alloc, opts.PayloadChecksum = comm, a, true
					x := newExchanger(t, opts)
					tr := traffic{seed: 300, density: 1, maxBlocks: 120, dims: []int{1, 2, 3, 5, 8}, dtypes: mixedTypes}
					p := tr.plan(t, rank, size)
					j, err := JoinSend(p)
					require.NoError(t, err)
					pat := x.NewPattern()
					for it := range 3 {
						before := a.Stats()
						joined, err := packing.Alloc(a, j, s)
						require.NoError(t, err)
						require.EqualValues(t, 1, a.Stats().AllocCalls-before.AllocCalls, "one allocation for every destination")
						parts, err := joined.Parts()
						require.NoError(t, err)
						tr.fill(t, s, rank, parts)
						var r *Received
						if pattern {
							r, err = pat.Exchange(parts)
						} else {
							r, err = x.Exchange(parts)
						}
						require.NoError(t, err, "iteration %d", it)
						tr.verify(t, s, rank, size, r)
						require.NoError(t, r.Free())
						require.ErrorIs(t, parts[0].Free(), distbuf.ErrInvalid, "the parts are the joined buffer's")
						require.NoError(t, joined.Free())
					}
					if pattern {
						require.True(t, pat.Learned())
					}
				})
			}
		}
	}
}

// TestLibraryHeldBuffers: what an exchanger keeps from one exchange to the
// next (window notices, windows, staging slots) is its own, not among the
// caller's buffers: a phase that frees all it allocated reads LiveBuffers
// 0 on every route, while the exchanger lives on.
func TestLibraryHeldBuffers(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	eachVariant(t, Options{ChunkBytes: MinChunkBytes}, func(t *testing.T, v variant, a *devalloc.Allocator, x *Exchanger) {
		require.Zero(t, a.Stats().LiveBuffers, "New keeps nothing of the caller's")
		for it := range uint64(2) {
			tr := traffic{seed: 12, iter: it, density: 1, maxBlocks: 60, dims: []int{32}, dtypes: mixedTypes}
			bufs, err := AllocSend(a, tr.plan(t, rank, size), a.DefaultStream())
			require.NoError(t, err)
			tr.fill(t, a.DefaultStream(), rank, bufs)
			r, err := x.Exchange(bufs)
			require.NoError(t, err)
			tr.verify(t, a.DefaultStream(), rank, size, r)
			freeBoth(t, r, bufs)
			require.NoError(t, a.Sync())
			require.Zero(t, a.Stats().LiveBuffers, "round %d: everything the phase allocated is freed", it)
		}
	})
}

// sideMessage sends (post: Isend) or receives (Irecv) one byte to or from
// peer on tag, outside any exchange, and waits for it.
func sideMessage(t *testing.T, post func(cluster.Memory, int, int) (*cluster.Request, error), peer, tag int) {
	side := cluster.PinBytes(make([]byte, 1))
	req, err := post(side, peer, tag)
	require.NoError(t, err)
	require.NoError(t, req.Attach(side))
	_, err = req.Wait()
	require.NoError(t, err)
}
