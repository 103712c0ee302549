package peermem

import (
	"os"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestReadSelf: the read itself, on this process's own memory (a process
// may always read itself): a copy, and a fault for memory that is not
// mapped, which msg reports as the notice's read_address.
func TestReadSelf(t *testing.T) {
	if why := Unavailable(); why != "" {
		t.Skipf("this process cannot read others' memory: %s", why)
	}
	src := []byte("node-local reads copy once, in the kernel")
	dst := make([]byte, len(src))
	var pin runtime.Pinner // src's address is taken as a number: it must not move
	pin.Pin(&src[0])
	defer pin.Unpin()
	require.NoError(t, Read(os.Getpid(), unsafe.Pointer(&dst[0]), uintptr(unsafe.Pointer(&src[0])), int64(len(src))))
	require.Equal(t, src, dst)
	err := Read(os.Getpid(), unsafe.Pointer(&dst[0]), 4096, 8)
	require.True(t, IsFault(err), "the first page is never mapped: %v", err)
}

// TestProbe: a probe reads back as its value in its own process, and not
// as another value or in a process that does not exist.
func TestProbe(t *testing.T) {
	if why := Unavailable(); why != "" {
		t.Skipf("this process cannot read others' memory: %s", why)
	}
	p := NewProbe()
	defer p.Close()
	require.NotZero(t, p.Value())
	require.NoError(t, CheckProbe(os.Getpid(), p.Addr(), p.Value()))
	require.ErrorContains(t, CheckProbe(os.Getpid(), p.Addr(), p.Value()+2), "another value")
	require.Error(t, CheckProbe(0, p.Addr(), p.Value()))
}
