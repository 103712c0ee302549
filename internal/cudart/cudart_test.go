//go:build cgo

package cudart_test

import (
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf/internal/gputest"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/distbuf/distbuf/internal/dl"
	"github.com/stretchr/testify/require"
)

// loadFake builds the fake with the given definitions and loads it.
func loadFake(t *testing.T, defines ...string) (*cudart.Runtime, error) {
	t.Helper()
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t, defines...))
	return cudart.Load()
}

func TestMissingLibrary(t *testing.T) {
	t.Setenv(cudart.EnvCUDART, "/nonexistent/libcudart.so.13")
	_, err := cudart.Load()
	require.ErrorIs(t, err, cudart.ErrUnavailable)
	require.ErrorIs(t, err, dl.ErrNotFound)
	require.ErrorContains(t, err, "/nonexistent/libcudart.so.13")
	_, err2 := cudart.Load()
	require.ErrorIs(t, err2, cudart.ErrUnavailable, "a failure is reported again, not cached away")
}

func TestMissingRequiredSymbol(t *testing.T) {
	_, err := loadFake(t, "FAKE_OMIT_cudaMemcpyAsync")
	require.ErrorIs(t, err, cudart.ErrUnavailable)
	require.ErrorIs(t, err, dl.ErrMissingSymbol)
	require.ErrorContains(t, err, "cudaMemcpyAsync")
}

func TestNoDevice(t *testing.T) {
	for _, tc := range []struct {
		code int
		name string
	}{{100, "cudaErrorNoDevice"}, {35, "cudaErrorInsufficientDriver"}} {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := loadFake(t, "FAKE_DEVICE_COUNT_ERROR="+itoa(tc.code))
			require.NoError(t, err, "the library itself loads")
			n, err := rt.DeviceCount()
			require.Zero(t, n)
			require.ErrorIs(t, err, cudart.ErrUnavailable)
			require.NotErrorIs(t, err, cudart.ErrOutOfMemory)
			var ce *cudart.Error
			require.True(t, errors.As(err, &ce))
			require.Equal(t, tc.code, ce.Code)
			require.Equal(t, tc.name, ce.Name)
			require.Equal(t, "cudaGetDeviceCount", ce.Op)
			require.ErrorContains(t, err, tc.name)
			_, _, err = rt.Device(0).MemGetInfo()
			require.ErrorIs(t, err, cudart.ErrUnavailable, "setting the device fails the same way")
		})
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func TestLoadRetriesAndCaches(t *testing.T) {
	path := cudarttest.Build(t)
	t.Setenv(cudart.EnvCUDART, path+".missing")
	_, err := cudart.Load()
	require.ErrorIs(t, err, cudart.ErrUnavailable)
	t.Setenv(cudart.EnvCUDART, path)
	rt, err := cudart.Load()
	require.NoError(t, err)
	require.Equal(t, path, rt.Path())
	again, err := cudart.Load()
	require.NoError(t, err)
	require.Same(t, rt, again, "a successful load is kept")
	require.Equal(t, 13000, rt.RuntimeVersion())
	require.Equal(t, "13.0", cudart.FormatVersion(rt.DriverVersion()))
}

func TestCapabilities(t *testing.T) {
	rt, err := loadFake(t)
	require.NoError(t, err)
	c := rt.Capabilities()
	require.True(t, c.MemoryPools)
	require.True(t, c.DriverEntryPoint)
	require.True(t, c.StreamWaitValue)
	require.True(t, c.DeviceName)
	require.True(t, c.KernelLaunch)
	require.True(t, c.MemcpyBatch)
	require.True(t, c.IPC)
	require.Contains(t, c.Absent, "cudaGetDriverEntryPoint", "only the ByVersion lookup is in the fake")

	rt, err = loadFake(t, "FAKE_NO_POOLS", "FAKE_NO_ENTRY_POINT")
	require.NoError(t, err)
	c = rt.Capabilities()
	require.False(t, c.MemoryPools)
	require.False(t, c.DriverEntryPoint)
	require.False(t, c.StreamWaitValue)
	require.Contains(t, c.Absent, "cudaMallocFromPoolAsync")
	_, err = rt.Device(0).MemPoolCreate()
	require.ErrorIs(t, err, cudart.ErrNotSupported)
	_, err = rt.Device(0).Name()
	require.ErrorIs(t, err, cudart.ErrNotSupported)

	rt, err = loadFake(t, "FAKE_NO_WAIT_VALUE")
	require.NoError(t, err)
	c = rt.Capabilities()
	require.True(t, c.DriverEntryPoint)
	require.False(t, c.StreamWaitValue)
	require.True(t, c.DeviceName)
}

