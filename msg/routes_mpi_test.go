//go:build mpi

package msg

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/gather"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/distbuf/distbuf/internal/ipcwin"
	"github.com/distbuf/distbuf/packing"
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
		win := after.Routes[RouteWindow].Messages - before.Routes[RouteWindow].Messages
		require.EqualValues(t, size-1, win, "one window message to every other rank")
		require.EqualValues(t, size-1, after.Messages-before.Messages, "the totals count what the peers got")
		require.EqualValues(t, after.Bytes-before.Bytes, after.Routes[RouteWindow].Bytes-before.Routes[RouteWindow].Bytes)
		require.EqualValues(t, size-1, after.MPISends-before.MPISends, "and one MPI notice each")
		most = max(most, after.Routes[RouteWindow].Bytes-before.Routes[RouteWindow].Bytes)
		freeBoth(t, r, bufs)
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
	want := size - 2
	if rank == 0 {
		want = 0
	}
	require.Len(t, peersOn(y, RouteWindow), want)
	bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
	require.NoError(t, err)
	tr.fill(t, s, rank, bufs)
	r, err := y.Exchange(bufs)
	require.NoError(t, err)
	tr.verify(t, s, rank, size, r)
	require.EqualValues(t, want, y.Stats().Routes[RouteWindow].Messages)
	freeBoth(t, r, bufs)
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
	var kept, sent map[int]*ipcwin.Notice
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
		freeBoth(t, r, bufs)
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
		freeAll(t, bufs)
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
			freeBoth(t, r, bufs)
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
						require.NotErrorIs(t, err, ErrPeerAborted, "rank 0's own copies failed: %v", err)
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
				freeAll(t, bufs)
			}
		})
	}
}

// TestReadPeers: under mpirun on one node, ranks exchanging host memory
// read each other's messages (docs/WIRE.md, rule 10), from send buffers
// of any allocator, device memory included (copied to host memory first);
// with TransportMPI nobody does, and says why.
func TestReadPeers(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	for _, tc := range []struct {
		name      string
		transport Transport
		sendOn    string // "host", or "cuda" for device send buffers
	}{
		{"auto", TransportAuto, "host"},
		{"auto, device send buffers", TransportAuto, "cuda"},
		{"mpi", TransportMPI, "host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
			sa := a
			if tc.sendOn == "cuda" {
				if fakeCUDA.path == "" && fakeCUDA.why != "" {
					t.Skipf("no CUDA runtime: %s", fakeCUDA.why)
				}
				sa = variant{name: "cuda", kind: devalloc.BackendCUDA}.open(t)
			}
			x := newExchanger(t, Options{Comm: comm, Alloc: a, Transport: tc.transport, PayloadChecksum: true})
			peers := peersOn(x, RouteRead)
			_, why := x.Routes()
			if tc.transport == TransportMPI || comm.Local().Size() < 2 {
				require.Empty(t, peers)
				require.NotEmpty(t, why)
			} else {
				require.Len(t, peers, comm.Local().Size()-1, "every other rank of this node: %s", why)
			}
			tr := traffic{seed: 77, density: 1, maxBlocks: 30, dims: []int{1, 4, 9}, dtypes: mixedTypes}
			for it := range uint64(3) {
				tr.iter = it
				bufs, err := AllocSend(sa, tr.plan(t, rank, size), sa.DefaultStream())
				require.NoError(t, err)
				tr.fill(t, sa.DefaultStream(), rank, bufs)
				before := x.Stats()
				r, err := x.Exchange(bufs)
				require.NoError(t, err)
				tr.verify(t, a.DefaultStream(), rank, size, r)
				after := x.Stats()
				require.EqualValues(t, len(peers), after.Routes[RouteRead].Messages-before.Routes[RouteRead].Messages, "one read message per peer")
				if len(peers) > 0 {
					require.Less(t, after.MPIBytes-before.MPIBytes, after.Bytes-before.Bytes, "MPI carries only the read notices of their bytes")
				} else {
					require.Equal(t, after.MPIBytes-before.MPIBytes, after.Bytes-before.Bytes, "MPI carries every byte to the peers")
				}
				freeBoth(t, r, bufs)
			}
		})
	}
}

