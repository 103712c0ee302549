//go:build cgo

package cukernel

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func loadOrSkip(t *testing.T) *Runtime {
	t.Helper()
	rt, err := Load()
	if err == nil {
		_, _, err = rt.ComputeCapability(0)
	}
	if err != nil {
		if os.Getenv("DISTBUF_REQUIRE_GPU") == "1" {
			t.Fatalf("DISTBUF_REQUIRE_GPU=1 but the CUDA runtime is unusable: %v", err)
		}
		t.Skipf("CUDA runtime unavailable: %v", err)
	}
	return rt
}

func TestLoadMissingLibrary(t *testing.T) {
	t.Setenv(EnvCUDART, "libcudart-does-not-exist.so.99")
	_, err := load()
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "libcudart-does-not-exist.so.99")
}

func TestCopiesAndEvents(t *testing.T) {
	rt := loadOrSkip(t)
	t.Logf("%s, runtime %d", rt.Library(), rt.Version())
	const n = 1 << 16
	src, err := rt.Malloc(0, n)
	require.NoError(t, err)
	defer rt.Free(0, src)
	dst, err := rt.Malloc(0, n)
	require.NoError(t, err)
	defer rt.Free(0, dst)
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	require.NoError(t, rt.CopyToDevice(0, src, data))
	for _, batch := range []bool{false, true} {
		if batch && !rt.HasMemcpyBatch() {
			require.Less(t, rt.Version(), 12080, "cudaMemcpyBatchAsync missing from a 12.8+ runtime")
			continue
		}
		zero := make([]byte, n)
		require.NoError(t, rt.CopyToDevice(0, dst, zero))
		// Three scattered pieces, reversed.
		dsts := []uintptr{dst, dst + 1000, dst + 40000}
		srcs := []uintptr{src + 50000, src + 123, src}
		sizes := []uintptr{1000, 3000, 7}
		start, err := rt.NewEvent(0)
		require.NoError(t, err)
		end, err := rt.NewEvent(0)
		require.NoError(t, err)
		require.NoError(t, rt.Record(0, start, 0))
		if batch {
			require.NoError(t, rt.MemcpyBatch(0, 0, dsts, srcs, sizes))
		} else {
			require.NoError(t, rt.MemcpyEach(0, 0, dsts, srcs, sizes))
		}
		require.NoError(t, rt.Record(0, end, 0))
		require.NoError(t, rt.WaitEvent(0, end))
		ms, err := rt.Elapsed(0, start, end)
		require.NoError(t, err)
		require.GreaterOrEqual(t, ms, 0.0)
		require.NoError(t, rt.DestroyEvent(0, start))
		require.NoError(t, rt.DestroyEvent(0, end))
		got := make([]byte, n)
		require.NoError(t, rt.CopyFromDevice(0, got, dst))
		want := make([]byte, n)
		copy(want[0:], data[50000:51000])
		copy(want[1000:], data[123:3123])
		copy(want[40000:], data[0:7])
		require.True(t, bytes.Equal(want, got), "batch=%v", batch)
	}
	require.ErrorIs(t, rt.MemcpyEach(0, 0, []uintptr{dst}, nil, nil), ErrCUDA)
	var ce *Error
	err = rt.Free(0, dst+1) // not an allocation
	require.True(t, errors.As(err, &ce), "%v", err)
}

func TestLoadKernelRejectsGarbage(t *testing.T) {
	rt := loadOrSkip(t)
	require.NoError(t, rt.CanLaunch(), "the GPU machine runs CUDA 13")
	_, err := rt.LoadKernel(0, []byte("not a cubin"), "x")
	require.ErrorIs(t, err, ErrCUDA)
}
