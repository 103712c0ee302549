// Package gemm multiplies blocks of coalesced buffers in as few launches as
// possible: C = alpha*op(A)*op(B) + beta*C over a list of (A, B, C) block
// triples.
//
// # Layout and semantics
//
// Blocks are row-major, as packing lays them out and as Go code indexes
// them. cuBLAS is column-major; a row-major m x n block is the column-major
// n x m transpose with the same leading dimension, so the CUDA engine issues
// C^T = op(B)^T * op(A)^T: B first, the operations unchanged, m and n
// swapped. No data is transposed. Op is NoTrans or Trans (no conjugate
// transpose: a conjugated operand has no column-major equivalent without a
// copy). Products name blocks by id (Problem.Blocks, BlockTriple: the ids
// of packing.Desc) or by their position in the operand's group
// (Problem.Triples, Triple: Coalesced.View's index, what a walk of the
// views in order has at hand; the plan works in positions and resolves ids
// once). A plan has one dtype: a problem of float64 blocks and one of
// complex128 blocks are two plans. When a C block appears
// in several triples, the result is beta*C + the sum of all its products:
// the triples are split into conflict-free waves (a C block's n-th
// occurrence goes in wave n-1, in list order), beta applies in wave 0 and
// later waves accumulate with beta = 1.
//
// # Planning once per block structure
//
// NewPlan validates the list (indices, shapes, one dtype, real scalars for
// real dtypes, no C block sharing memory with an input) and cuts each wave
// into launches. A plan depends on the operands' layouts (their packing
// plans and groups), the operations and the triples, not on the buffers:
// Engine.RunOn runs it on any buffers laid out alike, with its own alpha and
// beta, and refuses others ("operand layout differs from the plan's": a
// changed block structure, plan again). A solver whose structure repeats every sweep plans each structure
// once, as msg.Pattern does for the exchange; PlansBuilt counts the plans a
// process has made. Planning reads each block's class and offset once
// (packing.Locator, each operand checked once), numbers shapes once per
// pair of A and B classes, and buckets the products by wave, kind and
// shape in one counting pass (O(n); a bucket out of C order is sorted),
// with no reflection; a plan keeps no copy of the triples (an error of a
// later run finds its triple again from the product's offsets).
// BenchmarkPlan measures it per block.
//
// Errors name the problem ("gemm: C block aliases an input", "gemm:
// mismatched shapes", "gemm: operand layout differs from the plan's") and
// match distbuf.ErrInvalid; a backend that cannot run a plan matches
// distbuf.ErrUnavailable, and use of a closed Engine or Plan
// distbuf.ErrClosed.
//
// # Launches
//
// Under Auto, the products whose dimensions are all at most
// Options.SmallMax (DefaultSmallMax, 64: the crossover measured by
// `go test -bench KernelCrossover ./gemm`) go to distbuf's own kernel, one
// launch per wave: a warp per product up to 16 rows and columns (the DMRG
// spectrum's tiny blocks), a thread block in 64 x 64 shared-memory tiles
// above. A shape of the latter kind that 1024 or more products share goes
// to cuBLAS instead, whose batched call is faster on long uniform runs
// (`go test -bench UniformCrossover ./gemm`). The kernel reads each product's offsets and shape from the plan's
// parameter stack, uploaded to the device on the first run and kept there,
// and the operands' addresses from its arguments, so a run on new buffers
// moves nothing from the host; it is CUDA C++ compiled at run time by NVRTC,
// as packing's gather kernel is. The others take cuBLAS: a same-shape run
// whose A, B and C offsets advance by constant strides is one strided
// batched call (a packing shape class is exactly that); a same-shape run at
// arbitrary offsets is one pointer-array batched call; a wave of several
// real shapes is one grouped batched call (cublas{S,D}gemmGroupedBatched,
// CUDA 12.5+, run as per-shape calls when the library lacks it); complex
// dtypes get one batched call per shape. The pointer arrays are derived on
// the device from the parameter stack when the buffers' addresses change.
// PerShape and Grouped use cuBLAS alone, Kernel the kernel alone, and Loop
// (one call per triple) is the baseline the batches are measured against.
// Where the kernel cannot load (no NVRTC, a runtime older than 12.8) its
// launches run as grouped cuBLAS calls; Engine.KernelStatus says why.
// Plan.Launches and Plan.Summary report the launches.
//
// # Engines and lifetimes
//
// An Engine runs plans in the order of one devalloc Stream: on the host
// backend with gonum's BLAS (gonum.org/v1/gonum/blas/gonum, row-major as
// the blocks are: an importer compiles gonum's blas packages and their
// kernels, nothing of gonum.org/v1/plot, which gonum's go.mod lists), and
// plain loops for the products whose dimensions are all at most 8 (7 in
// float32), where a BLAS call costs more than it saves (`go test -bench
// HostGemm ./gemm`), in one stream function per wave whose products run
// in parallel goroutines (errgroup);
// on CUDA with the kernel and cuBLAS,
// loaded at run time, through one cuBLAS handle bound to the stream, owned
// by the Engine until Close. RunOn declares the reads of A and B and the
// write of C in the buffers' ledgers, so it follows earlier work on any
// stream and the buffers' Free waits for it. A Plan refers to the operands
// it was planned on without owning them (Engine.Run runs it on them). Its
// device memory (the parameter stack and pointer arrays) belongs to the
// allocator of the first engine that runs it, is read in stream order by
// that engine's stream and through the ledger by others, and is released by
// Plan.Close, which must come before the allocator closes. Close also gives
// the plan's host memory (its products) to the next plan made, which then
// writes into memory still in cache; a closed plan keeps its Summary. Runs
// of one plan are serialised.
package gemm
