//go:build mpi

package msg

import (
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// The fault matrix: rank 0 plays a faulty peer towards rank 1 in one
// exchange, in each of the ways below, while every rank sends to every
// rank. Every rank must then return the error its role expects (no panic,
// no hang), no byte may land outside the memory a receive was given
// (canaries around every receive region), and the next exchange must work
// everywhere. It runs on every receive path the binary has (host, staged,
// CUDA-aware and node-local windows on the fake runtime without a GPU, on
// the real one with DISTBUF_REQUIRE_GPU=1). Through a window the only MPI
// message is the notice: the pieces hook then rewrites the notice, and
// mangle the whole message as it lands in the window.

const (
	faulty = 0
	victim = 1
)

// expect is the error a rank must return: matching sentinel, and naming
// peer and field in one of its WireErrors (field "" when the error is not
// about the wire).
type expect struct {
	sentinel error
	peer     int
	field    string
	// orNothing: the rank may also succeed. A stray that arrives only
	// after the agreement fails its receiver alone: the data of the
	// exchange did arrive everywhere.
	orNothing bool
}

type faultCase struct {
	name    string
	opts    Options // Timeout, PayloadChecksum
	dropped bool    // rank 0 has nothing for rank 1 in this exchange
	// hostOnly: the case runs on the host variant only (it waits out the
	// timeout, which says nothing more on other paths).
	hostOnly bool
	// readsOnly: the case rewrites a read notice, and runs only where the
	// victim reads the faulty rank's messages.
	readsOnly bool
	inject    func(x *Exchanger, f *faultyRoute)               // on rank 0
	prepare   func(t *testing.T, a *devalloc.Allocator) func() // on rank 1, before the exchange; returns its undo
	send      func(bufs []*packing.Coalesced) []*packing.Coalesced
	faulty    expect
	victim    expect
	other     expect
	// victimReads, when set, is what the victim returns where it reads
	// the faulty rank's message (one notice, whatever the length).
	victimReads *expect
}

// victimFailed is what the ranks that did nothing wrong learn from the
// agreement when rank 1 rejected what rank 0 sent; victimMayFail when
// rank 1 may learn it only after the agreement.
var (
	victimFailed  = expect{sentinel: ErrPeerAborted, peer: victim, field: "agreement"}
	victimMayFail = expect{sentinel: ErrPeerAborted, peer: victim, field: "agreement", orNothing: true}
)

// onPiecesTo rewrites the MPI messages of rank 0's message to rank 1.
func onPiecesTo(f func(pieces [][]byte) [][]byte) func(x *Exchanger, r *faultyRoute) {
	return func(x *Exchanger, r *faultyRoute) {
		r.replace = func(dest int, whole []byte) [][]byte {
			if dest != victim {
				return nil
			}
			var pieces [][]byte
			for off := int64(0); off < int64(len(whole)); off += x.lim.chunk {
				pieces = append(pieces, whole[off:min(off+x.lim.chunk, int64(len(whole)))])
			}
			return f(pieces)
		}
	}
}

func announceTo(n int64) func(x *Exchanger, r *faultyRoute) {
	return func(x *Exchanger, r *faultyRoute) {
		x.coll = faultyCounts{collectives: x.coll, announce: func(sizes []int64) { sizes[victim] = n }}
	}
}

func faultCases() []faultCase {
	short := Options{Timeout: 3 * time.Second}
	return []faultCase{
		{name: "oversize-first-piece", inject: onPiecesTo(func(p [][]byte) [][]byte {
			p[0] = append(p[0], make([]byte, 64<<10)...)
			return p
		}), victim: expect{sentinel: ErrSizeMismatch, peer: faulty, field: "message_size"}, faulty: victimFailed, other: victimFailed},
		{name: "oversize-last-piece", inject: onPiecesTo(func(p [][]byte) [][]byte {
			p[len(p)-1] = append(p[len(p)-1], make([]byte, 10)...)
			return p
		}), victim: expect{sentinel: ErrSizeMismatch, peer: faulty, field: "message_size"}, faulty: victimFailed, other: victimFailed},
		{name: "undersize", inject: onPiecesTo(func(p [][]byte) [][]byte {
			last := p[len(p)-1]
			p[len(p)-1] = last[:len(last)-min(100, len(last)-1)]
			return p
		}), victim: expect{sentinel: ErrSizeMismatch, peer: faulty, field: "message_size"}, faulty: victimFailed, other: victimFailed},
		{name: "stray-after-message", inject: func(x *Exchanger, r *faultyRoute) {
			r.extra = func(dest int) [][]byte {
				if dest == victim {
					return [][]byte{make([]byte, 100<<10)}
				}
				return nil
			}
		}, victim: expect{sentinel: ErrUnexpectedPeer, peer: faulty, field: "count"}, faulty: victimMayFail, other: victimMayFail},
		{name: "stray-unannounced", dropped: true, inject: func(x *Exchanger, r *faultyRoute) {
			r.extra = func(dest int) [][]byte {
				if dest == victim {
					return [][]byte{make([]byte, 100<<10), make([]byte, 300)}
				}
				return nil
			}
		}, victim: expect{sentinel: ErrUnexpectedPeer, peer: faulty, field: "count"}, faulty: victimMayFail, other: victimMayFail},
		{name: "count=2^62", inject: announceTo(1 << 62), victim: expect{sentinel: ErrTooLarge, peer: faulty, field: "count"}, faulty: victimFailed, other: victimFailed},
		{name: "count=maxint64", inject: announceTo(math.MaxInt64), victim: expect{sentinel: ErrTooLarge, peer: faulty, field: "count"}, faulty: victimFailed, other: victimFailed},
		{name: "count=-7", inject: announceTo(-7), victim: expect{sentinel: ErrMalformed, peer: faulty, field: "count"}, faulty: victimFailed, other: victimFailed},
		// Lengths within the protocol's limit but beyond the receiver's
		// memory: the receiver drains what comes and waits for the rest,
		// which never comes.
		{name: "count=2^40", hostOnly: true, opts: short, inject: announceTo(1 << 40), victim: expect{sentinel: ErrTooLarge, peer: faulty, field: "count"}, faulty: victimFailed, other: victimFailed},
		{name: "count=2^50", hostOnly: true, opts: short, inject: announceTo(1 << 50), victim: expect{sentinel: ErrTimeout, peer: faulty, field: "pieces"}, faulty: victimFailed, other: victimFailed,
			victimReads: &expect{sentinel: ErrTooLarge, peer: faulty, field: "count"}}, // the notice comes, and is drained
		{name: "bad-manifest", inject: func(x *Exchanger, r *faultyRoute) {
			r.mangle = func(dest int, whole []byte) {
				if dest == victim {
					binary.LittleEndian.PutUint64(whole[wire.HeaderSize+8:], binary.LittleEndian.Uint64(whole[48:]))
					reseal(whole)
				}
			}
		}, victim: expect{sentinel: ErrMalformed, peer: faulty, field: "entry[0].offset"}, faulty: victimFailed, other: victimFailed},
		{name: "bad-checksum", opts: Options{PayloadChecksum: true}, inject: func(x *Exchanger, r *faultyRoute) {
			r.mangle = func(dest int, whole []byte) {
				if dest == victim {
					whole[len(whole)-5] ^= 0x20
				}
			}
		}, victim: expect{sentinel: ErrChecksum, peer: faulty, field: "payload_checksum"}, faulty: victimFailed, other: victimFailed},
		{name: "receiver-out-of-memory", prepare: func(t *testing.T, a *devalloc.Allocator) func() {
			// The budget takes each length, but not beside what rank 1 holds.
			hog, err := a.Alloc(a.Info().Limit-100<<10, a.DefaultStream())
			require.NoError(t, err)
			return func() { require.NoError(t, hog.Free()) }
		}, victim: expect{sentinel: distbuf.ErrOutOfMemory, peer: -1, field: ""}, faulty: victimFailed, other: victimFailed},
		{name: "missing-piece", opts: short, inject: onPiecesTo(func(p [][]byte) [][]byte {
			return p[:len(p)-1]
		}), victim: expect{sentinel: ErrTimeout, peer: faulty, field: "pieces"}, faulty: victimFailed, other: victimFailed},
		{name: "abort-notice", inject: func(x *Exchanger, r *faultyRoute) {
			r.replace = func(dest int, whole []byte) [][]byte {
				if dest != victim {
					return nil
				}
				pieces := make([][]byte, chunkCount(int64(len(whole)), x.lim.chunk))
				pieces[0] = make([]byte, wire.AbortSize)
				_ = wire.EncodeAbort(pieces[0], wire.Header{Source: faulty, Dest: victim, Tag: int32(x.Tag()), Epoch: uint64(x.stats.Exchanges)})
				return pieces
			}
		}, victim: expect{sentinel: ErrPeerAborted, peer: faulty, field: "flags"}, faulty: victimFailed, other: victimFailed},
		{name: "read-address-unmapped", readsOnly: true, inject: onPiecesTo(func(p [][]byte) [][]byte {
			binary.LittleEndian.PutUint64(p[0][8:], 4096) // the first page: never mapped
			return p
		}), victim: expect{sentinel: ErrMalformed, peer: faulty, field: "read_address"}, faulty: victimFailed, other: victimFailed},
		{name: "read-magic", readsOnly: true, inject: onPiecesTo(func(p [][]byte) [][]byte {
			p[0][0] ^= 1
			return p
		}), victim: expect{sentinel: ErrMalformed, peer: faulty, field: "read_magic"}, faulty: victimFailed, other: victimFailed},
		{name: "read-length", readsOnly: true, inject: onPiecesTo(func(p [][]byte) [][]byte {
			binary.LittleEndian.PutUint64(p[0][16:], binary.LittleEndian.Uint64(p[0][16:])+8)
			return p
		}), victim: expect{sentinel: ErrSizeMismatch, peer: faulty, field: "message_size"}, faulty: victimFailed, other: victimFailed},
		{name: "sender-fails-before-counts", send: func(bufs []*packing.Coalesced) []*packing.Coalesced {
			return append(append([]*packing.Coalesced(nil), bufs...), bufs[0]) // two buffers for one rank
		}, faulty: expect{sentinel: distbuf.ErrInvalid, peer: -1, field: ""}, victim: expect{sentinel: ErrPeerAborted, peer: faulty, field: "count"}, other: expect{sentinel: ErrPeerAborted, peer: faulty, field: "count"}},
	}
}

// faultTraffic has every rank send every rank (itself included) 40 blocks
// of 32x32 float64: 320 KiB, five MPI messages at the 64 KiB chunk size.
func faultTraffic(it uint64) traffic {
	return traffic{seed: 900, iter: it, density: 1, maxBlocks: 1, dims: []int{32}, dtypes: []packing.DType{packing.Float64}}
}

func faultPlan(t *testing.T, rank, size int, dropped bool) *packing.Plan {
	var descs []packing.Desc
	for d := range size {
		if dropped && rank == faulty && d == victim {
			continue
		}
		for k := range 40 {
			descs = append(descs, packing.Desc{ID: uint64(d)<<20 | uint64(k), DType: packing.Float64, Rows: 32, Cols: 32, Dest: d})
		}
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	return p
}

// wireErrors lists every *WireError in err's tree.
func wireErrors(err error) []*WireError {
	var out []*WireError
	var walk func(error)
	walk = func(err error) {
		if w, ok := err.(*WireError); ok {
			out = append(out, w)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

func (want expect) check(t *testing.T, role string, r *Received, err error) {
	t.Helper()
	if want.orNothing && err == nil {
		require.NoError(t, r.Free())
		return
	}
	require.Nil(t, r, "a failed exchange returns no buffers")
	require.Error(t, err, role)
	require.ErrorIs(t, err, want.sentinel, role)
	if want.sentinel != ErrPeerAborted {
		// Its own part failed: its error says so, and names no other.
		require.NotErrorIs(t, err, ErrPeerAborted, "%s: an error of its own: %v", role, err)
	}
	if want.field == "" {
		return
	}
	for _, w := range wireErrors(err) {
		if errors.Is(w, want.sentinel) && w.Peer == want.peer && w.Field == want.field {
			return
		}
	}
	t.Fatalf("%s: no error matching %v names rank %d and field %q in:\n%v", role, want.sentinel, want.peer, want.field, err)
}

func TestFaultMatrix(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size < 3 {
		t.Skip("the fault matrix needs a faulty sender, its victim and a bystander: 3 ranks")
	}
	for _, v := range variants(t) {
		for _, fc := range faultCases() {
			if fc.hostOnly && v.kind != devalloc.BackendHost {
				continue
			}
			if fc.readsOnly && v.name != "host-reads" {
				continue
			}
			t.Run(v.name+"/"+fc.name, func(t *testing.T) {
				runFault(t, v, fc, rank, size)
			})
		}
	}
}

func runFault(t *testing.T, v variant, fc faultCase, rank, size int) {
	comm := world(t)
	var a *devalloc.Allocator
	if rank == victim && fc.prepare != nil {
		conf := &devalloc.Config{Limit: 2 << 20}
		a = v.openWith(t, conf)
	} else {
		a = v.open(t)
	}
	// Send buffers from a host allocator of their own: every path is fed
	// by buffers of another allocator than the exchanger's.
	sa, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sa.Sync()); require.NoError(t, sa.Close()) })

	opts := fc.opts
	opts.Comm, opts.Alloc, opts.ChunkBytes = comm, a, MinChunkBytes
	x := newExchanger(t, opts)
	var mu sync.Mutex
	var hits []string
	real := x.coll
	x.fault(func(r *faultyRoute) {
		r.canary = 4096
		r.canaryHit = func(what string) {
			mu.Lock()
			defer mu.Unlock()
			hits = append(hits, what)
		}
		if rank == faulty && fc.inject != nil {
			fc.inject(x, r)
		}
	})
	undo := func() {}
	if rank == victim && fc.prepare != nil {
		undo = fc.prepare(t, a)
	}

	s := sa.DefaultStream()
	tr := faultTraffic(1)
	bufs, err := AllocSend(sa, faultPlan(t, rank, size, fc.dropped), s)
	require.NoError(t, err)
	defer func() {
		freeAll(t, bufs)
	}()
	tr.fill(t, s, rank, bufs)
	send := bufs
	if rank == faulty && fc.send != nil {
		send = fc.send(bufs)
	}
	start := time.Now()
	r, err := x.Exchange(send)
	switch rank {
	case faulty:
		fc.faulty.check(t, "the faulty rank", r, err)
	case victim:
		want := fc.victim
		if routes, _ := x.Routes(); fc.victimReads != nil && routes[faulty] == RouteRead {
			want = *fc.victimReads
		}
		want.check(t, "the victim", r, err)
	default:
		fc.other.check(t, "a bystander", r, err)
	}
	require.Less(t, time.Since(start), time.Minute)
	undo()

	// The next exchange works everywhere, on the same exchanger.
	x.coll = real
	for _, r := range x.steps {
		if f, ok := r.(*faultyRoute); ok {
			f.replace, f.extra, f.mangle = nil, nil, nil
		}
	}
	tr = faultTraffic(2)
	clean, err := AllocSend(sa, faultPlan(t, rank, size, false), s)
	require.NoError(t, err)
	defer func() {
		freeAll(t, clean)
	}()
	tr.fill(t, s, rank, clean)
	r, err = x.Exchange(clean)
	require.NoError(t, err, "the exchange after the fault")
	for src := range size {
		c := r.From(src)
		require.NotNil(t, c, "from rank %d", src)
		requireContent(t, a.DefaultStream(), tr, src, c)
	}
	require.NoError(t, r.Free())
	require.NoError(t, a.Sync())
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, hits, "bytes were written outside the memory of a receive")
}
