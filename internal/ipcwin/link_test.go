package ipcwin

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/alloctest"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// TestMain runs the tests on the real CUDA libraries when a GPU is there,
// and on the fakes otherwise (whose IPC works between and within
// processes).
func TestMain(m *testing.M) { cudarttest.Main(m) }

// newLink opens a CUDA allocator and a link on its device, freed at the
// end of the test.
func newLink(t *testing.T) (*Link, *devalloc.Allocator) {
	t.Helper()
	a := alloctest.OpenCUDA(t)
	rt, err := cudart.Load()
	require.NoError(t, err)
	if caps := rt.Capabilities(); !caps.IPC || !caps.AddressRange {
		t.Skip("the CUDA runtime lacks the interprocess functions")
	}
	l, err := New(rt.Device(a.Info().Device))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, l.CloseImports())
		require.NoError(t, l.Free())
		alloctest.CloseClean(t, a)
	})
	return l, a
}

// TestWindowGrows: a window is made when first needed, kept while the
// messages fit, and replaced by a larger one of the next generation when
// they do not, at least doubling.
func TestWindowGrows(t *testing.T) {
	l, a := newLink(t)
	s := cudart.Stream(a.DefaultStream().Handle())
	sync := a.DefaultStream().Synchronize
	require.NoError(t, l.Reserve(s, sync, 0))
	ptr, _, gen, _ := l.Window()
	require.Zero(t, ptr, "nothing to place, no window")
	require.Zero(t, gen)
	require.NoError(t, l.Reserve(s, sync, 1000))
	ptr, size, gen, _ := l.Window()
	require.NotZero(t, ptr)
	require.EqualValues(t, MinWindow, size)
	require.EqualValues(t, 1, gen)
	require.NoError(t, l.Reserve(s, sync, MinWindow))
	_, _, gen, _ = l.Window()
	require.EqualValues(t, 1, gen, "fits: the same window")
	require.NoError(t, l.Reserve(s, sync, MinWindow+1))
	ptr2, size, gen, _ := l.Window()
	require.EqualValues(t, 2, gen)
	require.GreaterOrEqual(t, size, int64(2*MinWindow))
	require.NotEqual(t, ptr, ptr2)
	require.Equal(t, []uintptr{ptr}, l.retired, "the old window stays allocated: a peer may hold it open")
}

// TestOpenPeerWindow: a peer's window opens from its handle, once per
// generation, in another process (CUDA opens no handle of its own
// process): the data this process's copy batch puts into its window is
// what the other reads, after this process's ready event; an earlier
// generation than one seen, or a handle that names nothing, is a PeerError
// naming the notice's field.
func TestOpenPeerWindow(t *testing.T) {
	if os.Getenv(envChild) != "" {
		return // the child's part is TestOpenPeerWindowChild
	}
	own, a := newLink(t)
	ready, consumed, err := own.EventHandles()
	require.NoError(t, err)
	s := a.DefaultStream()
	cs := cudart.Stream(s.Handle())
	require.NoError(t, own.Reserve(cs, s.Synchronize, 4096))
	win, size, gen, handle := own.Window()

	src, err := a.AllocPinned(4096, s)
	require.NoError(t, err)
	defer func() { require.NoError(t, src.Free()) }()
	data := bytes.Repeat([]byte("window"), 600)
	alloctest.WriteAll(t, s, src, append(data, make([]byte, 4096-len(data))...))
	srcAddr, _, _, err := src.Region()
	require.NoError(t, err)
	rd, err := src.Read(s)
	require.NoError(t, err)
	own.Into.Access(rd)
	own.Into.Add(win+256, srcAddr, int64(len(data)))
	require.NoError(t, own.Flush(&own.Into, s))
	require.NoError(t, own.Ready(cs))
	require.Zero(t, own.Into.Len(), "a flush empties the batch")

	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenPeerWindowChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+strings.Join([]string{
		hex.EncodeToString(handle[:]), hex.EncodeToString(ready[:]), hex.EncodeToString(consumed[:]),
		strconv.FormatUint(gen, 10), strconv.FormatInt(size, 10), strconv.Itoa(len(data)),
	}, ","))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child: %s", out)
	require.Contains(t, string(out), "read "+hex.EncodeToString(data[:64]))
}

const envChild = "IPCWIN_TEST_CHILD"

