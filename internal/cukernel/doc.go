// Package cukernel loads the small part of the CUDA runtime (libcudart) that
// packing and gemm need beyond devalloc: loading a compiled kernel image and
// launching it (cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel,
// CUDA 12.8+), batched and per-block memcpy for the copy fallbacks, and
// events for timing benchmarks. Test and benchmark helpers (cudaMalloc,
// cudaMemcpy) let the loaders be checked on a GPU without devalloc.
//
// The library is opened on first use (never in init) from DISTBUF_CUDART,
// else libcudart.so.13, libcudart.so.12: the same names devalloc's loader
// tries, so both bind the one runtime in the process. It stays loaded for the
// life of the process. Every trampoline sets the device first, because the
// runtime's current device is per OS thread and goroutines migrate.
//
// Ownership: kernels loaded with LoadKernel live as long as the process;
// events belong to the caller until DestroyEvent; device memory from Malloc
// until Free.
package cukernel
