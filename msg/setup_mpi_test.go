//go:build mpi

package msg

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// The wire's holes a peer can open in the setup and between exchanges:
// each ends in a typed error on every rank (or in a documented fallback),
// never a panic, a hang or a poisoned pair.

// namesPeer reports whether one of err's WireErrors matches sentinel and
// names peer and field.
func namesPeer(err error, sentinel error, peer int, field string) bool {
	for _, w := range wireErrors(err) {
		if errors.Is(w, sentinel) && w.Peer == peer && w.Field == field {
			return true
		}
	}
	return false
}

// TestUncountedMessage: rank 0 sends rank 1 two MPI messages on the
// exchanger's communicator between two exchanges, outside any exchange (no
// count or agreement counts them), one with the exchange's tag and one
// with another. The next exchange matches them: rank 1 reports them
// (matching ErrMalformed, naming rank 0: the first arrives where rank 0's
// message should, the others are strays, and the agreement says rank 0
// sent fewer than arrived) and every other rank learns of its failure
// from the agreement; nothing of them is left, and the exchange after
// works everywhere, on every route.
func TestUncountedMessage(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size < 2 {
		t.Skip("needs a peer")
	}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			a, x, _, _ := v.exchanger(t, Options{})
			s := a.DefaultStream()
			for round := range 3 {
				tr := traffic{seed: 41, iter: uint64(round), density: 1, maxBlocks: 6, dims: []int{4, 16}, dtypes: mixedTypes}
				bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
				require.NoError(t, err)
				tr.fill(t, s, rank, bufs)
				r, err := x.Exchange(bufs)
				switch {
				case round != 1:
					require.NoError(t, err, "round %d", round)
					tr.verify(t, s, rank, size, r)
					require.NoError(t, r.Free())
				case rank == 1:
					// The first stands in for rank 0's message (whose
					// length or notice it does not have), the rest are
					// strays, and the agreement counts fewer than arrived.
					require.Nil(t, r)
					require.ErrorIs(t, err, ErrMalformed)
					require.NotErrorIs(t, err, ErrPeerAborted, "rank 1's own part failed: %v", err)
					require.True(t, namesPeer(err, ErrUnexpectedPeer, 0, "count"), "a stray from rank 0: %v", err)
					require.True(t, namesPeer(err, ErrUnexpectedPeer, 0, "agreement"), "rank 0 sent fewer than arrived: %v", err)
				default:
					require.Nil(t, r)
					require.ErrorIs(t, err, ErrPeerAborted)
					require.True(t, namesPeer(err, ErrPeerAborted, 1, "agreement"), "names rank 1: %v", err)
				}
				freeAll(t, bufs)
				if round == 0 && rank == 0 {
					var reqs []*cluster.Request
					for _, tag := range []int{x.Tag(), x.Tag() + 1} {
						pin := cluster.PinBytes(make([]byte, 100))
						req, err := x.comm.Isend(pin, 1, tag)
						require.NoError(t, err)
						require.NoError(t, req.Attach(pin))
						reqs = append(reqs, req)
					}
					t.Cleanup(func() { require.NoError(t, cluster.Waitall(reqs)) })
				}
			}
		})
	}
}

// TestWindowCannotBeAllocated: rank 1's window must grow for its large
// messages, and the device has no room for it. Its exchange fails with its
// own error and sends abort notices in place of its window messages: no
// panic, every other rank names rank 1. Once memory is back, the next
// exchange grows the window and works everywhere.
//
// On a real GPU every rank's process shares the device's memory, and a
// failed cudaMalloc makes the driver give back what the caller's own pools
// keep unused. So the windows are first made (round 0, small messages
// everywhere), and rank 1 gives back its pool's reservation before it takes
// all but a few MiB, leaving the other ranks' windows and pools as they
// are: only rank 1's growth can fail.
func TestWindowCannotBeAllocated(t *testing.T) {
	x, a, rank, size := nodeLocalExchanger(t)
	s := a.DefaultStream()
	comm := world(t)
	var hog uintptr
	var dev *cudart.Device
	if rank == 1 {
		rt, err := cudart.Load()
		require.NoError(t, err)
		dev = rt.Device(a.Info().Device)
	}
	// From round 1, rank 1 sends each peer one or two blocks of 768 x 768
	// doubles (4.5 MiB): more than round 0's 4 MiB window holds, more than
	// the hog leaves free.
	big := map[int][]int{1: {768}}
	for round := range 3 {
		tr := traffic{seed: 61, iter: uint64(round), density: 1, maxBlocks: 2, dims: []int{8}, dtypes: []packing.DType{packing.Float64}}
		if round > 0 {
			tr.srcDims = big
		}
		bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
		require.NoError(t, err)
		tr.fill(t, s, rank, bufs)
		require.NoError(t, a.Sync())
		if round == 1 && rank == 1 {
			require.NoError(t, a.Trim(0))
			free, _, err := dev.MemGetInfo()
			require.NoError(t, err)
			hog, err = dev.Malloc(free - 4<<20)
			require.NoError(t, err)
		}
		require.NoError(t, comm.BarrierWithin(stallResync), "the hog is taken before anyone exchanges")
		r, err := x.Exchange(bufs)
		switch {
		case round != 1:
			require.NoError(t, err, "round %d: every window has room", round)
			tr.verify(t, s, rank, size, r)
			require.NoError(t, r.Free())
		case rank == 1:
			require.Nil(t, r)
			require.ErrorContains(t, err, "node-local window")
			require.NotErrorIs(t, err, ErrPeerAborted, "rank 1's own failure: %v", err)
			require.NoError(t, dev.Free(hog))
		default:
			require.Nil(t, r)
			require.ErrorIs(t, err, ErrPeerAborted)
			require.True(t, namesPeer(err, ErrPeerAborted, 1, "flags"), "rank 1's abort notice, named: %v", err)
		}
		freeAll(t, bufs)
	}
}