func TestDeviceCalls(t *testing.T) {
	rt, err := loadFake(t)
	require.NoError(t, err)
	n, err := rt.DeviceCount()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	d := rt.Device(0)
	name, err := d.Name()
	require.NoError(t, err)
	require.Equal(t, "Fake CUDA Device", name)
	v, err := d.Attribute(cudart.AttrMemoryPoolsSupported)
	require.NoError(t, err)
	require.Equal(t, 1, v)
	free, total, err := d.MemGetInfo()
	require.NoError(t, err)
	require.Positive(t, total)
	require.LessOrEqual(t, free, total)

	_, _, err = rt.Device(3).MemGetInfo()
	var ce *cudart.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "cudaErrorInvalidDevice", ce.Name)
	require.Equal(t, 3, ce.Device)

	// Memory errors carry the runtime's name and match ErrOutOfMemory.
	_, err = d.Malloc(1 << 50)
	require.ErrorIs(t, err, cudart.ErrOutOfMemory)
	require.ErrorContains(t, err, "cudaErrorMemoryAllocation")
	_, err = d.Malloc(-1)
	require.ErrorIs(t, err, cudart.ErrInvalid)

	s, err := d.StreamCreate()
	require.NoError(t, err)
	pool, err := d.MemPoolCreate()
	require.NoError(t, err)
	_, err = d.MallocFromPoolAsync(1<<50, pool, s)
	require.ErrorIs(t, err, cudart.ErrOutOfMemory)
	p, err := d.MallocFromPoolAsync(4096, pool, s)
	require.NoError(t, err)
	used, err := d.MemPoolGetUint64(pool, cudart.PoolAttrUsedMemCurrent)
	require.NoError(t, err)
	require.EqualValues(t, 4096, used)
	require.NoError(t, d.MemsetAsync(p, 7, 4096, s))
	host, err := d.HostAlloc(4096, cudart.HostAllocPortable|cudart.HostAllocMapped)
	require.NoError(t, err)
	require.NoError(t, d.MemcpyAsync(uintptr(host), p, 4096, s))
	require.NoError(t, d.FreeAsync(p, s))
	require.NoError(t, d.StreamSynchronize(s))
	require.Equal(t, byte(7), unsafe.Slice((*byte)(host), 4096)[4095])
	require.NoError(t, d.MemPoolTrimTo(pool, 0))
	res, err := d.MemPoolGetUint64(pool, cudart.PoolAttrReservedMemCurrent)
	require.NoError(t, err)
	require.Zero(t, res)
	require.NoError(t, d.MemPoolDestroy(pool))
	require.NoError(t, d.FreeHost(host))
	require.NoError(t, d.StreamDestroy(s))
}

func TestHostFuncAndWaitValue(t *testing.T) {
	rt, err := loadFake(t)
	require.NoError(t, err)
	d := rt.Device(0)
	s, err := d.StreamCreate()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()

	ran := make(chan struct{})
	require.NoError(t, d.LaunchHostFunc(s, func() { close(ran) }))
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("host function never ran")
	}
	require.ErrorIs(t, d.LaunchHostFunc(s, nil), cudart.ErrInvalid)

	word, err := d.HostAlloc(64, cudart.HostAllocPortable|cudart.HostAllocMapped)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreeHost(word)) }()
	w := (*uint32)(word)
	atomic.StoreUint32(w, 0)
	dptr, err := d.HostDevicePointer(word)
	require.NoError(t, err)
	require.NoError(t, d.StreamWaitValueGEQ(s, dptr, 1))
	ev, err := d.EventCreate()
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(ev, s))
	time.Sleep(20 * time.Millisecond)
	done, err := d.EventQuery(ev)
	require.NoError(t, err)
	require.False(t, done, "the stream passed a wait on a word still below the value")
	atomic.StoreUint32(w, 1)
	require.NoError(t, d.EventSynchronize(ev))
	require.NoError(t, d.EventDestroy(ev))
}

