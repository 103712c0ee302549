//go:build mpi

package rawmpi

import (
	"os"
	"testing"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/mpitest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(mpitest.Run(m)) }

func TestExchangeWithPeer(t *testing.T) {
	w, err := cluster.World()
	require.NoError(t, err)
	if w.Size() != 2 {
		t.Skip("needs 2 ranks")
	}
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	send, err := a.Alloc(1000, a.DefaultStream())
	require.NoError(t, err)
	recv, err := a.Alloc(2000, a.DefaultStream())
	require.NoError(t, err)
	require.NoError(t, a.Sync())
	mem, _ := send.Bytes()
	for i := range mem {
		mem[i] = byte(i + w.Rank())
	}
	sa, _, _, _ := send.Region()
	ra, _, _, _ := recv.Region()
	got, err := Exchange(sa, 1000, ra, 2000, 1-w.Rank(), 5)
	require.NoError(t, err)
	require.EqualValues(t, 1000, got)
	in, _ := recv.Bytes()
	for i := range 1000 {
		require.Equal(t, byte(i+1-w.Rank()), in[i])
	}
	clear(in)
	got, err = Protocol(sa, 1000, ra, 2000, 1-w.Rank(), 6)
	require.NoError(t, err)
	require.EqualValues(t, 1000, got)
	for i := range 1000 {
		require.Equal(t, byte(i+1-w.Rank()), in[i])
	}
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
}
