//go:build mpi

package msg

import (
	"testing"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// TestReadPeers: under mpirun on one node, ranks exchanging host memory
// read each other's messages (docs/WIRE.md, rule 12), from send buffers
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
				require.EqualValues(t, len(peers), after.HostReads-before.HostReads, "one read per peer")
				require.NoError(t, r.Free())
				for _, b := range bufs {
					require.NoError(t, b.Free())
				}
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