// TestReadPeersHoldSendBuffers: a sender's buffer stays held until its
// readers are done. Every rank frees its send buffers as soon as its
// notices are out and at once writes over memory of their sizes, while its
// peers read only 20 ms later: what they read must still be the message.
func TestReadPeersHoldSendBuffers(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	x := newExchanger(t, Options{Comm: comm, Alloc: a})
	if _, why := x.Routes(); len(peersOn(x, RouteRead)) == 0 {
		if comm.Local().Size() > 1 {
			t.Fatalf("no read peers: %s", why)
		}
		t.Skip("a rank alone on its node reads nobody")
	}
	tr := traffic{seed: 78, density: 1, maxBlocks: 60, dims: []int{8, 16}, dtypes: []packing.DType{packing.Float64}}
	var bufs []*packing.Coalesced
	reads := x.routes[(rank+1)%size]
	x.fault(func(r *faultyRoute) {
		r.beforeRead = func(int) { time.Sleep(20 * time.Millisecond) }
		if r.route != reads {
			return
		}
		r.onWaited = func(*exchange) {
			s := a.DefaultStream()
			for _, b := range bufs {
				n := b.Buffer().Size()
				require.NoError(t, b.Free())
				junk, err := a.Alloc(n, s)
				require.NoError(t, err)
				require.NoError(t, s.Memset(junk, 0, n, 0xa5))
				require.NoError(t, s.Synchronize())
				require.NoError(t, junk.Free())
			}
		}
	})
	for it := range uint64(3) {
		tr.iter = it
		var err error
		bufs, err = AllocSend(a, tr.plan(t, rank, size), a.DefaultStream())
		require.NoError(t, err)
		tr.fill(t, a.DefaultStream(), rank, bufs)
		r, err := x.Exchange(bufs)
		require.NoError(t, err)
		tr.verify(t, a.DefaultStream(), rank, size, r)
		require.NoError(t, r.Free())
	}
}

// TestNCCLExchange runs exchanges GPU to GPU through NCCL: random
// sparsity with every block checked, a learned pattern, and messages larger
// than one NCCL transfer. It needs one GPU per rank (mpirun on a node with
// as many GPUs as ranks); elsewhere it skips, saying why.
func TestNCCLExchange(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	a, x := ncclExchanger(t, comm, devalloc.Config{})
	s := a.DefaultStream()
	for it := range 3 {
		tr := traffic{seed: 300 + uint64(it), density: 0.7, maxBlocks: 200, dims: []int{1, 2, 5, 8, 16}, dtypes: mixedTypes}
		bufs := sendAll(t, a, tr, rank, size)
		r, err := x.Exchange(bufs)
		require.NoError(t, err)
		tr.verify(t, s, rank, size, r)
		require.NoError(t, r.Free())
	}
	st := x.Stats()
	require.Positive(t, st.NCCLTransfers)
	require.Zero(t, st.MPISends, "nothing but counts goes through MPI")
	require.Zero(t, st.BytesStaged)

	// A learned pattern, its contents changing every sweep.
	pat := x.NewPattern()
	tr := traffic{seed: 77, density: 0.8, maxBlocks: 100, dims: []int{2, 4, 8}, dtypes: mixedTypes}
	bufs := sendAll(t, a, tr, rank, size)
	for it := range 4 {
		tr.iter = uint64(it)
		r := exchangeVerified(t, pat.Exchange, s, tr, rank, size, bufs)
		require.NoError(t, r.Free())
	}
	require.True(t, pat.Learned())

	// Joined send buffers: every destination's message is a part of one
	// allocation, and every manifest is written before a send holds it.
	jtr := traffic{seed: 91, density: 1, maxBlocks: 80, dims: []int{1, 3, 8}, dtypes: mixedTypes}
	joinedPlan, err := JoinSend(jtr.plan(t, rank, size))
	require.NoError(t, err)
	for it := range 2 {
		joined, err := packing.Alloc(a, joinedPlan, s)
		require.NoError(t, err)
		parts, err := joined.Parts()
		require.NoError(t, err)
		jtr.fill(t, s, rank, parts)
		r, err := x.Exchange(parts)
		require.NoError(t, err, "joined send buffers, iteration %d", it)
		jtr.verify(t, s, rank, size, r)
		require.NoError(t, r.Free())
		require.NoError(t, joined.Free())
	}

	// 80 MiB to the next rank: two NCCL transfers of one message.
	big := traffic{seed: 5, density: 1, maxBlocks: 1, dims: []int{2048, 5120}, dtypes: []packing.DType{packing.Float64}}
	descs := []packing.Desc{{ID: 1, DType: packing.Float64, Rows: 2048, Cols: 5120, Dest: (rank + 1) % size}}
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	bb, err := AllocSend(a, p, s)
	require.NoError(t, err)
	t.Cleanup(func() {
		freeAll(t, bb)
	})
	big.fill(t, s, rank, bb)
	before := x.Stats().NCCLTransfers
	r, err := x.Exchange(bb)
	require.NoError(t, err)
	from := (rank - 1 + size) % size
	c := r.From(from)
	require.NotNil(t, c)
	got := readBlocks(t, s, c)
	require.Equal(t, string(big.content(from, 1, 2048*5120*8)), string(got[1]), "the 80 MiB block from rank %d", from)
	require.NoError(t, r.Free())
	if size > 1 {
		require.EqualValues(t, 2, x.Stats().NCCLTransfers-before)
	}
}

