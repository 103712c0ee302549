package gather

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/alloctest"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/stretchr/testify/require"
)

// TestMain runs the tests on the real CUDA libraries when a GPU is there,
// and on the fake libcudart and libnvrtc otherwise.
func TestMain(m *testing.M) { cudarttest.Main(m) }

var (
	openHost   = alloctest.OpenHost
	openCUDA   = alloctest.OpenCUDA
	closeClean = alloctest.CloseClean
	readAll    = alloctest.ReadAll
	writeAll   = alloctest.WriteAll
)

// TestCopyKernelRaw checks the NVRTC-built gather/scatter kernel on memory
// from cudaMalloc, without devalloc: every alignment branch (16, 8, 4 and 1
// byte), both directions.
func TestCopyKernelRaw(t *testing.T) {
	rt, err := cudart.Load()
	var d *cudart.Device
	if err == nil {
		d = rt.Device(0)
		_, _, err = d.ComputeCapability()
	}
	if err != nil {
		gputest.Unavailable(t, "the CUDA runtime", err)
	}
	k, err := Kernel(d)
	require.NoError(t, err, "the kernel must build on the GPU machine (NVRTC, CUDA 12.8+) and on the fake")
	const size = 1 << 16
	scat := gputest.DeviceMemory(t, d, size)
	blk := gputest.DeviceMemory(t, d, size)
	tab := gputest.DeviceMemory(t, d, 4*EntryBytes)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*13 + 1)
	}
	// {scattered offset, block offset, bytes}: 16-, 8-, 4- and 1-aligned.
	entries := [][3]uint64{{0, 4096, 4096}, {10008, 0, 1000}, {20004, 9000, 44}, {30001, 12001, 333}}
	table := make([]byte, len(entries)*EntryBytes)
	for i, e := range entries {
		binary.LittleEndian.PutUint64(table[24*i:], uint64(scat)+e[0])
		binary.LittleEndian.PutUint64(table[24*i+8:], uint64(blk)+e[1])
		binary.LittleEndian.PutUint64(table[24*i+16:], e[2])
	}
	require.NoError(t, d.CopyToDevice(tab, table))
	for _, reverse := range []uint64{0, 1} {
		from, to := scat, blk
		if reverse == 1 {
			from, to = blk, scat
		}
		require.NoError(t, d.CopyToDevice(from, data))
		require.NoError(t, d.CopyToDevice(to, make([]byte, size)))
		// The legacy default stream, as a caller without devalloc has.
		require.NoError(t, d.Launch(k, 2, 1, copyKernelThreads, 0, 0, uint64(tab), uint64(len(entries)), reverse))
		require.NoError(t, d.Synchronize())
		got := make([]byte, size)
		require.NoError(t, d.CopyFromDevice(got, to))
		want := make([]byte, size)
		for _, e := range entries {
			src, dst := e[0], e[1]
			if reverse == 1 {
				src, dst = dst, src
			}
			copy(want[dst:dst+e[2]], data[src:src+e[2]])
		}
		require.True(t, bytes.Equal(want, got), "reverse=%d", reverse)
	}
}

func TestKernelTableChunks(t *testing.T) {
	got := Table([]uintptr{1000, 1 << 30}, []uintptr{0, 1 << 20}, []uintptr{16, MaxChunk*2 + 48})
	require.Equal(t, []Entry{
		{1000, 0, 16},
		{1 << 30, 1 << 20, MaxChunk},
		{1<<30 + MaxChunk, 1<<20 + MaxChunk, MaxChunk},
		{1<<30 + 2*MaxChunk, 1<<20 + 2*MaxChunk, 48},
	}, got)
	for _, e := range got[1:] {
		require.Zero(t, (e.Ref|e.Blk)%16, "pieces of an aligned block stay aligned")
	}
}

