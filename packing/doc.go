// Package packing lays out many small blocks in one buffer: one allocation,
// one strided batch per shape class, one message per destination rank.
// It owns layouts (Plan) and the buffers it allocates or wraps
// (Coalesced); it allocates through devalloc, and the buffers are freed
// in devalloc's stream order.
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
// Alloc is the one allocation: a Coalesced holding one group of a plan in
// one devalloc allocation, whatever the number of blocks, with its padding
// cleared. A Coalesced owns its buffer and Free, called once, gives it
// back after the last completion the devalloc ledger recorded on it; after
// Free the Coalesced and every view report distbuf.ErrFreed. Work on the
// blocks is declared on Buffer (Read/Write, then Access.Done), so that Free
// never releases memory still in use.
//
// A plan with one group (one Dest for every block) is what Alloc takes
// without options. The buffers of a plan with several destination groups,
// to exchange, come from msg.AllocSend, which reserves room for each
// message's manifest before the blocks (AllocOptions Group and Prefix are
// the primitive it is built on); Plan.Joined lays every group out in one
// buffer instead, each after a prefix, as a single-group plan with the same
// plan indices: one allocation, one padding clear and one gemm operand for
// work that fills every destination at once, and Coalesced.Parts gives
// each group over it, owning nothing, valid while the joined buffer is.
// AllocOptions.Pinned lays a group out in page-locked host memory, and
// AllocOptions.CopyOf fills a new buffer by one copy of another of the same
// layout: operands packed on the host in pinned memory, then uploaded.
//
// A View is a two-word handle on one block, owning nothing: its Desc (id,
// dtype, shape, destination) and its Offset from the Coalesced's Start.
// Coalesced.All walks the views without allocating, View(k) checks its
// position, Position(id) finds a block's position by id, and Locate(k)
// gives a block's class and offset alone, for planners; a Locator does the
// same with the buffer checked once, for a planner's loop over every block.
// A group's positions follow its blocks in list order, and
// Plan.GroupPosition gives the group and position of a block of the list,
// before any buffer exists: how a program that keeps each block's storage
// in list order builds a group's Refs for a Mover. When the list gives the
// groups one after another (destinations never decreasing, as A's blocks
// before B's in a joined operand), a position maps to a plan index by an
// addition, and neither Parts nor Alloc of a group builds a member list.
//
// Wrap makes a Coalesced over a buffer that already holds a layout, such
// as a received message, without copying; its Free frees that buffer, or
// calls the release it was given where several share one buffer.
// FromManifest rebuilds the plan of a received manifest after checking it
// (bounds, alignment, overlaps, duplicate ids); Plan.Manifest lists what a
// receiver needs, and Plan.Detached is the plan a receiver rebuilds, made
// from the sender's plan without the checks (for a group a rank delivers
// to itself).
//
// # Host access
//
// Host code reads and fills blocks with Coalesced.OnHost, which runs a
// function on the blocks as typed Go slices (HostBlocks, by position) in
// the order of a stream, the same on every backend: in place under a Hold
// where Go addresses the memory (the host backend, pinned memory), and on
// device memory through a pinned staging copy, brought in on the stream
// first and, for a write, copied back on it, the staging buffer freed in
// stream order after that copy. The slices are valid only while the
// function runs. Code written on a laptop with OnHost runs unchanged on a
// GPU. PackHost and UnpackHost copy whole Go byte slices, one per block,
// in and out in the order of a stream without waiting for it; on a device
// they go through pinned memory and one copy.
//
// # Pack and unpack
//
// A Mover copies blocks between their scattered locations (one Ref, a
// buffer and offset, per block) and the Coalesced, in stream order with
// ledger declarations on every buffer involved, as often as asked: it
// checks the Refs and builds its tables once. On host memory the copies
// run on goroutines (errgroup), balanced by bytes. On device memory a
// gather/scatter kernel (internal/gather) reads an offset table (scattered
// address, block address, bytes; uploaded once per Mover) and moves 16
// bytes per thread when alignment allows. The kernel is CUDA C++ compiled
// at run time by NVRTC for the device's own architecture, then loaded with
// cudaLibraryLoadData and launched with cudaLaunchKernel (CUDA 12.8+): no
// toolkit is needed at build time and no PTX is shipped, at the cost of one
// compilation (tens of milliseconds) per process and device. When NVRTC or
// the launch API is missing, a Mover falls back to one
// cudaMemcpyBatchAsync (CUDA 12.8+, 13 signature chosen by the runtime
// version), else to one cudaMemcpyAsync per block, and Mover.Method says
// which and why.
//
// # Errors
//
// Errors name the problem after "packing: " and match a sentinel of the
// root package distbuf with errors.Is: distbuf.ErrInvalid for a bad
// argument (a bad shape or dtype, a duplicate id, a layout too large, a
// misaligned offset or prefix, an index out of range, overlapping blocks;
// BlockError names the descriptor or manifest entry at fault),
// distbuf.ErrFreed for use after Free, distbuf.ErrUnavailable for a device
// copy this machine cannot do (no CUDA runtime, a runtime too old). Errors
// of devalloc pass through wrapped.
package packing
