//go:build cgo

package cudart_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/distbuf/distbuf/internal/nvrtc"
	"github.com/stretchr/testify/require"
)

// nvrtcFake records whether this process's NVRTC is the fake: NVRTC is
// loaded once per process, so every test of the binary makes one choice.
var nvrtcFake struct {
	sync.Once
	fake bool
}

// machineOrFake loads the machine's runtime when it has a GPU, else a
// fake; the environment it leaves (DISTBUF_CUDART) picks the same runtime
// in a child process. Under DISTBUF_REQUIRE_GPU=1 there is no fake.
func machineOrFake(t *testing.T) (rt *cudart.Runtime, real bool) {
	t.Helper()
	t.Setenv(cudart.EnvCUDART, "")
	rt, err := cudart.Load()
	if err == nil {
		var n int
		if n, err = rt.DeviceCount(); err == nil && n == 0 {
			err = fmt.Errorf("%w: no device", gputest.ErrAbsent)
		}
	}
	if err == nil {
		return rt, true
	}
	if gputest.Required() {
		gputest.Unavailable(t, "the CUDA runtime", err)
	}
	rt, err = loadFake(t)
	require.NoError(t, err)
	return rt, false
}

// kernelDevice returns device 0 of machineOrFake's runtime, with NVRTC
// (real, or the fake to match) to compile.
func kernelDevice(t *testing.T) (*cudart.Device, bool) {
	t.Helper()
	rt, real := machineOrFake(t)
	nvrtcFake.Do(func() {
		if !real {
			nvrtcFake.fake = true
			// Loaded now, it stays loaded after its directory goes.
			require.NoError(t, os.Setenv(cudarttest.EnvNVRTC, cudarttest.BuildNVRTC(t)))
			_, err := nvrtc.Load()
			require.NoError(t, err)
		}
	})
	require.Equal(t, !real, nvrtcFake.fake, "NVRTC was chosen for the other runtime")
	return rt.Device(0), real
}

// copySource is a table-driven byte copy with the signature of packing's
// kernel, which the fake also runs.
const copySource = `extern "C" __global__ void distbuf_copy_table(const unsigned long long *t, int n, int reverse) {
	for (int e = blockIdx.x; e < n; e += gridDim.x) {
		const char *a = (const char *)t[3 * e], *b = (const char *)t[3 * e + 1];
		const char *src = reverse ? b : a;
		char *dst = (char *)(reverse ? a : b);
		for (unsigned long long i = threadIdx.x; i < t[3 * e + 2]; i += blockDim.x) dst[i] = src[i];
	}
}
extern "C" __global__ void add_one(float *x, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] += 1.0f;
}`

func compileFor(t *testing.T, d *cudart.Device, src string) []byte {
	t.Helper()
	nv, err := nvrtc.Load()
	require.NoError(t, err)
	major, minor, err := d.ComputeCapability()
	require.NoError(t, err)
	image, err := nv.Compile(src, "test.cu", []string{fmt.Sprintf("--gpu-architecture=sm_%d%d", major, minor)}, true)
	require.NoError(t, err)
	return image
}

