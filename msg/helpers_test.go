package msg

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/distbuf/distbuf/internal/gputest"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// The tests run on the allocators DISTBUF_BACKEND names: "host" (host
// memory only), "cuda" (the real CUDA runtime, which must load), or, unset,
// the host backend and the CUDA backend, on the real runtime when
// DISTBUF_REQUIRE_GPU=1 and otherwise on the fake libcudart of
// internal/cudart (host memory behind the CUDA API, built with gcc in
// TestMain), so the staged device path runs on machines without a GPU.
var fakeCUDA struct {
	path string // the built fake library; "" when not used
	why  string // why there is no CUDA variant, if there is none
}

var requireGPU = gputest.Required

// setupCUDA decides, once per test binary, which CUDA runtime the device
// variants use. It returns a cleanup function.
func setupCUDA() func() {
	nothing := func() {}
	switch b := os.Getenv("DISTBUF_BACKEND"); {
	case b == "host":
		fakeCUDA.why = "DISTBUF_BACKEND=host"
		return nothing
	case b == "cuda" || requireGPU():
		return nothing // the real runtime
	}
	libs, cleanup, err := cudarttest.Setup()
	if err != nil {
		// The fakes could not be built (no compiler, no source): the CUDA
		// variants would silently vanish, so the binary fails instead.
		fmt.Fprintln(os.Stderr, "msg tests:", err)
		os.Exit(1)
	}
	if libs.Fake {
		fakeCUDA.path = libs.CUDART
	}
	return cleanup
}

// variant is one way of running the exchange tests: an allocator and the
// options that pick a transport.
type variant struct {
	name  string
	kind  devalloc.Backend
	aware bool // device memory handed to MPI directly (DISTBUF_MPI_CUDA_AWARE=1)
	// transport is what DISTBUF_MSG_TRANSPORT says for the test: "staged"
	// and "mpi" keep node-local ranks off the IPC windows and off reads of
	// each other's memory, "auto" lets them use them.
	transport string
}

// variants lists the variants this binary runs. The CUDA-aware one runs
// only on the fake runtime (whose device memory is host memory, so any MPI
// can move it) or with an MPI that says it is CUDA-aware.
func variants(t *testing.T) []variant {
	out := []variant{}
	if os.Getenv("DISTBUF_BACKEND") != "cuda" {
		out = append(out, variant{name: "host", kind: devalloc.BackendHost, transport: "mpi"})
		if mpiBuild {
			// Every rank of these tests shares the node: host messages
			// are read from the sender's memory.
			out = append(out, variant{name: "host-reads", kind: devalloc.BackendHost, transport: "auto"})
		}
	}
	if os.Getenv("DISTBUF_BACKEND") == "host" {
		return out
	}
	if fakeCUDA.path == "" && fakeCUDA.why != "" {
		t.Logf("no CUDA variant: %s", fakeCUDA.why)
		return out
	}
	out = append(out, variant{name: "cuda-staged", kind: devalloc.BackendCUDA, transport: "staged"})
	aware, _ := cluster.CUDAAware()
	if mpiBuild && (fakeCUDA.path != "" || aware) {
		out = append(out, variant{name: "cuda-aware", kind: devalloc.BackendCUDA, aware: true, transport: "mpi"})
	}
	if mpiBuild {
		// Every rank of these tests shares the node: device messages go
		// through CUDA IPC windows.
		out = append(out, variant{name: "cuda-ipc", kind: devalloc.BackendCUDA, transport: "auto"})
	}
	return out
}

// open opens the variant's allocator (skipping, or failing under
// DISTBUF_REQUIRE_GPU=1, when CUDA does not open) and sets the environment
// the variant needs for the test's duration.
func (v variant) open(t *testing.T) *devalloc.Allocator {
	t.Helper()
	return v.openWith(t, &devalloc.Config{})
}

// openWith is open with an allocator configuration.
func (v variant) openWith(t *testing.T, conf *devalloc.Config) *devalloc.Allocator {
	t.Helper()
	if v.kind == devalloc.BackendCUDA {
		aware := "0"
		if v.aware {
			aware = "1"
		}
		t.Setenv("DISTBUF_MPI_CUDA_AWARE", aware)
	}
	if v.transport != "" {
		t.Setenv(EnvTransport, v.transport)
	}
	a, err := devalloc.Open(devalloc.Options{Backend: v.kind, Config: conf, Warn: func(m string) { t.Log(m) }})
	if err != nil {
		if v.kind == devalloc.BackendCUDA {
			gputest.Unavailable(t, "the CUDA backend ("+v.name+")", err)
		}
		t.Skipf("%s: %v", v.name, err)
	}
	t.Cleanup(func() {
		require.NoError(t, a.Sync())
		require.NoError(t, a.Close(), "no buffer may leak")
	})
	return a
}

// world is the communicator of the tests.
func world(t *testing.T) *cluster.Comm {
	t.Helper()
	c, err := cluster.World()
	require.NoError(t, err)
	return c
}

