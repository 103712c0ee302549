package msg

import (
	"bytes"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// TestCopyBatchWithoutKernel: where the gather kernel (internal/gather) cannot load (a
// runtime without library kernels), a batch meant for it goes to one
// cudaMemcpyBatchAsync instead, the copies land, and later batches skip the
// kernel.
func TestCopyBatchWithoutKernel(t *testing.T) {
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t, "FAKE_NO_KERNELS"))
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendCUDA, Warn: func(string) {}})
	require.NoError(t, err)
	rt, err := cudart.Load()
	require.NoError(t, err)
	s := a.DefaultStream()
	src, err := a.Alloc(512, s)
	require.NoError(t, err)
	dst, err := a.Alloc(512, s)
	require.NoError(t, err)
	pin, err := a.AllocPinned(512, s)
	require.NoError(t, err)
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5}, 100)
	mem, err := pin.Bytes()
	require.NoError(t, err)
	copy(mem, data)
	require.NoError(t, s.Copy(src, 0, pin, 0, 500))
	srcAddr, _, _, err := src.Region()
	require.NoError(t, err)
	dstAddr, _, _, err := dst.Region()
	require.NoError(t, err)

	l := &ipcLink{dev: rt.Device(a.Info().Device), kernelCopies: true} // as under MPS
	for round := range 2 {
		var b copyBatch
		b.add(dstAddr, srcAddr, 200)
		b.add(dstAddr+200, srcAddr+200, 300)
		before := cudart.Calls()
		require.NoError(t, b.flush(l, s, nil))
		calls := cudart.Calls().Sub(before)
		require.False(t, l.kernelCopies, "round %d: the kernel is not tried again", round)
		require.EqualValues(t, 1, calls["cudaMemcpyBatchAsync"], "round %d: %v", round, calls)
		require.Zero(t, calls["cudaLaunchKernel"], "round %d: %v", round, calls)
	}
	require.NoError(t, s.Copy(pin, 0, dst, 0, 500))
	require.NoError(t, s.Synchronize())
	require.Equal(t, data, mem[:500])
	for _, b := range []*devalloc.Buffer{src, dst, pin} {
		require.NoError(t, b.Free())
	}
	require.NoError(t, a.Close())
}
