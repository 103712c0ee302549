//go:build cgo

package nccl

import (
	"bytes"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/stretchr/testify/require"
)

// loadOrSkip loads NCCL, an optional library: its absence is a skip with
// the reason even on the GPU machine, where DISTBUF_NCCL names it.
func loadOrSkip(t *testing.T) (*Lib, *cudart.Device) {
	t.Helper()
	rt, err := cudart.Load()
	if err != nil {
		gputest.Unavailable(t, "the CUDA runtime", err)
	}
	l, err := Load()
	if err != nil {
		t.Skipf("NCCL unavailable (set %s to its libnccl.so.2): %v", EnvNCCL, err)
	}
	return l, rt.Device(0)
}

// A one-rank communicator sends a device buffer to itself.
func TestSelfSendRecv(t *testing.T) {
	l, d := loadOrSkip(t)
	v, err := l.Version()
	require.NoError(t, err)
	t.Logf("%s, version %d", l.Library(), v)
	id, err := l.UniqueID()
	require.NoError(t, err)
	_, err = l.NewComm(id[:10], 1, 0, 0)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = l.NewComm(id, 1, 1, 0)
	require.ErrorIs(t, err, ErrInvalid)
	c, err := l.NewComm(id, 1, 0, 0)
	require.NoError(t, err)
	const n = 1 << 20
	src := gputest.DeviceMemory(t, d, n)
	dst := gputest.DeviceMemory(t, d, n)
	data := bytes.Repeat([]byte{1, 2, 3, 5, 8, 13, 21, 34}, n/8)
	require.NoError(t, d.CopyToDevice(src, data))
	require.NoError(t, c.SendRecv(0, []Transfer{{Addr: src, Bytes: n, Peer: 0}}, []Transfer{{Addr: dst, Bytes: n, Peer: 0}}))
	require.NoError(t, d.Synchronize())
	got := make([]byte, n)
	require.NoError(t, d.CopyFromDevice(got, dst))
	require.Equal(t, data, got)
	require.ErrorIs(t, c.SendRecv(0, []Transfer{{Addr: src, Bytes: -1}}, nil), ErrInvalid)
	require.NoError(t, c.SendRecv(0, nil, nil), "a rank with nothing to move still takes part in the group")
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Close(), ErrInvalid)
	require.ErrorIs(t, c.SendRecv(0, nil, nil), ErrInvalid)
}

func TestLoadMissing(t *testing.T) {
	if loaded.Done() {
		t.Skip("NCCL already loaded in this process")
	}
	t.Setenv(EnvNCCL, "libnccl-does-not-exist.so.9")
	_, err := Load()
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "libnccl-does-not-exist.so.9")
}
