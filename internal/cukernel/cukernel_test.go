//go:build cgo

package cukernel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/distbuf/distbuf/internal/gputest"

	"github.com/distbuf/distbuf/internal/nvrtc"
	"github.com/stretchr/testify/require"
)

func loadOrSkip(t *testing.T) *Runtime {
	t.Helper()
	rt, err := Load()
	if err == nil {
		_, _, err = rt.ComputeCapability(0)
	}
	if err != nil {
		gputest.Unavailable(t, "the CUDA runtime", err)
	}
	return rt
}

func TestLoadMissingLibrary(t *testing.T) {
	t.Setenv(EnvCUDART, "libcudart-does-not-exist.so.99")
	_, err := load()
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "libcudart-does-not-exist.so.99")
}

// perThreadStream is the cudaStreamPerThread handle.
const perThreadStream = 0x2

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
			// cudaStreamPerThread: a real stream, per OS thread, so stay on one.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			require.NoError(t, rt.MemcpyBatch(0, perThreadStream, dsts, srcs, sizes))
			require.NoError(t, rt.StreamSynchronize(0, perThreadStream))
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

// copySource is a table-driven byte copy with the signature of packing's
// kernel (the CPU stand-in runtime knows only that one).
const copySource = `extern "C" __global__ void distbuf_copy_table(const unsigned long long *t, int n, int reverse) {
	for (int e = blockIdx.x; e < n; e += gridDim.x) {
		const char *a = (const char *)t[3 * e], *b = (const char *)t[3 * e + 1];
		const char *src = reverse ? b : a;
		char *dst = (char *)(reverse ? a : b);
		for (unsigned long long i = threadIdx.x; i < t[3 * e + 2]; i += blockDim.x) dst[i] = src[i];
	}
}`

func TestLaunchKernel(t *testing.T) {
	rt := loadOrSkip(t)
	require.NoError(t, rt.CanLaunch())
	nv, err := nvrtc.Load()
	require.NoError(t, err)
	major, minor, err := rt.ComputeCapability(0)
	require.NoError(t, err)
	image, err := nv.Compile(copySource, "copy.cu", []string{fmt.Sprintf("--gpu-architecture=sm_%d%d", major, minor)}, true)
	require.NoError(t, err)
	k, err := rt.LoadKernel(0, image, "distbuf_copy_table")
	require.NoError(t, err)
	_, err = rt.LoadKernel(0, image, "no_such_kernel")
	require.ErrorIs(t, err, ErrCUDA)
	buf, err := rt.Malloc(0, 4096)
	require.NoError(t, err)
	defer rt.Free(0, buf)
	data := make([]byte, 4096)
	for i := range 1024 {
		data[i] = byte(i + 1)
	}
	// Entries: [0,100) -> [2000,2100), [500,507) -> [3000,3007); the table
	// at 3504, aligned for its 8-byte words.
	table := make([]byte, 48)
	for i, e := range [][3]uint64{{0, 2000, 100}, {500, 3000, 7}} {
		binary.LittleEndian.PutUint64(table[24*i:], uint64(buf)+e[0])
		binary.LittleEndian.PutUint64(table[24*i+8:], uint64(buf)+e[1])
		binary.LittleEndian.PutUint64(table[24*i+16:], e[2])
	}
	copy(data[3504:], table)
	require.NoError(t, rt.CopyToDevice(0, buf, data))
	require.NoError(t, rt.LaunchPtrIntInt(0, k, 2, 128, 0, buf+3504, 2, 0))
	require.NoError(t, rt.Synchronize(0))
	got := make([]byte, 4096)
	require.NoError(t, rt.CopyFromDevice(0, got, buf))
	require.Equal(t, data[0:100], got[2000:2100])
	require.Equal(t, data[500:507], got[3000:3007])
	require.Error(t, rt.LaunchPtrIntInt(0, k, 0, 128, 0, buf+3504, 2, 0), "an empty grid is a launch error")
	require.Error(t, rt.LaunchPtrIntInt(7, k, 1, 128, 0, buf+3504, 2, 0), "a device that does not exist")
}
