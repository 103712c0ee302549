//go:build mpi

package msg

import (
	"errors"
	"maps"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/gather"
	"github.com/distbuf/distbuf/internal/ipcwin"
	"github.com/stretchr/testify/require"
)

// TestNodeLocalWindows runs exchanges between node-local ranks on the GPU
// (the fake runtime here, whose IPC works between processes): messages go
// through the senders' windows, which grow when the messages outgrow them
// (so that receivers open a new generation), patterns and plain exchanges
// alternate, and every byte arrives. One rank then asks for TransportMPI:
// its pairs fall back to MPI while the others keep their windows.
func TestNodeLocalWindows(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	v := variant{name: "cuda-ipc", kind: devalloc.BackendCUDA, transport: "auto"}
	a := v.open(t)
	x := newExchanger(t, Options{Comm: comm, Alloc: a})
	if size == 1 {
		require.Empty(t, peersOn(x, RouteWindow), "a rank alone has no node-local peer")
		return
	}
	_, why := x.Routes()
	require.Len(t, peersOn(x, RouteWindow), size-1, "every other rank of this node: %s", why)
	s := a.DefaultStream()
	var pat *Pattern
	var most int64 // the most one round put in the window
	// The last rounds send up to 20 MiB to each peer: past the first window.
	for it, maxBlocks := range []int{2, 2, 40, 40, 400, 400} {
		tr := traffic{seed: 77 + uint64(maxBlocks), iter: uint64(it), density: 1, maxBlocks: maxBlocks, dims: []int{64}, dtypes: mixedTypes}
		bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
		require.NoError(t, err)
		tr.fill(t, s, rank, bufs)
		before := x.Stats()
		var r *Received
		if it%2 == 0 {
			pat = x.NewPattern()
			r, err = pat.Exchange(bufs)
		} else {
			r, err = pat.Exchange(bufs) // the pattern learned on the sizes of this round
		}
		require.NoError(t, err)
		tr.verify(t, s, rank, size, r)
		after := x.Stats()
		require.EqualValues(t, size-1, after.IPCMessages-before.IPCMessages, "one window message to every other rank")
		require.EqualValues(t, size-1, after.MPISends-before.MPISends, "and one MPI notice each")
		most = max(most, after.IPCBytes-before.IPCBytes)
		require.NoError(t, r.Free())
		for _, b := range bufs {
			require.NoError(t, b.Free())
		}
	}
	_, winSize, gen, _ := windowOf(x).link.Window()
	require.GreaterOrEqual(t, winSize, most, "the window holds the largest round")
	if most > ipcwin.MinWindow {
		require.Greater(t, gen, uint64(1), "the window grew as the messages did")
	}

	// Rank 0 keeps its device messages off the windows: its pairs use MPI,
	// in both directions, and the rest still use their windows.
	tr := traffic{seed: 5, density: 1, maxBlocks: 20, dims: []int{16}, dtypes: mixedTypes}
	if rank == 0 {
		t.Setenv(EnvTransport, "mpi")
	}
	y := newExchanger(t, Options{Comm: comm, Alloc: a})
	want := size - 1
	if rank == 0 {
		want = 0
	} else {
		want = size - 2
	}
	require.Len(t, peersOn(y, RouteWindow), want)
	bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
	require.NoError(t, err)
	tr.fill(t, s, rank, bufs)
	r, err := y.Exchange(bufs)
	require.NoError(t, err)
	tr.verify(t, s, rank, size, r)
	require.EqualValues(t, want, y.Stats().IPCMessages)
	require.NoError(t, r.Free())
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
}

// nodeLocalExchanger opens this rank's allocator on the CUDA backend (the
// fake runtime without a GPU) and an exchanger whose every peer is
// node-local; a rank alone skips the test.
func nodeLocalExchanger(t *testing.T) (x *Exchanger, a *devalloc.Allocator, rank, size int) {
	t.Helper()
	comm := world(t)
	rank, size = comm.Rank(), comm.Size()
	if size == 1 {
		t.Skip("a rank alone has no node-local peer")
	}
	v := variant{name: "cuda-ipc", kind: devalloc.BackendCUDA, transport: "auto"}
	a = v.open(t)
	x = newExchanger(t, Options{Comm: comm, Alloc: a})
	_, why := x.Routes()
	require.Len(t, peersOn(x, RouteWindow), size-1, "every other rank of this node: %s", why)
	return x, a, rank, size
}