// TestOpenPeerWindowChild is TestOpenPeerWindow's other process.
func TestOpenPeerWindowChild(t *testing.T) {
	args := strings.Split(os.Getenv(envChild), ",")
	if len(args) != 6 {
		t.Skip("run by TestOpenPeerWindow")
	}
	var handle cudart.IpcMemHandle
	var ready, consumed cudart.IpcEventHandle
	for i, h := range [][]byte{handle[:], ready[:], consumed[:]} {
		b, err := hex.DecodeString(args[i])
		require.NoError(t, err)
		copy(h, b)
	}
	gen, _ := strconv.ParseUint(args[3], 10, 64)
	size, _ := strconv.ParseUint(args[4], 10, 64)
	n, _ := strconv.Atoi(args[5])
	peer, a := newLink(t)
	peer.AddPeer(0, ready, consumed)
	s := a.DefaultStream()
	cs := cudart.Stream(s.Handle())
	ptr, opened, err := peer.Open(0, gen, size, handle, s.Synchronize)
	require.NoError(t, err)
	require.GreaterOrEqual(t, opened, int64(4096))
	again, _, err := peer.Open(0, gen, size, handle, s.Synchronize)
	require.NoError(t, err)
	require.Equal(t, ptr, again, "opened once per generation")
	require.NoError(t, peer.WaitReady(0, cs))
	dst, err := a.AllocPinned(4096, s)
	require.NoError(t, err)
	defer func() { require.NoError(t, dst.Free()) }()
	dstAddr, _, _, err := dst.Region()
	require.NoError(t, err)
	wr, err := dst.Write(s)
	require.NoError(t, err)
	peer.From.Access(wr)
	peer.From.Add(dstAddr, ptr+256, int64(n))
	require.NoError(t, peer.Flush(&peer.From, s))
	require.NoError(t, peer.Consumed(cs))
	got := alloctest.ReadAll(t, s, dst)
	fmt.Println("read", hex.EncodeToString(got[:64]))

	_, _, err = peer.Open(0, gen-1, size, handle, s.Synchronize)
	var pe *PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "ipc_generation", pe.Field)
	_, _, err = peer.Open(0, gen+1, size, cudart.IpcMemHandle{1, 2, 3}, s.Synchronize)
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "ipc_handle", pe.Field)
	_, _, err = peer.Open(7, gen, size, handle, s.Synchronize)
	require.Error(t, err, "rank 7 is no peer")
}

// TestBatchWithoutKernel: where the gather kernel cannot load (a runtime
// without library kernels), a batch meant for it goes to one
// cudaMemcpyBatchAsync instead, the copies land, and later batches skip the
// kernel.
func TestBatchWithoutKernel(t *testing.T) {
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t, "FAKE_NO_KERNELS"))
	l, a := newLink(t)
	s := a.DefaultStream()
	src, err := a.Alloc(512, s)
	require.NoError(t, err)
	dst, err := a.Alloc(512, s)
	require.NoError(t, err)
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5}, 100)
	alloctest.WriteAll(t, s, src, append(data, make([]byte, 12)...))
	srcAddr, _, _, err := src.Region()
	require.NoError(t, err)
	dstAddr, _, _, err := dst.Region()
	require.NoError(t, err)
	l.Kernel = true // as under MPS
	for round := range 2 {
		var b Batch
		b.Add(dstAddr, srcAddr, 200)
		b.Add(dstAddr+200, srcAddr+200, 300)
		before := cudart.Calls()
		require.NoError(t, l.Flush(&b, s))
		calls := cudart.Calls().Sub(before)
		require.False(t, l.Kernel, "round %d: the kernel is not tried again", round)
		require.EqualValues(t, 1, calls["cudaMemcpyBatchAsync"], "round %d: %v", round, calls)
		require.Zero(t, calls["cudaLaunchKernel"], "round %d: %v", round, calls)
	}
	got := alloctest.ReadAll(t, s, dst)
	require.Equal(t, data, got[:500])
	require.NoError(t, src.Free())
	require.NoError(t, dst.Free())
}

// TestBatchUndo: a message's copies and accesses dropped after a failure
// of its own leave the batch as it was before them.
func TestBatchUndo(t *testing.T) {
	_, a := newLink(t)
	s := a.DefaultStream()
	buf, err := a.AllocPinned(64, s)
	require.NoError(t, err)
	var b Batch
	b.Add(1, 2, 3)
	at := b.Mark()
	rd, err := buf.Read(s)
	require.NoError(t, err)
	b.Access(rd)
	b.Add(4, 5, 6)
	require.Equal(t, 2, b.Len())
	require.NoError(t, b.Undo(at))
	require.Equal(t, 1, b.Len())
	require.NoError(t, b.Drop())
	require.Zero(t, b.Len())
	require.NoError(t, buf.Free(), "the dropped access ended")
}

// TestNotices: a notice buffer kept for a peer serves its next notice when
// large enough, and is replaced when not; the buffers are the link's own
// pinned memory, not its allocator's; Free frees what is kept.
func TestNotices(t *testing.T) {
	l, a := newLink(t)
	k := &l.Notices
	live := a.Stats().LiveBuffers
	b, err := k.Sent(3, 100)
	require.NoError(t, err)
	copy(b.Bytes(), "a notice")
	require.NoError(t, b.KeepSent(3))
	require.NoError(t, l.Ready(cudart.Stream(a.DefaultStream().Handle())))
	again, err := k.Sent(3, 64)
	require.NoError(t, err)
	require.Same(t, b, again, "kept and large enough: reused")
	require.Equal(t, "a notice", string(again.Bytes()[:8]))
	require.NoError(t, again.KeepSent(3))
	bigger, err := k.Sent(3, 1<<20)
	require.NoError(t, err)
	require.NotSame(t, b, bigger)
	require.NoError(t, bigger.KeepSent(3))
	r, err := k.Received(5, 10)
	require.NoError(t, err)
	require.NoError(t, r.KeepReceived(5))
	sent, received := k.Buffers()
	require.Len(t, sent, 1)
	require.Len(t, received, 1)
	require.Equal(t, live, a.Stats().LiveBuffers, "the notices are not the allocator's")
	extra, err := k.Received(6, 10)
	require.NoError(t, err)
	require.NoError(t, extra.Drop())
}
