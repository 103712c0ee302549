package devalloc

import (
	"fmt"

	"github.com/distbuf/distbuf"
)

// envCUDAHostWait chooses how a CUDA stream waits for the host (an outside
// agent's Hold, or a function given to Stream.Enqueue): "memop" (the
// default when the driver offers it), "callback", or "auto" (doc.go).
//
// With memop, the stream waits on a word of mapped pinned memory with
// cuStreamWaitValue32, and a goroutine owned by the stream writes the word
// when the hold is released or the function has run; the runtime's
// callback thread only hands over a signal and never blocks. With
// callback, the wait is a cudaLaunchHostFunc that blocks until the release
// and Enqueue runs the function on the runtime's callback thread. Host
// functions of all streams may share that one thread, so a blocked hold or
// a long function delays every stream's host functions, and functions that
// wait for each other across streams can deadlock: use callback only where
// stream memory operations are missing.
const envCUDAHostWait = "DISTBUF_CUDA_HOSTWAIT"

// DeviceCount reports how many CUDA devices the runtime sees, for placing
// ranks on devices. It loads the CUDA runtime on first use. When CUDA is
// unavailable (no cgo, no libcudart, no device, an insufficient driver) it
// returns 0 and an error matching distbuf.ErrUnavailable that says why.
func DeviceCount() (int, error) {
	if cudaDeviceCount == nil {
		return 0, fmt.Errorf("devalloc: CUDA backend not compiled in (build with cgo): %w", distbuf.ErrUnavailable)
	}
	n, err := cudaDeviceCount()
	if err != nil {
		return 0, fmt.Errorf("devalloc: count CUDA devices: %w", err)
	}
	return n, nil
}

// cudaDeviceCount is set by the CUDA backend when it is compiled in.
var cudaDeviceCount func() (int, error)

// driverCalls reports how many calls the process has made through distbuf's
// CUDA loader to each runtime and driver entry point since it started, by
// name (cudaMallocFromPoolAsync, cudaSetDevice, cuCtxGetCurrent...), over
// every allocator and thread. The difference of two snapshots is what the
// code between them cost in driver calls, e.g. per Alloc and per Free; the
// tests that hold devalloc to its per-call costs read it. It is empty when
// the CUDA backend is not compiled in or never used.
func driverCalls() map[string]uint64 {
	if cudaDriverCalls == nil {
		return map[string]uint64{}
	}
	return cudaDriverCalls()
}

// cudaDriverCalls is set by the CUDA backend when it is compiled in.
var cudaDriverCalls func() map[string]uint64

// cudaTestPoolOff forces the CUDA backend's cudaMalloc fallback; only tests set it.
var cudaTestPoolOff bool
