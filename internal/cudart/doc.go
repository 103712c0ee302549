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
// Capabilities. Three driver functions (cuDeviceGet, cuDeviceGetName,
// cuStreamWaitValue32) are reached through cudaGetDriverEntryPointByVersion
// (or cudaGetDriverEntryPoint before CUDA 12.5), never by opening libcuda.
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
// C function that makes the call. A failed call clears the thread's
// last-error state so it cannot be misattributed to later work.
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