// TestRealRuntime loads the machine's libcudart. It skips when there is
// none, unless DISTBUF_REQUIRE_GPU=1.
func TestRealRuntime(t *testing.T) {
	t.Setenv(cudart.EnvCUDART, "")
	rt, err := cudart.Load()
	var n int
	if err == nil {
		n, err = rt.DeviceCount()
	}
	if err != nil {
		gputest.Unavailable(t, "CUDA", err)
	}
	c := rt.Capabilities()
	t.Logf("%s: runtime %s, driver %s, %d device(s), capabilities %+v", rt.Path(),
		cudart.FormatVersion(rt.RuntimeVersion()), cudart.FormatVersion(rt.DriverVersion()), n, c)
	require.Positive(t, n)
	require.True(t, c.MemoryPools)
	require.True(t, c.DriverEntryPoint)
	require.True(t, c.StreamWaitValue, "cuStreamWaitValue32 through the entry-point lookup")
	require.True(t, c.KernelLaunch, "library kernels (CUDA 12.8+)")
	require.True(t, c.MemcpyBatch, "cudaMemcpyBatchAsync (CUDA 12.8+)")
	require.True(t, c.IPC, "the cudaIpc* functions")
	name, err := rt.Device(0).Name()
	require.NoError(t, err)
	require.NotEmpty(t, name)
	d := rt.Device(0)
	_, err = d.Malloc(1 << 49)
	require.ErrorIs(t, err, cudart.ErrOutOfMemory)

	// The pool path must report exhaustion the same way, and the reuse
	// defaults the backend relies on must hold.
	s, err := d.StreamCreate()
	require.NoError(t, err)
	pool, err := d.MemPoolCreate()
	require.NoError(t, err)
	for _, attr := range []cudart.PoolAttr{cudart.PoolReuseFollowEventDependencies, cudart.PoolReuseAllowOpportunistic, cudart.PoolReuseAllowInternalDependencies} {
		v, err := d.MemPoolGetInt(pool, attr)
		require.NoError(t, err)
		t.Logf("pool attribute %d defaults to %d", attr, v)
	}
	_, err = d.MallocFromPoolAsync(1<<49, pool, s)
	require.ErrorIs(t, err, cudart.ErrOutOfMemory)
	p, err := d.MallocFromPoolAsync(1<<20, pool, s)
	require.NoError(t, err)
	require.NoError(t, d.FreeAsync(p, s))
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.MemPoolDestroy(pool))
	require.NoError(t, d.StreamDestroy(s))
}

// TestCallCounts: the loader counts every call by entry point, and a call
// on the device already current to the thread makes no cudaSetDevice.
func TestCallCounts(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rt, err := loadFake(t)
	require.NoError(t, err)
	require.True(t, rt.Capabilities().CurrentContext)
	d := rt.Device(0)
	s, err := d.StreamCreate()
	require.NoError(t, err)
	pool, err := d.MemPoolCreate()
	require.NoError(t, err)

	before, total := cudart.Calls(), cudart.CallsTotal()
	var tally, start, end cudart.Tally
	const n = 10
	for range n {
		start.Read()
		p, err := d.MallocFromPoolAsync(4096, pool, s)
		require.NoError(t, err)
		require.NoError(t, d.MemsetAsync(p, 1, 4096, s))
		require.NoError(t, d.FreeAsync(p, s))
		end.Read()
		tally.AddSince(&end, &start)
	}
	got := cudart.Calls().Sub(before)
	require.Equal(t, cudart.Counts{"cudaMallocFromPoolAsync": n, "cudaMemsetAsync": n, "cudaFreeAsync": n, "cuCtxGetCurrent": 3 * n}, got,
		"each call checks the thread's context and sets no device")
	require.EqualValues(t, 6*n, got.Total())
	require.EqualValues(t, 6*n, cudart.CallsTotal()-total)
	require.Equal(t, got, tally.Counts(), "a tally of the steps counts what Calls counts over them")
	require.Equal(t, []string{"cuCtxGetCurrent", "cudaFreeAsync", "cudaMallocFromPoolAsync", "cudaMemsetAsync"}, got.Names())
	require.Empty(t, tally.Durations(), "no time is kept while timing is off")

	// With timing on, each entry point called adds the time spent in it.
	cudart.SetTiming(true)
	var timed cudart.Tally
	start.Read()
	for range n {
		p, err := d.MallocFromPoolAsync(4096, pool, s)
		require.NoError(t, err)
		require.NoError(t, d.FreeAsync(p, s))
	}
	require.NoError(t, d.StreamSynchronize(s))
	end.Read()
	cudart.SetTiming(false)
	timed.AddSince(&end, &start)
	spent := timed.Durations()
	require.ElementsMatch(t, []string{"cuCtxGetCurrent", "cudaFreeAsync", "cudaMallocFromPoolAsync", "cudaStreamSynchronize"}, spent.Names(),
		"every entry point called, and only those, has a time")
	start.Read()
	require.NoError(t, d.StreamSynchronize(s))
	end.Read()
	var untimed cudart.Tally
	untimed.AddSince(&end, &start)
	require.Empty(t, untimed.Durations(), "timing off again")
	require.EqualValues(t, 1, untimed.Counts()["cudaStreamSynchronize"])

	// A failed call also clears the thread's last error.
	before = cudart.Calls()
	_, err = d.MallocFromPoolAsync(1<<50, pool, s)
	require.ErrorIs(t, err, cudart.ErrOutOfMemory)
	got = cudart.Calls().Sub(before)
	require.EqualValues(t, 1, got["cudaGetLastError"])
	require.EqualValues(t, 1, got["cudaMallocFromPoolAsync"])
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.MemPoolDestroy(pool))
	require.NoError(t, d.StreamDestroy(s))
}

