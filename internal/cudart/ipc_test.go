//go:build cgo

package cudart_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/stretchr/testify/require"
)

// ipcDevice returns device 0 of machineOrFake's runtime, which has the
// IPC functions.
func ipcDevice(t *testing.T) (*cudart.Device, bool) {
	t.Helper()
	rt, real := machineOrFake(t)
	require.True(t, rt.Capabilities().IPC, "the cudaIpc* functions")
	return rt.Device(0), real
}

// TestIPCInOneProcess: what the runtime refuses without a second process.
func TestIPCInOneProcess(t *testing.T) {
	d, real := ipcDevice(t)
	p, err := d.Malloc(1 << 20)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(p)) }()
	for _, at := range []uintptr{p, p + 4096, p + 1<<20 - 1} {
		base, size, err := d.AddressRange(at)
		require.NoError(t, err)
		require.Equal(t, p, base, "the allocation holding %#x", at)
		require.GreaterOrEqual(t, size, int64(1<<20))
	}
	h, err := d.IpcGetMemHandle(p)
	require.NoError(t, err)
	require.NotEqual(t, cudart.IpcMemHandle{}, h)
	again, err := d.IpcGetMemHandle(p)
	require.NoError(t, err)
	require.Equal(t, h, again, "a handle may be taken again")

	var ce *cudart.Error
	_, err = d.IpcOpenMemHandle(h)
	require.ErrorAs(t, err, &ce, "a process cannot open its own memory handle")
	require.Equal(t, "cudaErrorDeviceUninitialized", ce.Name)
	require.Equal(t, "cudaIpcOpenMemHandle", ce.Op)

	_, err = d.IpcOpenMemHandle(cudart.IpcMemHandle{1, 2, 3})
	require.ErrorAs(t, err, &ce, "a handle of nothing")
	_, err = d.IpcOpenMemHandleFlags(h, 0x2)
	require.ErrorAs(t, err, &ce, "flags other than cudaIpcMemLazyEnablePeerAccess")
	if !real {
		require.Equal(t, "cudaErrorInvalidValue", ce.Name, "the flags are checked first")
	}
	require.ErrorAs(t, d.IpcCloseMemHandle(p), &ce, "memory that was not opened from a handle")

	// Pool memory cannot be exported this way.
	s, err := d.StreamCreate()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()
	pool, err := d.MemPoolCreate()
	require.NoError(t, err)
	q, err := d.MallocFromPoolAsync(4096, pool, s)
	require.NoError(t, err)
	_, err = d.IpcGetMemHandle(q)
	require.ErrorAs(t, err, &ce, "pool memory")
	require.NoError(t, d.FreeAsync(q, s))
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.MemPoolDestroy(pool))

	// An event made without cudaEventInterprocess has no handle.
	plain, err := d.EventCreate()
	require.NoError(t, err)
	_, err = d.IpcGetEventHandle(plain)
	require.ErrorAs(t, err, &ce)
	if real {
		t.Logf("cudaIpcGetEventHandle of an event without cudaEventInterprocess: %v", err)
	} else {
		require.Equal(t, "cudaErrorInvalidResourceHandle", ce.Name)
	}
	require.NoError(t, d.EventDestroy(plain))

	ev, err := d.EventCreateInterprocess()
	require.NoError(t, err)
	eh, err := d.IpcGetEventHandle(ev)
	require.NoError(t, err)
	other, err := d.IpcOpenEventHandle(eh)
	if real {
		// The runtime's documentation does not say; record what it does.
		t.Logf("cudaIpcOpenEventHandle in the exporting process: %v", err)
		if err == nil {
			require.NoError(t, d.EventDestroy(other))
		}
	} else {
		require.ErrorAs(t, err, &ce, "the fake refuses its own event handle, like its own memory handle")
		require.Equal(t, "cudaErrorDeviceUninitialized", ce.Name)
	}
	// Recorded and waited on in its own process, it behaves as any event.
	require.NoError(t, d.EventRecord(ev, s))
	require.NoError(t, d.StreamWaitEvent(s, ev))
	require.NoError(t, d.EventSynchronize(ev))
	done, err := d.EventQuery(ev)
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, d.EventDestroy(ev))
}

