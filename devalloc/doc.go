// Package devalloc is one rank's memory manager: a stream-ordered allocator
// on a private CUDA memory pool (cudaMallocFromPoolAsync / cudaFreeAsync),
// with a cudaMalloc fallback and a host backend for machines without a GPU.
//
// # Backends
//
// Open picks the backend from Options.Backend, else DISTBUF_BACKEND, else
// auto. Auto uses CUDA when a usable GPU is present and otherwise the host
// backend; the reason is passed to Options.Warn (standard error by default)
// and kept in Info.FallbackReason, and Stats.Fallbacks counts it. On CUDA,
// allocations come from a private stream-ordered pool, or from the
// cudaMalloc fallback where the pool is missing or turned off (pool:off),
// which is reported the same way. Allocator.Info reports the backend in use
// (Info.Backend, Info.Pool), the device, the configuration in effect and the
// resolved budget. The host backend has the same semantics as CUDA: memory
// comes from an mmap pool off the Go heap (C and MPI may hold pointers into
// it), and each stream runs its work in order on its own goroutine. Before
// opening one allocator per rank on a node with several GPUs, DeviceCount
// and cluster's placement helper choose Options.Device.
//
// # Environment
//
// Open reads these variables where Options leaves the matching field empty:
//
//   - DISTBUF_BACKEND: auto, cuda or host (Options.Backend).
//   - DISTBUF_ALLOC_CONF: the configuration (Options.Config) in the syntax
//     of ParseConfig, e.g. "policy:retain,prime:2GiB,limit:80%".
//   - DISTBUF_CUDA_HOSTWAIT: how a CUDA stream waits for the host (a Hold,
//     or a function given to Stream.Enqueue): memop (cuStreamWaitValue32 on
//     mapped pinned memory; the default where the driver offers it),
//     callback (a blocking cudaLaunchHostFunc, which shares the runtime's
//     one callback thread with every stream: a blocked hold delays them
//     all), or auto.
//   - DISTBUF_CUDART: the path of libcudart to load (internal/cudart).
//   - DISTBUF_HOST_MEMORY: the host backend's device memory, a size (or
//     none, the default): what the host pools of the process may reserve
//     together, as a GPU's memory bounds the pools of the ranks that share
//     it. Info.TotalMemory reports it and an allocation beyond it climbs the
//     out-of-memory ladder, so that a run meant to fill a device (or a test
//     of the policies) behaves on a machine without one as it would there.
//
// # Errors
//
// Every error names devalloc and the problem ("devalloc: double free of
// buffer #3 (4 KiB): distbuf: buffer already freed") and matches one of the
// root package's sentinels with errors.Is: distbuf.ErrInvalid (a bad
// argument), ErrBadConfig (a bad Config, DISTBUF_* value or Options field),
// ErrClosed (use after Close), ErrFreed (use of a buffer after Free),
// ErrOutOfMemory (the *OutOfMemoryError), ErrUnavailable (no GPU, no CUDA
// runtime, or a call this backend or runtime does not offer),
// ErrConflict (an access that would race with one still open),
// ErrNotHostAccessible (Buffer.Bytes of device memory) and ErrLeak (the
// *LeakError from Close).
//
// # Ownership and lifetimes
//
// The Allocator owns its streams, its pools and the memory of every Buffer.
// The caller owns a *Buffer from Alloc until Free; after Free every method of
// the Buffer returns an error matching distbuf.ErrFreed, a second Free
// included. Close destroys the
// streams and pools and reports buffers never freed as a *LeakError; their
// memory is deliberately not released so stale pointers cannot crash.
//
// Close lets operations already in flight finish and makes later ones
// return distbuf.ErrClosed; it holds no lock while it waits for them, so an
// out-of-memory callback may free (or even close) while Close runs. A
// stream waiting for an outside agent's Hold stops waiting when Close
// begins, so that a hold never released cannot keep Close (or a Synchronize
// in flight) waiting for ever: the work behind the wait runs, the stream's
// next synchronisation returns an error matching distbuf.ErrClosed that says the
// wait was abandoned, and Hold.Release after Close returns distbuf.ErrClosed. A
// function given to Stream.Enqueue that never returns still blocks Close.
//
// # The ledger (the token pins storage)
//
// Each Buffer records its last writer and the readers since. Before
// enqueueing work on a stream, declare it with Read or Write: the stream is
// made to wait (cudaStreamWaitEvent, never the host) for the last writer, and
// for a write also for every reader. After enqueueing, Access.Done records the
// completion; DoneAll ends several accesses of one stream's work (a GEMM's
// operands) with one event for all. devalloc's own work (the allocation,
// Stream.Memset and Stream.Copy) ends in the stream's mark instead: an event
// recorded only when another stream or a hold must wait for it, so that
// allocating, filling and freeing on one stream costs no event at all
// (Stats.LedgerEvents). A stream records its mark before it waits for the
// host and before a declared access begins, so a mark never covers work that
// waits for an outside agent. The ledger's events are numbered in each
// stream's order, and a stream that has waited for one of another stream's
// waits for none recorded before it (Stats.WaitsSkipped); likewise the host,
// once it has seen one of a stream's ledger events complete (a hold's Wait, a
// query before a free, Stream.Synchronize), neither waits for nor queries an
// earlier one (Stats.HostWaitsSkipped). Undeclared work on the allocating
// stream is still ordered before the free (as with cudaFreeAsync on that
// stream), but other streams and holds see only declared work. An agent
// outside the streams, such as an MPI request, takes a Hold: a send is a
// reader and a receive a writer until Release. Free never blocks the host:
// a reclamation stream waits for every recorded completion and then releases
// the memory, and a buffer still held is released when its last hold is.
//
// # Policy, budget and out-of-memory
//
// Retain sets the pool's release threshold to the maximum, so freed memory
// stays for cheap reuse. AggressiveFree lowers it and returns memory at
// synchronisation points and at EndPhase, leaving headroom for the largest
// runs. Auto, the default, retains as Retain does until the device's memory
// is tight: less of it free than the larger of Config.Headroom (a sixteenth
// of the device unless set) and twice what the pool keeps unused, which is
// the room a working set that changes shape needs beside what it keeps.
// Then it gives back what the pool does not use, at two moments: at
// EndPhase, unless the phases have held still (the peak bytes of live
// buffers no larger than the phase before's, twice in a row: a run at one
// size keeps its memory from its third phase on, one that grows gives back
// at each phase end; once they hold still it looks at the device at most
// every 100 ms, so a run at one size pays no driver call for its phase
// ends), and when a new largest allocation grew the pool,
// which means the memory it kept did not fit (one pool query, made only for
// an allocation of at least 1 MiB larger than any before). On a device that
// several ranks share, a pool cannot reclaim what another rank's pool keeps:
// this is what lets every rank grow as far as under AggressiveFree, where
// Retain stops a step earlier. SetPolicy switches while running, and
// Info.Config.Policy reports the one in force. Config.Prime reserves memory
// once, at Open: by default a sixteenth of the device on the CUDA pool
// under a retaining policy (DefaultPrimeFraction), so that the first solves
// find their memory there; Auto gives it back like any unused memory once
// the device is tight. Trim releases unused memory. A per-rank budget (Config.Limit, or
// Config.LimitFraction of the device's memory) is independent of the
// policy: it caps the bytes of live buffers. When an allocation fails, Alloc
// synchronises and retries, trims and retries, calls Options.OnOutOfMemory
// with the report so far (it may free and ask for another attempt),
// and finally returns an *OutOfMemoryError matching distbuf.ErrOutOfMemory.
//
// The callback runs outside the allocator's close guard: it may call any
// method, Free and Close included; an Alloc whose allocator was closed
// meanwhile returns distbuf.ErrClosed.
//
// LargestAlloc measures the largest allocation that would succeed now
// without the ladder, beside Stats' reserved and used bytes: a pool whose
// unused reservation cannot serve a request it would hold has fragmented.
//
// Configuration comes from Options.Config, else DISTBUF_ALLOC_CONF, e.g.
// "policy:retain,prime:2GiB,limit:80%"; see ParseConfig.
//
// Pinned host memory for staging comes from AllocPinned: it is reused from
// buckets, never allocated on the hot path once warm.
//
// # What each call costs
//
// Once the pool is warm, on one stream and one thread, an Alloc is one
// cudaMallocFromPoolAsync, a Memset one cudaMemsetAsync and a Free one
// cudaFreeAsync on the allocating stream, each after a cuCtxGetCurrent that
// spares the cudaSetDevice (see internal/cudart); no event is recorded and
// no pool attribute is read. Under Retain a Free on its allocating stream
// keeps the block instead (Config.Cache bounds the bytes kept, oldest given
// back first, and no block above a sixteenth of it is kept; the same holds
// under Auto, which retains), and the next
// Alloc of the same size on that stream takes it without a driver call:
// what the pool would hand back there, since work after the Alloc runs
// after the work before the Free. Kept blocks go back to the pool with
// cudaFreeAsync on their stream before it is destroyed, at Trim and on the
// out-of-memory ladder, when the policy leaves Retain, and past the bound
// (Stats.ReuseKept, ReuseHits). A block whose Free goes to the
// reclamation stream (its last use was on another stream, not yet known to
// have run) is kept there with an event recorded at its free, in place of
// the cudaFreeAsync, and serves the next Alloc of its size on any stream
// once a query finds that event complete: the fate of a received message,
// written on the exchanger's stream and read on the caller's. Until then
// kept blocks are memory the pool cannot
// hand to other sizes or streams, at most the bound: set a smaller one, or
// cache:off, where that matters. Under MPS a pool allocation costs the
// client 10-20 us, which a solve that allocates the same buffers every
// iteration then pays once. On the cudaMalloc fallback, once its cache
// holds the sizes in use (Config.Cache), an Alloc and a Free make no driver
// call at all: memory freed on a stream goes to the next allocation on that
// stream that it fits. Alloc makes one Go object, the Buffer, and Free
// none; the live buffers sit in a table of slots that a Free empties and
// the next Alloc fills. Alloc takes the allocator's lock once (it counts
// the stream's current mark too), Memset the buffer's lock, Free the
// buffer's and the allocator's. Work across streams pays for its events
// (Stats.LedgerEvents). The package's tests hold these costs to account by
// counting the driver calls made per Alloc and per Free.
//
// # Memory freed in a stream's order
//
// As with cudaFreeAsync, memory freed on a stream is reusable at once by
// allocations on that same stream, whose work runs after the free, before
// the stream has reached it. The host backend's pool does the same: when
// the stream is busy at a free (with work the host has run ahead of), the
// free waits in the stream but the memory goes to the next allocation on
// that stream that it fits (one asking at least half of it). Without that, a solve that begins while the
// stream is still busy with the last one would find the last solve's memory
// not yet free and reserve it again, and under Retain the pool would keep
// the extra reservation for good: a reservation that creeps up, one 2 MiB
// segment at a time, at the rare solve boundaries where the stream lags,
// with no fragmentation involved. Memory freed on one stream reaches another
// only once the free has run.
package devalloc