// TestCopiesAndTiming: per-block and batched copies in a stream's order,
// timed by events, on device memory from cudaMalloc.
func TestCopiesAndTiming(t *testing.T) {
	d, real := kernelDevice(t)
	require.True(t, d.Runtime().Capabilities().MemcpyBatch, "CUDA 12.8+ and the fake have cudaMemcpyBatchAsync")
	const n = 1 << 16
	src, err := d.Malloc(n)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(src)) }()
	dst, err := d.Malloc(n)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(dst)) }()
	s, err := d.StreamCreate()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	require.NoError(t, d.CopyToDevice(src, data))
	for _, batch := range []bool{false, true} {
		require.NoError(t, d.CopyToDevice(dst, make([]byte, n)))
		// Three scattered pieces, reversed.
		dsts := []uintptr{dst, dst + 1000, dst + 40000}
		srcs := []uintptr{src + 50000, src + 123, src}
		sizes := []uintptr{1000, 3000, 7}
		start, err := d.EventCreateTiming()
		require.NoError(t, err)
		end, err := d.EventCreateTiming()
		require.NoError(t, err)
		require.NoError(t, d.EventRecord(start, s))
		before := cudart.Calls()
		if batch {
			require.NoError(t, d.MemcpyBatch(s, dsts, srcs, sizes))
			require.EqualValues(t, 1, cudart.Calls().Sub(before)["cudaMemcpyBatchAsync"])
		} else {
			require.NoError(t, d.MemcpyEach(s, dsts, srcs, sizes))
			require.EqualValues(t, 3, cudart.Calls().Sub(before)["cudaMemcpyAsync"], "one counted call per copy")
		}
		require.NoError(t, d.EventRecord(end, s))
		require.NoError(t, d.EventSynchronize(end))
		ms, err := d.EventElapsedTime(start, end)
		require.NoError(t, err)
		require.GreaterOrEqual(t, ms, 0.0)
		require.NoError(t, d.EventDestroy(start))
		require.NoError(t, d.EventDestroy(end))
		got := make([]byte, n)
		require.NoError(t, d.CopyFromDevice(got, dst))
		want := make([]byte, n)
		copy(want[0:], data[50000:51000])
		copy(want[1000:], data[123:3123])
		copy(want[40000:], data[0:7])
		require.True(t, bytes.Equal(want, got), "batch=%v", batch)
	}
	require.ErrorIs(t, d.MemcpyEach(s, []uintptr{dst}, nil, nil), cudart.ErrInvalid)
	require.ErrorIs(t, d.MemcpyBatch(s, []uintptr{dst}, nil, nil), cudart.ErrInvalid)
	err = d.MemcpyBatch(0, []uintptr{dst}, []uintptr{src}, []uintptr{8})
	if real {
		t.Logf("cudaMemcpyBatchAsync on the legacy default stream: %v", err)
	} else {
		require.Error(t, err, "the legacy default stream is refused, as by the runtime")
	}

	// A timing query on events made without timing fails.
	a, err := d.EventCreate()
	require.NoError(t, err)
	b, err := d.EventCreate()
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(a, s))
	require.NoError(t, d.EventRecord(b, s))
	require.NoError(t, d.EventSynchronize(b))
	_, err = d.EventElapsedTime(a, b)
	var ce *cudart.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cudaErrorInvalidResourceHandle", ce.Name)
	require.NoError(t, d.EventDestroy(a))
	require.NoError(t, d.EventDestroy(b))

	require.ErrorAs(t, d.Free(dst+1), &ce, "not the start of an allocation")
}