// TestSetupRowBadEvents: rank 1's setup row carries event handles no
// runtime can open. The ranks find it in New, before any exchange relies
// on the events: nobody on the node uses windows (every rank says why),
// and exchanges work through MPI.
func TestSetupRowBadEvents(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size < 2 {
		t.Skip("a rank alone has no node-local peer")
	}
	v := variant{name: "cuda-ipc", kind: devalloc.BackendCUDA, transport: "auto"}
	a := v.open(t)
	var edits setupEdits
	if rank == 1 {
		edits.node = func(row *wire.SetupRow) {
			require.NotZero(t, row.Flags&wire.SetupWindows, "rank 1 offers windows")
			row.Ready[0] ^= 0xff
		}
	}
	x, err := open(Options{Comm: comm, Alloc: a}, edits)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, x.Close()) })
	require.Empty(t, peersOn(x, RouteWindow))
	_, why := x.Routes()
	if rank == 1 {
		require.Contains(t, why, "could not open another's interprocess events", why)
	} else {
		require.Contains(t, why, "windows: rank 1's interprocess events", why)
	}
	s := a.DefaultStream()
	tr := traffic{seed: 62, density: 1, maxBlocks: 10, dims: []int{8}, dtypes: mixedTypes}
	bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
	require.NoError(t, err)
	defer freeAll(t, bufs)
	require.NoError(t, exchangeVerified(t, x.Exchange, s, tr, rank, size, bufs).Free())
}

// TestSetupRowsLie: a rank's node-local row that names another rank, or
// offers reads of another rank's process, breaks the format: New fails on
// every rank alike (ErrMalformed) naming the row's sender, and the
// communicator still serves a working exchanger.
func TestSetupRowsLie(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size < 2 {
		t.Skip("a rank alone has no node-local peer")
	}
	a := variant{name: "host-reads", kind: devalloc.BackendHost, transport: "auto"}.open(t)
	pids := make([]int64, size)
	require.NoError(t, cluster.AllgatherWithin(comm, []int64{int64(os.Getpid())}, pids, stallResync))
	for _, tc := range []struct {
		name string
		edit func(row *wire.SetupRow)
		want string
	}{
		{"rank field", func(row *wire.SetupRow) { row.Rank = 0 }, "the row of rank 1 (position 1) says it is rank 0's"},
		{"another rank's process", func(row *wire.SetupRow) { row.PID = pids[0] }, fmt.Sprintf("the rows of ranks 0 and 1 both offer reads of process %d", pids[0])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var edits setupEdits
			if rank == 1 {
				edits.node = tc.edit
			}
			x, err := open(Options{Comm: comm, Alloc: a}, edits)
			require.Nil(t, x)
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorContains(t, err, tc.want)
		})
	}
	newExchanger(t, Options{Comm: comm, Alloc: a})
}

// TestSettingsRowHostile: a rank that sends a failure word of
// -9223372036854775807 in New's settings row (as a peer in another
// language might) is named by every rank as the sender of a malformed
// row; no rank blames rank 0 or a rank that does not exist.
func TestSettingsRowHostile(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size < 2 {
		t.Skip("needs a peer")
	}
	last := size - 1
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	var edits setupEdits
	if rank == last {
		edits.settings = func(row []int64) { row[settingFailed] = -9223372036854775807 }
	}
	x, err := open(Options{Comm: comm, Alloc: a}, edits)
	require.Nil(t, x)
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, fmt.Sprintf("rank %d's settings row", last))
	require.NotErrorIs(t, err, ErrPeerAborted)
	require.NotContains(t, err.Error(), "could not set up")
	newExchanger(t, Options{Comm: comm, Alloc: a})
}
