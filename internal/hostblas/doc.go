// Package hostblas is the host backend's matrix product: row-major GEMM,
// C = alpha*op(A)*op(B) + beta*C, in float32, float64, complex64 and
// complex128, written for the blocks of a block-sparse solve (tens of rows
// and columns at most, most of them under ten).
//
// Two paths share one set of semantics. Products whose dimensions are all
// at most 8 run as plain loops whose innermost loop walks contiguous
// memory: a row of C accumulates rows of op(B) when B is not transposed,
// and an element of C is a dot product of two contiguous rows when it is (a
// transposed A's row is copied into the workspace first). Larger products
// copy op(B) into the workspace as panels of NR columns, and a transposed
// A into rows, so that a micro-kernel keeps a 2 x NR tile of C in registers
// while it walks two rows of op(A) and a panel contiguously (NR is 4 for
// real types, 2 for complex ones). Cache blocks of 128 rows, 256 of k and
// 512 columns bound the copies and the workspace.
//
// The semantics are BLAS's: with beta = 0, C is only written (a NaN or Inf
// there does not survive); with alpha = 0 or k = 0, A and B are not read
// and C becomes beta*C. Transposition never conjugates.
//
// A Workspace holds the copies between calls. It belongs to one goroutine
// at a time; its zero value is ready, and it keeps the largest panels it
// has needed until it is dropped.
package hostblas
