// Package packing lays out many small blocks in one buffer: one allocation,
// one strided batch per shape class, one message per destination rank.
//
// # Layout
//
// NewPlan maps block descriptors (id, dtype, rows, cols, destination rank)
// to byte offsets in two passes, as DBCSR does: the first classifies every
// block into its (destination, dtype, shape) class and counts it, the second
// prefix-sums the classes into offsets. Each destination is a group with its
// own buffer; inside a group, classes come in order of first appearance,
// each starting on an Options.Align boundary (256 B by default), and a
// class's blocks follow one another in list order at a constant stride (the
// block size rounded up to Options.BlockAlign, by default tightly packed),
// so that every class is one strided batch for gemm. Padding is zero. Blocks
// are row-major. The plan is deterministic: the same list and options give
// the same layout on every rank. A plan stores 4 bytes per block (the class
// and rank in 32 bits) and the ids, as two words when they count in steps
// (as when a solver numbers its blocks in list order), else 8 bytes per
// block, and computes offsets from its class table, so planning and walking
// 10^5 blocks costs a few nanoseconds per block (BenchmarkPlanViews), and
// 2000 blocks of a few dozen classes about ten (BenchmarkPlanTinyRows).
//
// # Buffers, views and lifetimes
//
// Alloc (AllocGroups for several destinations) makes a Coalesced with one
// devalloc allocation per group, whatever the number of blocks; AllocCopy
// makes one laid out as another and filled from it by one copy (operands
// packed in pinned memory, moved to the device). A View is a
// two-word handle on one block: id, offset, shape, dtype, address, and on
// host-accessible memory typed slices (Float64s...). Views own nothing;
// Coalesced.All walks them without allocating, View(k) checks its index,
// and Locate(k) gives a block's class and offset alone, for planners.
// Work on views is declared on the Coalesced (Read/Write, then Access.Done,
// the devalloc ledger), so Free, called once, releases the memory only after
// the last completion of any view's work. After Free, the Coalesced and every
// view report ErrFreed. Wrap turns an existing buffer, such as a received
// message, into a Coalesced without copying, WrapAt one whose layout starts
// after a header, and AllocPrefixed reserves room for a header before a
// group's layout (Coalesced.Start says where the layout begins). Plan.Joined
// lays every group out in one buffer, each after a prefix, as one
// single-group plan with the same plan indices: one allocation, one padding
// clear and one operand for work that fills every destination at once;
// Coalesced.Parts gives the groups over it, owning nothing, valid while the
// joined buffer is, whose Free ends them. WrapShared makes Coalesced that
// own one buffer together (a Share), freed with the last of them: the
// receive buffer of several messages. FromManifest rebuilds the plan
// of a received manifest after checking it (bounds, alignment, overlaps,
// duplicate ids); Manifest lists what a receiver needs, and Detached is
// the plan a receiver rebuilds, made from the sender's plan without the
// checks (for a group a rank delivers to itself).
//
// Host code reads and fills blocks with Coalesced.OnHost, which runs a
// function on the blocks as typed Go slices (HostBlocks) in the order of a
// stream, the same on every backend: in place under a Hold where Go
// addresses the memory (the host backend, pinned memory), and on device
// memory through a pinned staging copy, brought in on the stream first and,
// for a write, copied back on it, the staging buffer freed in stream order
// after that copy. The slices are valid only while the function runs. Code
// written on a laptop with OnHost runs unchanged on a GPU; View's typed
// slices work on host-accessible memory only.
//
// # Pack and unpack
//
// A Mover copies blocks between their scattered locations (one Ref, a
// buffer and offset, per block) and the Coalesced, in stream order with
// ledger declarations on every buffer involved. On host memory the copies
// run on goroutines (errgroup), balanced by bytes. On device memory a
// gather/scatter kernel reads an offset table (scattered address, block
// address, bytes; uploaded once per Mover) and moves 16 bytes per thread
// when alignment allows. The kernel is CUDA C++ kept in this package and
// compiled at run time by NVRTC for the device's own architecture, then
// loaded with cudaLibraryLoadData and launched with cudaLaunchKernel (CUDA
// 12.8+): no toolkit is needed at build time and no PTX is shipped, at the
// cost of one compilation (tens of milliseconds) per process and device.
// When NVRTC or the launch API is missing, CopyAuto falls back to one
// cudaMemcpyBatchAsync (CUDA 12.8+, 13 signature chosen by the runtime
// version), else to one cudaMemcpyAsync per block, and says why in
// Mover.FallbackReason. CopySpans runs the same kernel over any list of
// spans, its list read from pinned memory: one launch, where the time of a
// cudaMemcpyBatchAsync grows with its copies (msg's window copies under
// MPS). PackHost and UnpackHost take Go slices; on a device
// they pack into pinned memory and move it with one copy, as Transfer does
// for a buffer packed on the host with AllocPinned.
package packing
