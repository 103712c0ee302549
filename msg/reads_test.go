package msg

import (
	"os"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestReadProcessSelf: the read itself, on this process's own memory (a
// process may always read itself): a copy, and EFAULT for memory that is
// not mapped, which the exchange reports as the notice's read_address.
func TestReadProcessSelf(t *testing.T) {
	if why := peerMemWhy(); why != "" {
		t.Skipf("this process cannot read others' memory: %s", why)
	}
	src := []byte("node-local reads copy once, in the kernel")
	dst := make([]byte, len(src))
	var pin runtime.Pinner // src's address is taken as a number: it must not move
	pin.Pin(&src[0])
	defer pin.Unpin()
	require.NoError(t, readProcess(os.Getpid(), unsafe.Pointer(&dst[0]), uintptr(unsafe.Pointer(&src[0])), int64(len(src))))
	require.Equal(t, src, dst)
	err := readProcess(os.Getpid(), unsafe.Pointer(&dst[0]), 4096, 8)
	require.ErrorIs(t, err, syscall.EFAULT)
}
