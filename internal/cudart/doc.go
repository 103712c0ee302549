// Package cudart loads the CUDA runtime library (libcudart) at run time and
// calls the few functions distbuf needs through hand-written prototypes, so
// that distbuf builds and tests with no CUDA toolkit installed.
//
// # Loading
//
// Load opens libcudart.so.13, then libcudart.so.12 (then the same names
// under /usr/local/cuda/lib64), or only the path in DISTBUF_CUDART when it is
// set. It is lazy: nothing is opened until the first call, never in init. A
// successful load is kept for the life of the process (per value of
// DISTBUF_CUDART); a failed one is not, so every caller sees the reason and
// a later call tries again. Required symbols must resolve; the stream-ordered
// pool functions and the driver entry-point lookup are optional and become
// Capabilities. Four driver functions (cuDeviceGet, cuDeviceGetName,
// cuStreamWaitValue32, cuCtxGetCurrent) are reached through
// cudaGetDriverEntryPointByVersion (or cudaGetDriverEntryPoint before CUDA
// 12.5), never by opening libcuda.
//
// # Declarations
//
// cudart_decl.h holds every hand-declared constant, struct and prototype, and
// the symbol table. scripts/check-cuda-abi.sh compiles abicheck/cudart_abi.c,
// which includes that header next to the toolkit's own headers, on the GPU
// machine and fails on any difference.
//
// # Threads and devices
//
// The runtime's current device belongs to the OS thread, and goroutines move
// between threads, so every call through a Device sets the device in the same
// C function that makes the call. Runtime calls act on the driver context
// current to the thread, and cudaSetDevice makes the device's primary context
// current; so when cuCtxGetCurrent shows that context already current (the
// usual case: one device per process, or a thread that stays on one), the
// call skips cudaSetDevice, which costs as much as a small driver call. The
// primary context of each device is learnt from cuCtxGetCurrent right after
// a cudaSetDevice, which since CUDA 12 initialises that context and makes it
// current (with an older runtime every call sets the device).
// DISTBUF_CUDA_SETDEVICE=always restores the unconditional cudaSetDevice.
// cudaDeviceReset, which destroys primary contexts, must not
// be called while the process uses this package. A failed call clears the
// thread's last-error state so it cannot be misattributed to later work.
//
// # Counting calls
//
// Calls reports how many calls the trampolines made to each entry point,
// cudaSetDevice and cuCtxGetCurrent included, since the process started:
// what a piece of code costs in driver calls can be read as the difference
// of two snapshots. Each OS thread counts into a block of its own, so
// counting adds a plain increment per call and no contention.
//
// # Errors
//
// A failed call returns an *Error carrying the runtime's error name
// (cudaGetErrorName). It matches ErrOutOfMemory for
// cudaErrorMemoryAllocation, and ErrUnavailable when there is no usable
// device or driver (cudaErrorNoDevice, cudaErrorInsufficientDriver and
// similar). A load failure is a *LoadError matching ErrUnavailable and the
// internal/dl error behind it.
//
// # Ownership
//
// A Runtime and its function table live until the process exits. Streams,
// events, pools and memory obtained through a Device belong to the caller,
// who must destroy or free them.
package cudart
