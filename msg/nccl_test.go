package msg

import (
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// Without device memory there is no NCCL: the exchanger says why and runs
// as TransportAuto.
func TestNCCLTransportFallsBack(t *testing.T) {
	comm := world(t)
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	x := newExchanger(t, Options{Comm: comm, Alloc: a, Transport: TransportNCCL})
	routes, why := x.Routes()
	for p, r := range routes {
		if p != comm.Rank() {
			require.Equal(t, RouteMPI, r, "host memory through MPI, to rank %d", p)
		}
	}
	require.Equal(t, RouteSelf, routes[comm.Rank()])
	require.Contains(t, why, "not device memory")

	rank, size := comm.Rank(), comm.Size()
	traf := traffic{seed: 9, density: 1, maxBlocks: 20, dims: []int{1, 3, 8}, dtypes: []packing.DType{packing.Float32, packing.Complex128}, selfOnly: true}
	bufs, err := AllocSend(a, traf.plan(t, rank, size), a.DefaultStream())
	require.NoError(t, err)
	t.Cleanup(func() {
		freeAll(t, bufs)
	})
	traf.fill(t, a.DefaultStream(), rank, bufs)
	r, err := x.Exchange(bufs)
	require.NoError(t, err)
	traf.verify(t, a.DefaultStream(), rank, size, r)
	require.NoError(t, r.Free())
	require.Zero(t, x.Stats().NCCLTransfers)
}

func TestTransportEnv(t *testing.T) {
	comm := world(t)
	a := variant{name: "host", kind: devalloc.BackendHost}.open(t)
	t.Setenv(EnvTransport, "nccl")
	x := newExchanger(t, Options{Comm: comm, Alloc: a})
	require.Equal(t, TransportNCCL, x.o.Transport)
	t.Setenv(EnvTransport, "staged")
	y := newExchanger(t, Options{Comm: comm, Alloc: a, Transport: TransportNCCL})
	require.Equal(t, TransportNCCL, y.o.Transport, "an explicit transport wins over the environment")
	t.Setenv(EnvTransport, "carrier-pigeon")
	_, err := New(Options{Comm: comm, Alloc: a})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, EnvTransport)
	require.Equal(t, "nccl", TransportNCCL.String())
}
