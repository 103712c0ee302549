// Package alloctest is the allocator conformance suite: the single place
// that defines what a devalloc backend must do. Each backend's tests call Run
// with a Harness that opens allocators on that backend; the host backend runs
// it in CI, the CUDA backend on the GPU machine.
//
// The suite touches memory only through the allocator's own API (Memset,
// Copy, pinned buffers read from Go), so the same assertions hold for device
// memory. Streams are held back with gates (a host function enqueued on the
// stream that blocks until opened), which is how it proves that work is
// ordered by the ledger rather than by luck.
package alloctest
