// Package gemm multiplies blocks of coalesced buffers in as few library
// calls as possible: C = alpha*op(A)*op(B) + beta*C over a list of (A, B, C)
// block triples.
//
// # Layout and semantics
//
// Blocks are row-major, as packing lays them out and as Go code indexes
// them. cuBLAS is column-major; a row-major m x n block is the column-major
// n x m transpose with the same leading dimension, so the CUDA engine issues
// C^T = op(B)^T * op(A)^T: B first, the operations unchanged, m and n
// swapped. No data is transposed. Op is NoTrans or Trans (no conjugate
// transpose: a conjugated operand has no column-major equivalent without a
// copy). When a C block appears in several triples, the result is
// beta*C + the sum of all its products: the triples are split into
// conflict-free waves (a C block's n-th occurrence goes in wave n-1, in list
// order), beta applies in wave 0 and later waves accumulate with beta = 1.
//
// # Planning
//
// NewPlan validates the list (indices, shapes, one dtype, real scalars for
// real dtypes, no C block sharing memory with an input) and cuts each wave
// into launches: a same-shape run whose A, B and C offsets advance by
// constant strides is one strided batched call (a packing shape class is
// exactly that); a same-shape run at arbitrary offsets is one pointer-array
// batched call; with Auto or Grouped, a wave of several real shapes is one
// grouped batched call (cublas{S,D}gemmGroupedBatched, CUDA 12.5+, run as
// per-shape calls when the library lacks it); complex dtypes get one batched
// call per shape. Plan.Launches and Plan.Summary report the count. Loop (one
// call per triple) is the baseline the batches are measured against.
//
// # Engines and lifetimes
//
// An Engine runs plans in the order of one devalloc Stream: on the host
// backend with gonum's BLAS, one stream function per wave whose products run
// in parallel goroutines (errgroup); on CUDA with cuBLAS, loaded at run time,
// through one handle bound to the stream, owned by the Engine until Close.
// Run declares the reads of A and B and the write of C in the buffers'
// ledgers, so it follows earlier work on any stream and the buffers' Free
// waits for it. A Plan refers to its Coalesced operands without owning them;
// its device pointer arrays (for pointer-array and grouped calls) are built
// on the first CUDA run and released by Plan.Close, which must come before
// the allocator closes.
package gemm
