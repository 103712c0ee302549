// Package cudart loads the CUDA runtime library (libcudart) at run time and
// calls the functions distbuf needs through hand-written prototypes, so
// that distbuf builds and tests with no CUDA toolkit installed. It is the
// one binding of the runtime in distbuf: devalloc's allocator,
// internal/gather's copy kernel, packing's copy fallbacks, gemm's kernels,
// internal/benchtimer's events, ranktest's call counts and the device
// setting of internal/cublas and internal/nccl all go through it.
//
// # Loading
//
// Load opens libcudart.so.13, then libcudart.so.12 (then the same names
// under /usr/local/cuda/lib64), or only the path in DISTBUF_CUDART when it is
// set. It is lazy: nothing is opened until the first call, never in init. A
// successful load is kept for the life of the process (per value of
// DISTBUF_CUDART); a failed one is not, so every caller sees the reason and
// a later call tries again. Required symbols must resolve. Optional groups
// become Capabilities, each all or nothing: the stream-ordered pool
// functions (MemoryPools); loading and launching library kernels,
// cudaLibraryLoadData, cudaLibraryGetKernel and cudaLaunchKernel, which need
// CUDA 12.8 (KernelLaunch); cudaMemcpyBatchAsync, also 12.8, whose
// prototype changed in 13.0 and is called in the form the runtime's version
// has (MemcpyBatch); the legacy interprocess functions (IPC); and the driver
// entry-point lookup. Four driver functions (cuDeviceGet, cuDeviceGetName,
// cuStreamWaitValue32, cuCtxGetCurrent) are reached through
// cudaGetDriverEntryPointByVersion (or cudaGetDriverEntryPoint before CUDA
// 12.5), never by opening libcuda. A call whose capability is absent fails
// with ErrNotSupported, naming what is missing.
//
// # Declarations
//
// cudart_decl.h holds every hand-declared constant, struct and prototype, and
// the symbol table; cudart_calls.c holds the C trampolines. The IPC handle
// types are 64 bytes, as CUDA_IPC_HANDLE_SIZE says. scripts/check-cuda-abi.sh
// compiles abicheck/cudart_abi.c, which includes the header next to the
// toolkit's own headers, on the GPU machine and fails on any difference in a
// value, a struct layout (the IPC handles' included), a prototype, or a
// symbol the library does not export.
//
// # Interprocess memory and events
//
// Memory from Device.Malloc (cudaMalloc, not a pool) is exported with
// IpcGetMemHandle and mapped in another process with IpcOpenMemHandle; an
// event from EventCreateInterprocess is exported with IpcGetEventHandle and
// opened with IpcOpenEventHandle, after which both processes may record it,
// query it, synchronise on it and make streams wait for it. A handle is
// opened only in another process than the one that made it. Opening a
// memory handle is slow on a GPU, far slower than any copy through it
// (docs/PERFORMANCE.md), so a caller opens each peer's memory once and keeps
// the address.
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
// cudaSetDevice and cuCtxGetCurrent included (those made for cuBLAS and
// NCCL through SetDeviceFunc too), since the process started:
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
// # Testing without a GPU
//
// testdata/fakecudart.c is a fake libcudart that serves every symbol the
// table binds and runs "device" work on the host: streams run in order on
// threads of their own, kernels the fake NVRTC (testdata/fakenvrtc.c)
// compiled run as host code, and cudaMalloc memory and interprocess events
// live in shared memory so that IPC works between processes. The fake
// cuBLAS (testdata/fakecublas.c) works in its stream's order on top of it.
// Package cudarttest builds them for tests.
//
// # Ownership
//
// A Runtime, its function table and the device setter of SetDeviceFunc live
// until the process exits; so do kernels from LoadKernels, whose library is
// never unloaded. Streams, events (timing, interprocess or opened from a
// handle), pools and memory obtained through a Device belong to the caller,
// who must destroy or free them; memory opened from a handle is released
// with IpcCloseMemHandle, and an exporting process frees its memory only
// once every peer has closed it.
package cudart