// newExchanger makes an exchanger closed at the end of the test.
func newExchanger(t *testing.T, o Options) *Exchanger {
	t.Helper()
	x, err := New(o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, x.Close()) })
	return x
}

// traffic describes the blocks of a test exchange: which (source,
// destination) pairs talk, and how many blocks of which shapes. Both sides
// derive the same blocks from it, so a receiver knows what it must get.
type traffic struct {
	seed      uint64
	density   float64       // probability that a pair of ranks talks (self included)
	maxBlocks int           // blocks per pair: 1..maxBlocks
	dims      []int         // rows and cols are drawn from these
	srcDims   map[int][]int // a sender's own dims, in place of dims
	dtypes    []packing.DType
	iter      uint64 // changes the contents (not the layout) between exchanges
	selfOnly  bool   // every rank talks to itself only
}

func (tr traffic) pairRNG(src, dest int) *rand.Rand {
	return rand.New(rand.NewPCG(tr.seed, uint64(src)<<32|uint64(dest)))
}

// blocks are the blocks src sends to dest, in list order.
func (tr traffic) blocks(src, dest int) []packing.Desc {
	rng := tr.pairRNG(src, dest)
	if rng.Float64() >= tr.density || (tr.selfOnly && src != dest) {
		return nil
	}
	n := 1 + rng.IntN(tr.maxBlocks)
	out := make([]packing.Desc, n)
	dims := tr.dims
	if d, ok := tr.srcDims[src]; ok {
		dims = d
	}
	for k := range out {
		out[k] = packing.Desc{
			ID:    uint64(dest)<<40 | uint64(rng.IntN(1<<20))<<20 | uint64(k), // unique, not in order
			DType: tr.dtypes[rng.IntN(len(tr.dtypes))],
			Rows:  dims[rng.IntN(len(dims))],
			Cols:  dims[rng.IntN(len(dims))],
			Dest:  dest,
		}
	}
	return out
}

// content is the bytes of block id sent from src, for this iteration.
func (tr traffic) content(src int, id uint64, n int64) []byte {
	b := make([]byte, n)
	x := tr.seed ^ uint64(src)*0x9E3779B97F4A7C15 ^ id*0xBF58476D1CE4E5B9 ^ tr.iter*0x94D049BB133111EB
	for i := range b {
		if i%8 == 0 {
			x ^= x >> 31
			x *= 0xD6E8FEB86689B347
			x ^= x >> 29
		}
		b[i] = byte(x >> (8 * (i % 8)))
	}
	return b
}