// TestSetDeviceAcrossDevices alternates two devices on one thread: the
// fake fails work enqueued on a stream of a device other than the thread's,
// so a call that skipped cudaSetDevice wrongly fails here.
func TestSetDeviceAcrossDevices(t *testing.T) {
	for _, tc := range []struct {
		name     string
		defines  []string
		env      string
		hasCtx   bool // cuCtxGetCurrent resolves
		ctxCheck bool // and is used
	}{
		{name: "auto", defines: []string{"FAKE_DEVICE_COUNT=2"}, hasCtx: true, ctxCheck: true},
		{name: "always", defines: []string{"FAKE_DEVICE_COUNT=2"}, env: "always", hasCtx: true},
		{name: "no-cuCtxGetCurrent", defines: []string{"FAKE_DEVICE_COUNT=2", "FAKE_NO_CTX_GET_CURRENT"}},
		// Before CUDA 12 the context may not be current after cudaSetDevice.
		{name: "cuda-11", defines: []string{"FAKE_DEVICE_COUNT=2", "FAKE_RUNTIME_VERSION=11080"}, hasCtx: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t.Setenv(cudart.EnvSetDevice, tc.env)
			rt, err := loadFake(t, tc.defines...)
			require.NoError(t, err)
			require.Equal(t, tc.hasCtx, rt.Capabilities().CurrentContext)
			var devs [2]*cudart.Device
			var streams [2]cudart.Stream
			var pools [2]cudart.MemPool
			for i := range devs {
				devs[i] = rt.Device(i)
				streams[i], err = devs[i].StreamCreate()
				require.NoError(t, err)
				pools[i], err = devs[i].MemPoolCreate()
				require.NoError(t, err)
			}
			before := cudart.Calls()
			const rounds = 8
			for range rounds {
				for i, d := range devs {
					p, err := d.MallocFromPoolAsync(256, pools[i], streams[i])
					require.NoError(t, err, "device %d", i)
					require.NoError(t, d.FreeAsync(p, streams[i]), "device %d", i)
				}
			}
			got := cudart.Calls().Sub(before)
			if tc.ctxCheck {
				// Every allocation follows a call on the other device and
				// sets its own; each free follows one on its own and sets none.
				require.EqualValues(t, 2*rounds, got["cudaSetDevice"], "%v", got)
				require.EqualValues(t, 4*rounds, got["cuCtxGetCurrent"], "%v", got)
			} else {
				require.EqualValues(t, 4*rounds, got["cudaSetDevice"], "%v", got)
				require.Zero(t, got["cuCtxGetCurrent"], "%v", got)
			}
			for i, d := range devs {
				require.NoError(t, d.StreamSynchronize(streams[i]))
				require.NoError(t, d.MemPoolDestroy(pools[i]))
				require.NoError(t, d.StreamDestroy(streams[i]))
			}
		})
	}
}

func TestSetDeviceBadSetting(t *testing.T) {
	t.Setenv(cudart.EnvSetDevice, "sometimes")
	_, err := loadFake(t)
	require.ErrorIs(t, err, cudart.ErrInvalid)
	require.ErrorContains(t, err, cudart.EnvSetDevice)
}