// ncclExchanger opens this rank's GPU (by node-local rank, as ranktest
// places them) under conf and an exchanger on the NCCL transport, or skips
// the test saying why it cannot.
func ncclExchanger(t *testing.T, comm *cluster.Comm, conf devalloc.Config) (*devalloc.Allocator, *Exchanger) {
	t.Helper()
	if fakeCUDA.path != "" {
		t.Skip("the fake libcudart has no NCCL")
	}
	n, err := devalloc.DeviceCount()
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: the runtime reports no device", gputest.ErrAbsent)
	}
	if err != nil {
		gputest.Unavailable(t, "a CUDA device", err)
	}
	dev, err := comm.Device(n)
	require.NoError(t, err)
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Device: dev, Config: &conf, Warn: func(m string) { t.Log(m) }})
	if err != nil {
		gputest.Unavailable(t, "the CUDA backend", err)
	}
	t.Cleanup(func() {
		require.NoError(t, a.Sync())
		require.NoError(t, a.Close(), "no buffer may leak")
	})
	x := newExchanger(t, Options{Comm: comm, Alloc: a, Transport: TransportNCCL, PayloadChecksum: true})
	if _, nccl := x.tr.(*ncclTransport); !nccl {
		_, why := x.Routes()
		t.Skipf("no NCCL: %s", why)
	}
	return a, x
}

// TestNCCLPinnedSend sends blocks that Go code wrote into pinned memory:
// under NCCL each message is copied to the device first, then sent.
func TestNCCLPinnedSend(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	a, x := ncclExchanger(t, comm, devalloc.Config{})
	s := a.DefaultStream()
	tr := traffic{seed: 41, density: 0.8, maxBlocks: 60, dims: []int{1, 3, 8}, dtypes: mixedTypes}
	p := tr.plan(t, rank, size)
	var bufs []*packing.Coalesced
	t.Cleanup(func() {
		freeAll(t, bufs)
	})
	for g, grp := range p.Groups() {
		pre, err := SendPrefix(p, g)
		require.NoError(t, err)
		buf, err := a.AllocPinned(pre+max(grp.Bytes, 1), s)
		require.NoError(t, err)
		c, err := packing.Wrap(buf, pre, p, g, nil)
		require.NoError(t, err)
		require.True(t, c.Buffer().Location().HostAccessible())
		bufs = append(bufs, c)
	}
	tr.fill(t, s, rank, bufs)
	for range 2 { // the second time, the prefixes already hold the manifests
		r, err := x.Exchange(bufs)
		require.NoError(t, err)
		tr.verify(t, s, rank, size, r)
		require.NoError(t, r.Free())
	}
	require.Positive(t, x.Stats().NCCLTransfers)
}

// TestNCCLReceiverOutOfMemoryDrains: a receiver whose budget cannot hold an
// announced message takes it into the exchanger's drain buffer, so that the
// sender's NCCL group completes; the receiver reports the allocation
// failure naming the sender, and the next exchange works on both sides.
func TestNCCLReceiverOutOfMemoryDrains(t *testing.T) {
	comm := world(t)
	rank, size := comm.Rank(), comm.Size()
	if size < 2 {
		t.Skip("needs two ranks")
	}
	conf := devalloc.Config{}
	if rank == 1 {
		// The drain buffer and a little more: not the 16 MiB message.
		conf.Limit = ncclChunk + 4<<20
	}
	a, x := ncclExchanger(t, comm, conf)
	starveReceiver(t, a, x, rank, 2048, 1024) // 16 MiB
	if rank == 1 {
		require.EqualValues(t, 1, x.Stats().Drained, "the message from rank 0, one piece into the drain buffer")
	}

	// The communicator and the drain buffer serve the next exchange.
	tr := traffic{seed: 9, density: 1, maxBlocks: 20, dims: []int{2, 4}, dtypes: mixedTypes}
	next := sendAll(t, a, tr, rank, size)
	r, err := x.Exchange(next)
	require.NoError(t, err)
	tr.verify(t, a.DefaultStream(), rank, size, r)
	require.NoError(t, r.Free())
}
