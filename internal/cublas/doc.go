// Package cublas binds the cuBLAS GEMM routines that gemm needs, loaded at
// run time from DISTBUF_CUBLAS, else libcublas.so.13, libcublas.so.12, with
// hand-written prototypes checked by abicheck/cublas_abi.c. Grouped batched
// GEMM (CUDA 12.5+) is optional: HasGrouped reports it.
//
// A Handle is one cuBLAS context bound to one device and one stream; the
// caller owns it until Destroy (gemm keeps one per devalloc Stream). Scalars
// are passed by host pointer (CUBLAS_POINTER_MODE_HOST); matrices are
// column-major, as cuBLAS sees them. Every trampoline sets the device first,
// through internal/cudart's device setter (Runtime.SetDeviceFunc), so those
// calls are counted and skipped like the runtime's own.
package cublas
