// Package allocbench is the allocator benchmark behind devalloc's
// BenchmarkAlloc* benchmarks: one rank's allocation patterns (Alloc+Free
// pairs and a DMRG solve's cycle of large and tiny buffers) under each
// pool configuration, against baselines measured in the same process: the
// same pairs and cycles written in C on a private pool (cgo, which test
// files cannot hold), cudaMalloc called directly, and a cudaMemPool
// called directly.
//
// A Session owns one allocator of its backend, used to learn the backend
// and device, and the medians measured so far; each Run opens the
// allocators and C baseline it measures and closes them before it
// returns. Results are plain values. Nothing here is safe for concurrent
// use: a benchmark runs one measurement at a time, and Run shrinks the
// package's counts to the Measure's N for its duration.
package allocbench
