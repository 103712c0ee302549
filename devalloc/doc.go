// Package devalloc is one rank's memory manager: a stream-ordered allocator
// on a private CUDA memory pool (cudaMallocFromPoolAsync / cudaFreeAsync),
// with a cudaMalloc fallback and a host backend for machines without a GPU.
//
// # Backends
//
// Open picks the backend from Options.Backend, else DISTBUF_BACKEND, else
// auto. Auto uses CUDA when a usable GPU is present and otherwise the host
// backend; the reason is passed to Options.Warn (standard error by default)
// and kept in FallbackReason, and Stats.Fallbacks counts it. Kind reports the
// backend in use. The host backend has the same semantics as CUDA: memory
// comes from an mmap pool off the Go heap (C and MPI may hold pointers into
// it), and each stream runs its work in order on its own goroutine.
//
// # Ownership and lifetimes
//
// The Allocator owns its streams, its pools and the memory of every Buffer.
// The caller owns a *Buffer from Alloc until Free; after Free every method of
// the Buffer returns ErrFreed, a second Free included. Close destroys the
// streams and pools and reports buffers never freed as a *LeakError; their
// memory is deliberately not released so stale pointers cannot crash.
//
// # The ledger (the token pins storage)
//
// Each Buffer records its last writer and the readers since. Before
// enqueueing work on a stream, declare it with Read or Write: the stream is
// made to wait (cudaStreamWaitEvent, never the host) for the last writer, and
// for a write also for every reader. After enqueueing, Access.Done records the
// completion. devalloc's own work (the allocation, Stream.Memset and
// Stream.Copy) ends in the stream's mark instead: an event recorded only when
// another stream or a hold must wait for it, so that allocating, filling and
// freeing on one stream costs no event at all (Stats.LedgerEvents). A stream
// records its mark before it waits for the host and before a declared access
// begins, so a mark never covers work that waits for an outside agent.
// Undeclared work on the allocating stream is still ordered
// before the free (as with cudaFreeAsync on that stream), but other streams
// and holds see only declared work. An agent
// outside the streams, such as an MPI request, takes a Hold: a send is a
// reader and a receive a writer until Release. Free never blocks the host:
// a reclamation stream waits for every recorded completion and then releases
// the memory, and a buffer still held is released when its last hold is.
//
// # Policy, budget and out-of-memory
//
// Retain (the default) sets the pool's release threshold to the maximum, so
// freed memory stays for cheap reuse. AggressiveFree lowers it and returns
// memory at synchronisation points and at EndPhase, leaving headroom for the
// largest runs; SetPolicy switches while running. Prime reserves memory once;
// Trim releases it. A per-rank budget (Config.Limit) is independent of the
// policy: it caps the bytes of live buffers. When an allocation fails, Alloc
// synchronises and retries, trims and retries, calls Options.OnOutOfMemory,
// and finally returns an *OutOfMemoryError matching ErrOutOfMemory.
//
// Configuration comes from Options.Config, else DISTBUF_ALLOC_CONF, e.g.
// "policy:retain,prime:2GiB,limit:80%"; see ParseConfig.
//
// Pinned host memory for staging comes from AllocPinned: it is reused from
// buckets, never allocated on the hot path once warm.
package devalloc