// peersOn lists the peers x reaches on route r.
func peersOn(x *Exchanger, r Route) []int {
	var out []int
	routes, _ := x.Routes()
	for p, pr := range routes {
		if pr == r {
			out = append(out, p)
		}
	}
	return out
}

// windowOf is x's window route.
func windowOf(x *Exchanger) *windowRoute {
	for _, r := range x.steps {
		if w, ok := r.(*windowRoute); ok {
			return w
		}
	}
	return nil
}

// TestNoticeBuffersKept: the pinned buffer a peer's notice arrived in is
// kept for its next notice, which arrives in the same buffer when it fits,
// as is the one a notice to a peer went out from, and the exchanger's Close
// frees them (the allocator's leak check).
func TestNoticeBuffersKept(t *testing.T) {
	x, a, rank, size := nodeLocalExchanger(t)
	s := a.DefaultStream()
	tr := traffic{seed: 91, density: 1, maxBlocks: 30, dims: []int{8}, dtypes: mixedTypes}
	notices := &windowOf(x).link.Notices
	var kept, sent map[int]*devalloc.Buffer
	for round := range 2 {
		bufs, err := AllocSend(a, tr.plan(t, rank, size), s) // the same traffic both rounds
		require.NoError(t, err)
		tr.fill(t, s, rank, bufs)
		r, err := x.Exchange(bufs)
		require.NoError(t, err)
		tr.verify(t, s, rank, size, r)
		nowSent, nowKept := notices.Buffers()
		require.Len(t, nowKept, size-1, "one notice buffer kept per peer")
		require.Len(t, nowSent, size-1, "one notice buffer kept per peer sent to")
		if round == 0 {
			kept, sent = maps.Clone(nowKept), maps.Clone(nowSent)
		} else {
			require.Equal(t, kept, nowKept, "the same notices arrived in the same buffers")
			require.Equal(t, sent, nowSent, "the same notices went out from the same buffers")
		}
		require.NoError(t, r.Free())
		for _, b := range bufs {
			require.NoError(t, b.Free())
		}
	}
}

// TestJointReceiveBuffer: the messages that come through windows share one
// receive buffer, allocated once an exchange, and each received Coalesced
// owns it with the others: it lives until the last of them is freed.
func TestJointReceiveBuffer(t *testing.T) {
	x, a, rank, size := nodeLocalExchanger(t)
	s := a.DefaultStream()
	tr := traffic{seed: 57, density: 1, maxBlocks: 40, dims: []int{3, 8}, dtypes: mixedTypes}
	bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
	require.NoError(t, err)
	defer func() {
		for _, b := range bufs {
			require.NoError(t, b.Free())
		}
	}()
	tr.fill(t, s, rank, bufs)
	require.NoError(t, s.Synchronize())
	before := a.Stats()
	r, err := x.Exchange(bufs)
	require.NoError(t, err)
	tr.verify(t, s, rank, size, r)
	peers := make([]int, 0, size-1)
	for _, src := range r.Sources() {
		if src != rank {
			peers = append(peers, src)
		}
	}
	require.Len(t, peers, size-1)
	joint := r.From(peers[0]).Buffer()
	for _, src := range peers[1:] {
		require.Same(t, joint, r.From(src).Buffer(), "from rank %d: one buffer for every window message when there are several", src)
	}
	// The message to self is a buffer of its own; the window messages
	// take one allocation between them when they are several.
	require.EqualValues(t, 2, a.Stats().AllocCalls-before.AllocCalls, "one receive buffer for the window messages (its own for a lone one), one for the copy to self")
	require.NoError(t, r.From(rank).Free())
	live := a.Stats().LiveBuffers
	for i, src := range peers {
		require.NoError(t, r.From(src).Free())
		if size > 2 && i < len(peers)-1 {
			require.Equal(t, live, a.Stats().LiveBuffers, "the joint buffer lives while a result holds it")
		}
	}
	require.Equal(t, live-1, a.Stats().LiveBuffers, "the last result frees it")
	require.ErrorIs(t, r.From(peers[0]).Free(), distbuf.ErrFreed)
}