// TestLaunchKernel compiles a kernel with NVRTC, loads it and launches it in
// a stream's order.
func TestLaunchKernel(t *testing.T) {
	d, real := kernelDevice(t)
	require.True(t, d.Runtime().Capabilities().KernelLaunch)
	_, err := d.LoadKernel([]byte("not a cubin"), "x")
	var ce *cudart.Error
	require.ErrorAs(t, err, &ce, "a garbage image")
	image := compileFor(t, d, copySource)
	ks, err := d.LoadKernels(image, "distbuf_copy_table", "add_one")
	require.NoError(t, err)
	require.Len(t, ks, 2)
	_, err = d.LoadKernel(image, "no_such_kernel")
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cudaErrorSymbolNotFound", ce.Name)
	_, err = d.LoadKernels(image)
	require.ErrorIs(t, err, cudart.ErrInvalid)

	buf, err := d.Malloc(4096)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(buf)) }()
	s, err := d.StreamCreate()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()
	data := make([]byte, 4096)
	for i := range 1024 {
		data[i] = byte(i + 1)
	}
	// Entries: [0,100) -> [2000,2100), [500,507) -> [3000,3007); the table
	// at 3504, aligned for its 8-byte words.
	for i, e := range [][3]uint64{{0, 2000, 100}, {500, 3000, 7}} {
		binary.LittleEndian.PutUint64(data[3504+24*i:], uint64(buf)+e[0])
		binary.LittleEndian.PutUint64(data[3504+24*i+8:], uint64(buf)+e[1])
		binary.LittleEndian.PutUint64(data[3504+24*i+16:], e[2])
	}
	require.NoError(t, d.CopyToDevice(buf, data))
	before := cudart.Calls()
	require.NoError(t, d.Launch(ks[0], 2, 1, 128, 0, s, uint64(buf+3504), 2, 0))
	require.EqualValues(t, 1, cudart.Calls().Sub(before)["cudaLaunchKernel"])
	require.NoError(t, d.StreamSynchronize(s))
	got := make([]byte, 4096)
	require.NoError(t, d.CopyFromDevice(got, buf))
	require.Equal(t, data[0:100], got[2000:2100])
	require.Equal(t, data[500:507], got[3000:3007])

	require.ErrorIs(t, d.Launch(ks[0], 0, 1, 128, 0, s, uint64(buf+3504), 2, 0), cudart.ErrInvalid, "an empty grid")
	require.ErrorIs(t, d.Launch(ks[0], 1, 1, 128, 0, s, make([]uint64, cudart.MaxLaunchArgs+1)...), cudart.ErrInvalid)
	err = d.Launch(ks[0], 1, 1, 4096, 0, s, uint64(buf+3504), 2, 0)
	require.ErrorAs(t, err, &ce, "a block of more threads than a device has")
	err = d.Runtime().Device(7).Launch(ks[0], 1, 1, 128, 0, s, uint64(buf+3504), 2, 0)
	require.ErrorAs(t, err, &ce, "a device that does not exist")
	require.Equal(t, 7, ce.Device)

	// add_one has no host implementation in the fake: its launch is
	// refused as not supported, naming the operation.
	err = d.Launch(ks[1], 1, 1, 32, 0, s, uint64(buf), 4)
	if real {
		require.NoError(t, err)
		require.NoError(t, d.StreamSynchronize(s))
	} else {
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "cudaErrorNotSupported", ce.Name)
		require.Equal(t, "cudaLaunchKernel", ce.Op)
		require.ErrorIs(t, err, cudart.ErrNotSupported)
		require.ErrorContains(t, err, "kernel add_one")
	}
}

// TestFakeGemmKernelContract: the fake's small GEMM kernel refuses a launch
// the real kernel would run wrongly, and turns a stack that breaks the
// plan's order into a sticky error, as a device-side assert does.
func TestFakeGemmKernelContract(t *testing.T) {
	d, real := kernelDevice(t)
	if real {
		t.Skip("the contract checks belong to the fake; gemm's tests run the kernel on the GPU")
	}
	image := compileFor(t, d, `extern "C" __global__ void distbuf_gemm_small_d() {}`)
	k, err := d.LoadKernel(image, "distbuf_gemm_small_d")
	require.NoError(t, err)
	s, err := d.StreamCreate()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()
	args := make([]uint64, 11)
	var ce *cudart.Error
	require.ErrorAs(t, d.Launch(k, 1, 1, 128, 0, s, args...), &ce, "the kernel is written for 256 threads")
	require.Equal(t, "cudaErrorInvalidConfiguration", ce.Name)
	// One 32x32x32 product marked tiny: on the wrong side of the split.
	stack, err := d.Malloc(48)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(stack)) }()
	entry := make([]byte, 48)
	for j, v := range []uint32{32, 32, 32, 32, 32} {
		binary.LittleEndian.PutUint32(entry[24+4*j:], v)
	}
	require.NoError(t, d.CopyToDevice(stack, entry))
	mem, err := d.Malloc(3 * 32 * 32 * 8)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(mem)) }()
	args = []uint64{uint64(stack), 1, 1, uint64(mem), uint64(mem), uint64(mem), 0, 0, 0, 0, 0}
	require.NoError(t, d.Launch(k, 1, 1, 256, 0, s, args...))
	err = d.StreamSynchronize(s)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cudaErrorAssert", ce.Name)
}

