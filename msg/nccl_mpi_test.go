//go:build mpi

package msg

import (
	"fmt"
	"testing"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

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
		tr.fill(t, s, rank, bufs)
		r, err := pat.Exchange(bufs)
		require.NoError(t, err)
		tr.verify(t, s, rank, size, r)
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
		for _, b := range bb {
			require.NoError(t, b.Free())
		}
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
		for _, b := range bufs {
			require.NoError(t, b.Free())
		}
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

	// The communicator and the drain buffer serve the next exchange.
	tr := traffic{seed: 9, density: 1, maxBlocks: 20, dims: []int{2, 4}, dtypes: mixedTypes}
	next := sendAll(t, a, tr, rank, size)
	r, err := x.Exchange(next)
	require.NoError(t, err)
	tr.verify(t, a.DefaultStream(), rank, size, r)
	require.NoError(t, r.Free())
}