// TestWindowCopiesBatched: an exchange's copies into this rank's window
// (blocks and manifest for every peer) are one runtime call however many
// peers there are, and its copies from the peers' windows one call per
// wait that delivered notices: at most one per peer, where they were three
// per peer, one at a time. That call is a cudaMemcpyBatchAsync, or, as
// under MPS, one launch of the gather kernel (internal/gather).
func TestWindowCopiesBatched(t *testing.T) {
	x, a, rank, size := nodeLocalExchanger(t)
	s := a.DefaultStream()
	tr := traffic{seed: 17, density: 1, maxBlocks: 30, dims: []int{8}, dtypes: mixedTypes}
	link := windowOf(x).link
	require.Equal(t, link.Device().MPSEnabled(), link.Kernel, "the kernel takes the batches where the GPU is shared through MPS")
	kernelLoads := gather.Status(a.Info().Device) == nil
	for _, kernel := range []bool{false, true} {
		for round := range 2 {
			link.Kernel = kernel // as under MPS, or not
			bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
			require.NoError(t, err)
			tr.fill(t, s, rank, bufs)
			require.NoError(t, s.Synchronize())
			before := cudart.Calls()
			r, err := x.Exchange(bufs)
			require.NoError(t, err)
			calls := cudart.Calls().Sub(before)
			tr.verify(t, s, rank, size, r)
			peers := size - 1
			// Several copies are one cudaMemcpyBatchAsync or one launch of
			// the gather kernel (internal/gather), a lone one a cudaMemcpyAsync; the copy
			// to self is one more cudaMemcpyAsync.
			batches := calls["cudaLaunchKernel"] + calls["cudaMemcpyBatchAsync"]
			switch {
			case !kernel:
				require.Zero(t, calls["cudaLaunchKernel"], "kernel %v round %d: %v", kernel, round, calls)
			case kernelLoads:
				require.Zero(t, calls["cudaMemcpyBatchAsync"], "kernel %v round %d: the kernel takes every batch: %v", kernel, round, calls)
			}
			require.GreaterOrEqual(t, batches, uint64(1), "kernel %v round %d: the copies into the window: %v", kernel, round, calls)
			fromWindows := batches + calls["cudaMemcpyAsync"] - 2
			require.GreaterOrEqual(t, fromWindows, uint64(1), "kernel %v round %d: %v", kernel, round, calls)
			require.LessOrEqual(t, fromWindows, uint64(peers), "kernel %v round %d: %v", kernel, round, calls)
			if peers == 1 {
				require.EqualValues(t, 1, batches, "kernel %v round %d: a lone copy from a window is no batch: %v", kernel, round, calls)
			}
			if kernel && kernelLoads {
				require.EqualValues(t, 1, fromWindows, "round %d: under MPS the copies from every window wait for the last notice and go together: %v", round, calls)
			}
			require.NoError(t, r.Free())
			for _, b := range bufs {
				require.NoError(t, b.Free())
			}
		}
	}
}

// TestWindowCopyFailure: when rank 0's copies into its window fail, an
// abort notice replaces each of its window messages, and when its copies
// from its peers' windows fail, its receives fail: either way rank 0
// returns the copies' error, every other rank ErrPeerAborted naming rank 0,
// no rank returns buffers, and the next exchange works everywhere.
func TestWindowCopyFailure(t *testing.T) {
	for _, into := range []bool{true, false} {
		// Its peers learn of it from the abort notices that replace its
		// window messages, or from the agreement that ends the exchange.
		name, field := "from-windows", "agreement"
		if into {
			name, field = "into-window", "flags"
		}
		t.Run(name, func(t *testing.T) {
			x, a, rank, size := nodeLocalExchanger(t)
			injected := errors.New("injected window copy failure")
			var faults []*faultyRoute
			if rank == 0 {
				faults = x.fault(func(r *faultyRoute) {
					r.windowCopies = func(side bool) error {
						if side == into {
							return injected
						}
						return nil
					}
				})
			}
			s := a.DefaultStream()
			for round := range 2 {
				tr := traffic{seed: 23, iter: uint64(round), density: 1, maxBlocks: 20, dims: []int{8}, dtypes: mixedTypes}
				bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
				require.NoError(t, err)
				tr.fill(t, s, rank, bufs)
				r, err := x.Exchange(bufs)
				if round == 0 {
					require.Nil(t, r, "a failed exchange returns no buffers")
					if rank == 0 {
						require.ErrorIs(t, err, injected)
					} else {
						require.ErrorIs(t, err, ErrPeerAborted)
						named := false
						for _, w := range wireErrors(err) {
							named = named || (errors.Is(w, ErrPeerAborted) && w.Peer == 0 && w.Field == field)
						}
						require.True(t, named, "the error names rank 0 and %s: %v", field, err)
					}
					for _, f := range faults {
						f.windowCopies = nil
					}
				} else {
					require.NoError(t, err, "the exchange after the failure")
					tr.verify(t, s, rank, size, r)
					require.NoError(t, r.Free())
				}
				for _, b := range bufs {
					require.NoError(t, b.Free())
				}
			}
		})
	}
}