// plan lays out everything rank sends.
func (tr traffic) plan(t testing.TB, rank, size int) *packing.Plan {
	var descs []packing.Desc
	for d := range size {
		descs = append(descs, tr.blocks(rank, d)...)
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	require.NoError(t, err)
	return p
}

// fill writes the iteration's contents into the send buffers, in the order
// of s.
func (tr traffic) fill(t testing.TB, s *devalloc.Stream, rank int, bufs []*packing.Coalesced) {
	for _, c := range bufs {
		src := make([][]byte, c.Len())
		for k, v := range c.All() {
			src[k] = tr.content(rank, v.Desc().ID, v.Desc().Bytes())
		}
		require.NoError(t, packing.PackHost(s, c, src))
	}
}

// verify checks every block every source sent, byte for byte.
func (tr traffic) verify(t testing.TB, s *devalloc.Stream, rank, size int, r *Received) {
	t.Helper()
	for src := range size {
		want := tr.blocks(src, rank)
		c := r.From(src)
		if len(want) == 0 {
			require.Nil(t, c, "rank %d sent nothing to %d, yet a buffer came", src, rank)
			continue
		}
		require.NotNil(t, c, "nothing received from rank %d", src)
		require.Equal(t, len(want), c.Len(), "blocks from rank %d", src)
		payload := readPayload(t, s, c)
		requireZeroPadding(t, payload, c, src)
		got := readBlocks(t, s, c)
		for _, v := range c.All() {
			require.Zero(t, v.Offset()%v.Desc().DType.Size(), "element alignment")
		}
		for _, d := range want {
			k, err := c.Position(d.ID)
			require.NoError(t, err, "block %d from rank %d", d.ID, src)
			v, err := c.View(k)
			require.NoError(t, err)
			require.Equal(t, d.DType, v.Desc().DType)
			require.Equal(t, d.Rows, v.Desc().Rows)
			require.Equal(t, d.Cols, v.Desc().Cols)
			if b := got[d.ID]; string(b) != string(tr.content(src, d.ID, d.Bytes())) {
				t.Fatalf("rank %d: block %d from rank %d differs", rank, d.ID, src)
			}
		}
	}
}

// readBlocks reads a buffer's blocks back to the host, by id.
func readBlocks(t testing.TB, s *devalloc.Stream, c *packing.Coalesced) map[uint64][]byte {
	t.Helper()
	payload := readPayload(t, s, c)
	out := make(map[uint64][]byte, c.Len())
	for _, v := range c.All() {
		out[v.Desc().ID] = payload[v.Offset() : v.Offset()+v.Desc().Bytes()]
	}
	return out
}

// readPayload reads the bytes of a buffer's blocks, padding included, back
// to the host once the work the ledger says comes first has run. Device
// memory is copied to pinned memory by the stream (not by a host function
// writing Go memory, which the race detector cannot see ordered by a CUDA
// synchronisation).
func readPayload(t testing.TB, s *devalloc.Stream, c *packing.Coalesced) []byte {
	t.Helper()
	buf := c.Buffer()
	src, off := buf, c.Start()
	if !c.Buffer().Location().HostAccessible() {
		pin, err := buf.Allocator().AllocPinned(max(c.Size(), 1), s)
		require.NoError(t, err)
		defer func() { require.NoError(t, pin.Free()) }()
		require.NoError(t, s.Copy(pin, 0, buf, c.Start(), c.Size()))
		src, off = pin, 0
	}
	h, err := src.Hold(devalloc.Read)
	require.NoError(t, err)
	defer func() { require.NoError(t, h.Release()) }()
	require.NoError(t, h.Wait())
	mem, err := src.Bytes()
	require.NoError(t, err)
	return append([]byte(nil), mem[off:off+c.Size()]...)
}

// requireZeroPadding checks that the bytes between the blocks of a
// received buffer are zero, as the sender must write them (docs/WIRE.md).
func requireZeroPadding(t testing.TB, payload []byte, c *packing.Coalesced, src int) {
	t.Helper()
	end := int64(0)
	for _, v := range c.All() { // in offset order
		for i := end; i < v.Offset(); i++ {
			if payload[i] != 0 {
				t.Fatalf("padding byte %d of the message from rank %d is %#x, not 0", i, src, payload[i])
			}
		}
		end = v.Offset() + v.Desc().Bytes()
	}
}

// wireErrorOf extracts the WireError of err, failing when there is none.
func wireErrorOf(t *testing.T, err error) *WireError {
	t.Helper()
	var w *WireError
	require.True(t, errors.As(err, &w), "want a *WireError, got %v", err)
	return w
}

func worldB() (*cluster.Comm, error) { return cluster.World() }

// sendAll allocates and fills rank's send buffers for tr.
func sendAll(t *testing.T, a *devalloc.Allocator, tr traffic, rank, size int) []*packing.Coalesced {
	t.Helper()
	s := a.DefaultStream()
	bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
	require.NoError(t, err)
	tr.fill(t, s, rank, bufs)
	t.Cleanup(func() {
		freeAll(t, bufs)
	})
	return bufs
}

// allocBare allocates every group of p without room for the manifest: send
// buffers that Exchange refuses (they are not msg.AllocSend's).
func allocBare(t *testing.T, a *devalloc.Allocator, p *packing.Plan, s *devalloc.Stream) []*packing.Coalesced {
	t.Helper()
	var out []*packing.Coalesced
	for g := range p.Groups() {
		c, err := packing.Alloc(a, p, s, packing.AllocOptions{Group: g})
		require.NoError(t, err)
		out = append(out, c)
	}
	return out
}

// freeAll frees buffers the test owns.
func freeAll(t testing.TB, bufs []*packing.Coalesced) {
	t.Helper()
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
}

// freeBoth frees what an exchange received and the buffers it sent.
func freeBoth(t testing.TB, r *Received, bufs []*packing.Coalesced) {
	t.Helper()
	require.NoError(t, r.Free())
	freeAll(t, bufs)
}

// exchanger opens the variant's allocator and an exchanger on it made with
// o, over the world, and returns them with the rank and the world's size.
func (v variant) exchanger(t *testing.T, o Options) (a *devalloc.Allocator, x *Exchanger, rank, size int) {
	t.Helper()
	a = v.open(t)
	o.Comm, o.Alloc = world(t), a
	x = newExchanger(t, o)
	return a, x, o.Comm.Rank(), o.Comm.Size()
}

// onHost is exchanger on a host allocator.
func onHost(t *testing.T, o Options) (a *devalloc.Allocator, x *Exchanger, rank, size int) {
	t.Helper()
	return variant{name: "host", kind: devalloc.BackendHost}.exchanger(t, o)
}

// exchangeVerified fills bufs for tr, exchanges them with ex, and checks
// what arrived.
func exchangeVerified(t *testing.T, ex func([]*packing.Coalesced) (*Received, error), s *devalloc.Stream, tr traffic, rank, size int, bufs []*packing.Coalesced) *Received {
	t.Helper()
	tr.fill(t, s, rank, bufs)
	r, err := ex(bufs)
	require.NoError(t, err)
	tr.verify(t, s, rank, size, r)
	return r
}