// TestOptionalGroups: the kernel, batch and IPC functions are optional
// groups; a runtime without one loads, reports the capability absent, and
// the calls that need it fail with ErrNotSupported.
func TestOptionalGroups(t *testing.T) {
	for _, tc := range []struct {
		define string
		absent []string
		check  func(c cudart.Capabilities) bool
	}{
		{"FAKE_NO_KERNELS", []string{"cudaLibraryLoadData", "cudaLibraryGetKernel", "cudaLaunchKernel"}, func(c cudart.Capabilities) bool { return c.KernelLaunch }},
		{"FAKE_NO_BATCH", []string{"cudaMemcpyBatchAsync"}, func(c cudart.Capabilities) bool { return c.MemcpyBatch }},
		{"FAKE_NO_IPC", []string{"cudaIpcGetMemHandle", "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle", "cudaIpcGetEventHandle", "cudaIpcOpenEventHandle"}, func(c cudart.Capabilities) bool { return c.IPC }},
	} {
		t.Run(tc.define, func(t *testing.T) {
			rt, err := loadFake(t, tc.define)
			require.NoError(t, err)
			c := rt.Capabilities()
			require.False(t, tc.check(c))
			for _, name := range tc.absent {
				require.Contains(t, c.Absent, name)
			}
			d := rt.Device(0)
			var errs []error
			switch tc.define {
			case "FAKE_NO_KERNELS":
				_, err := d.LoadKernels([]byte("x"), "k")
				errs = append(errs, err, d.Launch(1, 1, 1, 1, 0, 0))
			case "FAKE_NO_BATCH":
				errs = append(errs, d.MemcpyBatch(0, nil, nil, nil))
			case "FAKE_NO_IPC":
				_, err1 := d.IpcGetMemHandle(0)
				_, err2 := d.IpcOpenMemHandle(cudart.IpcMemHandle{})
				_, err3 := d.EventCreateInterprocess()
				_, err4 := d.IpcGetEventHandle(0)
				_, err5 := d.IpcOpenEventHandle(cudart.IpcEventHandle{})
				errs = append(errs, err1, err2, err3, err4, err5, d.IpcCloseMemHandle(0))
			}
			for _, err := range errs {
				require.ErrorIs(t, err, cudart.ErrNotSupported)
			}
		})
	}
	// Before CUDA 12.8 library kernels cannot be launched and there is no
	// batched copy, whatever the library exports.
	rt, err := loadFake(t, "FAKE_RUNTIME_VERSION=12060")
	require.NoError(t, err)
	c := rt.Capabilities()
	require.False(t, c.KernelLaunch)
	require.False(t, c.MemcpyBatch)
	require.True(t, c.IPC)
	err = rt.Device(0).MemcpyBatch(0, nil, nil, nil)
	require.ErrorIs(t, err, cudart.ErrNotSupported)
	require.ErrorContains(t, err, "12.6")
}

// TestMemcpyBatchCUDA12: a 12.8 runtime's cudaMemcpyBatchAsync takes a
// failIdx before the stream; the call must use that prototype.
func TestMemcpyBatchCUDA12(t *testing.T) {
	rt, err := loadFake(t, "FAKE_RUNTIME_VERSION=12080")
	require.NoError(t, err)
	require.True(t, rt.Capabilities().MemcpyBatch)
	d := rt.Device(0)
	s, err := d.StreamCreate()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()
	src, err := d.Malloc(64)
	require.NoError(t, err)
	dst, err := d.Malloc(64)
	require.NoError(t, err)
	require.NoError(t, d.CopyToDevice(src, []byte(strings.Repeat("x", 64))))
	require.NoError(t, d.MemcpyBatch(s, []uintptr{dst, dst + 32}, []uintptr{src, src + 8}, []uintptr{16, 8}))
	require.NoError(t, d.StreamSynchronize(s))
	got := make([]byte, 64)
	require.NoError(t, d.CopyFromDevice(got, dst))
	require.Equal(t, strings.Repeat("x", 16), string(got[:16]))
	require.Equal(t, strings.Repeat("x", 8), string(got[32:40]))
	require.NoError(t, d.Free(src))
	require.NoError(t, d.Free(dst))
}