// TestCopySpans: spans between two device buffers and from pinned memory,
// at every alignment, go in one kernel launch and land exactly, leaving
// the bytes between them alone; on the host backend CopySpans is
// unavailable and enqueues nothing.
func TestCopySpans(t *testing.T) {
	a := openCUDA(t)
	s := a.DefaultStream()
	const size = 1 << 15
	src, err := a.Alloc(size, s)
	require.NoError(t, err)
	dst, err := a.Alloc(size, s)
	require.NoError(t, err)
	pin, err := a.AllocPinned(64, s)
	require.NoError(t, err)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	writeAll(t, s, src, data)
	writeAll(t, s, dst, make([]byte, size))
	pinned, err := pin.Bytes()
	require.NoError(t, err)
	for i := range pinned {
		pinned[i] = byte(200 + i)
	}
	srcAddr, _, _, err := src.Region()
	require.NoError(t, err)
	dstAddr, _, _, err := dst.Region()
	require.NoError(t, err)
	pinAddr, _, _, err := pin.Region()
	require.NoError(t, err)
	// {source offset, destination offset, bytes}: 16-, 8-, 4- and 1-aligned,
	// and one above the kernel's piece size.
	spans := [][3]uintptr{{0, 16, 4096}, {8008, 8200, 1000}, {9004, 9300, 44}, {10001, 10003, 333}, {11000, 12000, MaxChunk/4 + 77}}
	var dsts, srcs, sizes []uintptr
	want := make([]byte, size)
	for _, sp := range spans {
		if sp[1]+sp[2] > size {
			sp[2] = size - sp[1]
		}
		srcs, dsts, sizes = append(srcs, srcAddr+sp[0]), append(dsts, dstAddr+sp[1]), append(sizes, sp[2])
		copy(want[sp[1]:sp[1]+sp[2]], data[sp[0]:sp[0]+sp[2]])
	}
	srcs, dsts, sizes = append(srcs, pinAddr), append(dsts, dstAddr+5000), append(sizes, 64)
	copy(want[5000:5064], pinned)

	before := cudart.Calls()
	r, err := src.Read(s)
	require.NoError(t, err)
	w, err := dst.Write(s)
	require.NoError(t, err)
	require.NoError(t, CopySpans(s, dsts, srcs, sizes))
	calls := cudart.Calls().Sub(before)
	require.EqualValues(t, 1, calls["cudaLaunchKernel"], "%v", calls)
	require.Zero(t, calls["cudaMemcpyAsync"]+calls["cudaMemcpyBatchAsync"], "%v", calls)
	require.NoError(t, devalloc.DoneAll(r, w))
	require.True(t, bytes.Equal(want, readAll(t, s, dst)), "the spans, and nothing else")

	require.ErrorIs(t, CopySpans(s, dsts[:1], srcs, sizes), distbuf.ErrInvalid)
	require.NoError(t, errors.Join(src.Free(), dst.Free(), pin.Free()))
	closeClean(t, a)

	h := openHost(t)
	require.ErrorIs(t, CopySpans(h.DefaultStream(), nil, nil, nil), distbuf.ErrUnavailable)
	closeClean(t, h)
}

// TestKernelsPerRuntime: a process that loads a second libcudart (here a
// copy of the file of the one in use, the real runtime on the GPU machine,
// the fake elsewhere) gets the copy kernel loaded through that one: a
// kernel handle of one runtime means nothing to another.
func TestKernelsPerRuntime(t *testing.T) {
	first := runtimeFile(t)
	second := filepath.Join(t.TempDir(), "libcudart-second.so")
	data, err := os.ReadFile(first)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(second, data, 0o755))
	for i, lib := range []string{first, second} {
		t.Setenv(cudart.EnvCUDART, lib)
		a := openCUDA(t)
		s := a.DefaultStream()
		src, err := a.Alloc(256, s)
		require.NoError(t, err)
		dst, err := a.Alloc(256, s)
		require.NoError(t, err)
		data := bytes.Repeat([]byte{byte(i + 1), 7}, 128)
		writeAll(t, s, src, data)
		srcAddr, _, _, err := src.Region()
		require.NoError(t, err)
		dstAddr, _, _, err := dst.Region()
		require.NoError(t, err)
		require.NoError(t, CopySpans(s, []uintptr{dstAddr, dstAddr + 128}, []uintptr{srcAddr, srcAddr + 128}, []uintptr{128, 128}), "runtime %d", i)
		require.Equal(t, data, readAll(t, s, dst), "runtime %d", i)
		require.NoError(t, errors.Join(src.Free(), dst.Free()))
		closeClean(t, a)
	}
}

// runtimeFile is the file of the CUDA runtime the tests use: the path it
// was loaded by, or, loaded by its soname, the file /proc/self/maps shows.
func runtimeFile(t *testing.T) string {
	rt, err := cudart.Load()
	if err != nil {
		gputest.Unavailable(t, "the CUDA runtime", err)
	}
	if strings.Contains(rt.Path(), "/") {
		return rt.Path()
	}
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for line := range strings.Lines(string(maps)) {
		if f := strings.Fields(line); len(f) >= 6 && strings.HasPrefix(filepath.Base(f[5]), "libcudart.so") {
			return f[5]
		}
	}
	t.Fatalf("no file of %s in /proc/self/maps", rt.Path())
	return ""
}