// The child's side of TestIPCTwoProcesses reads its handles from this
// variable and talks to the parent on stdin and stdout.
const envIPCChild = "DISTBUF_TEST_IPC_CHILD"

const ipcBytes = 4 << 20

// TestIPCTwoProcesses shares memory and events between this process and a
// child (this test binary again): the child opens the parent's memory and
// event, and its stream waits for work the parent holds back; then the child
// writes through the opened memory and records the event, and the parent's
// stream waits for that record before reading what the child wrote.
func TestIPCTwoProcesses(t *testing.T) {
	if arg := os.Getenv(envIPCChild); arg != "" {
		ipcChild(t, arg)
		return
	}
	d, _ := ipcDevice(t)
	s, err := d.StreamCreate()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()
	p, err := d.Malloc(ipcBytes)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(p)) }()
	require.NoError(t, d.CopyToDevice(p, make([]byte, ipcBytes)))
	ev, err := d.EventCreateInterprocess()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.EventDestroy(ev)) }()
	// A handle of memory freed before the child looks at it.
	gone, err := d.Malloc(4096)
	require.NoError(t, err)
	goneHandle, err := d.IpcGetMemHandle(gone)
	require.NoError(t, err)
	require.NoError(t, d.Free(gone))

	// The gate: the parent's stream fills p and records ev only once the
	// parent sets a mapped host word, after the child has queued its wait.
	word, err := d.HostAlloc(64, cudart.HostAllocPortable|cudart.HostAllocMapped)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreeHost(word)) }()
	atomic.StoreUint32((*uint32)(word), 0)
	wordDev, err := d.HostDevicePointer(word)
	require.NoError(t, err)
	// However the test ends, the gate opens before the stream and the
	// memory go (their release waits for the stream).
	defer atomic.StoreUint32((*uint32)(word), 1)
	require.NoError(t, d.StreamWaitValueGEQ(s, wordDev, 1))
	require.NoError(t, d.MemsetAsync(p, 0xAB, ipcBytes, s))
	require.NoError(t, d.EventRecord(ev, s))

	mh, err := d.IpcGetMemHandle(p)
	require.NoError(t, err)
	eh, err := d.IpcGetEventHandle(ev)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestIPCTwoProcesses$", "-test.count=1", "-test.v", "-test.timeout=90s")
	cmd.Env = append(os.Environ(), envIPCChild+"="+hex.EncodeToString(mh[:])+":"+hex.EncodeToString(eh[:])+":"+hex.EncodeToString(goneHandle[:]))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer // written by exec's goroutine while the child runs
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var out strings.Builder
	lines := bufio.NewScanner(io.TeeReader(stdout, &out))
	expect := func(want string) {
		t.Helper()
		for lines.Scan() {
			if line := lines.Text(); strings.HasPrefix(line, "ipc-child: ") {
				require.Equal(t, "ipc-child: "+want, line, "child output:\n%s\n%s", out.String(), stderr.String())
				return
			}
		}
		_ = cmd.Wait()
		t.Fatalf("the child ended before %q:\n%s\n%s", want, out.String(), stderr.String())
	}

	expect("waiting")
	// The child's stream waits on ev, which the parent's stream has not
	// reached: release it now.
	atomic.StoreUint32((*uint32)(word), 1)
	_, err = io.WriteString(stdin, "go\n")
	require.NoError(t, err)
	expect("written")
	// The child wrote 0xCD through its mapping and recorded ev after it:
	// the parent's stream waits for that record, then reads.
	host, err := d.HostAlloc(ipcBytes, cudart.HostAllocPortable)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreeHost(host)) }()
	require.NoError(t, d.StreamWaitEvent(s, ev))
	require.NoError(t, d.MemcpyAsync(uintptr(host), p, ipcBytes, s))
	require.NoError(t, d.StreamSynchronize(s))
	got := unsafe.Slice((*byte)(host), ipcBytes)
	require.True(t, bytes.Equal(bytes.Repeat([]byte{0xCD}, ipcBytes), got), "the parent sees what the child wrote")
	_, err = io.WriteString(stdin, "done\n")
	require.NoError(t, err)
	expect("closed")
	require.NoError(t, cmd.Wait(), "child output:\n%s\n%s", out.String(), stderr.String())
	t.Logf("child:\n%s", out.String())
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ipcChild is the child's side of TestIPCTwoProcesses.
func ipcChild(t *testing.T, arg string) {
	parts := strings.Split(arg, ":")
	require.Len(t, parts, 3)
	var mh, gone cudart.IpcMemHandle
	var eh cudart.IpcEventHandle
	for i, dst := range [][]byte{mh[:], eh[:], gone[:]} {
		b, err := hex.DecodeString(parts[i])
		require.NoError(t, err)
		require.Len(t, b, len(dst))
		copy(dst, b)
	}
	say := func(s string) { fmt.Printf("ipc-child: %s\n", s) }
	in := bufio.NewScanner(os.Stdin)
	hear := func(want string) {
		require.True(t, in.Scan(), "the parent went away")
		require.Equal(t, want, in.Text())
	}

	rt, err := cudart.Load()
	require.NoError(t, err)
	d := rt.Device(0)
	var ce *cudart.Error
	_, err = d.IpcOpenMemHandle(gone)
	require.ErrorAs(t, err, &ce, "a handle of freed memory")
	t.Logf("opening a handle of freed memory: %v", err)

	start := time.Now()
	peer, err := d.IpcOpenMemHandle(mh)
	require.NoError(t, err)
	t.Logf("cudaIpcOpenMemHandle took %v", time.Since(start))
	base, size, err := d.AddressRange(peer + 100)
	require.NoError(t, err)
	require.Equal(t, peer, base, "the opened memory is one allocation")
	require.GreaterOrEqual(t, size, int64(ipcBytes), "as large as the exporter's, whatever a peer might claim")
	again, err := d.IpcOpenMemHandle(mh)
	require.NoError(t, err)
	require.Equal(t, peer, again, "opening a handle again returns the same address")
	require.NoError(t, d.IpcCloseMemHandle(again), "and counts a reference")
	pev, err := d.IpcOpenEventHandle(eh)
	require.NoError(t, err)

	s, err := d.StreamCreate()
	require.NoError(t, err)
	local, err := d.Malloc(ipcBytes)
	require.NoError(t, err)
	mine, err := d.EventCreate()
	require.NoError(t, err)
	require.NoError(t, d.StreamWaitEvent(s, pev))
	require.NoError(t, d.MemcpyAsync(local, peer, ipcBytes, s))
	require.NoError(t, d.EventRecord(mine, s))
	time.Sleep(50 * time.Millisecond)
	done, err := d.EventQuery(mine)
	require.NoError(t, err)
	require.False(t, done, "the copy ran before the parent's event was reached")
	say("waiting")

	hear("go")
	require.NoError(t, d.StreamSynchronize(s))
	got := make([]byte, ipcBytes)
	require.NoError(t, d.CopyFromDevice(got, local))
	require.True(t, bytes.Equal(bytes.Repeat([]byte{0xAB}, ipcBytes), got), "the child copied what the parent's stream wrote")

	// Write back through the mapping, then record the parent's event.
	require.NoError(t, d.MemsetAsync(local, 0xCD, ipcBytes, s))
	require.NoError(t, d.MemcpyAsync(peer, local, ipcBytes, s))
	require.NoError(t, d.EventRecord(pev, s))
	say("written")

	hear("done")
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.EventDestroy(pev))
	require.NoError(t, d.EventDestroy(mine))
	require.NoError(t, d.IpcCloseMemHandle(peer))
	require.ErrorAs(t, d.IpcCloseMemHandle(peer), &ce, "closed with its last reference")
	require.NoError(t, d.Free(local))
	require.NoError(t, d.StreamDestroy(s))
	say("closed")
}
