package hostblas

import "fmt"

// Elem is an element type the product takes.
type Elem interface {
	float32 | float64 | complex64 | complex128
}

// Workspace holds the copies of operands a product makes; see the package
// doc for its ownership.
type Workspace struct {
	f32  []float32
	f64  []float64
	c64  []complex64
	c128 []complex128
}

// scratch is n elements of w's slice of T, grown when short.
func scratch[T Elem](w *Workspace, n int) []T {
	var p *[]T
	switch any(*new(T)).(type) {
	case float32:
		p = any(&w.f32).(*[]T)
	case float64:
		p = any(&w.f64).(*[]T)
	case complex64:
		p = any(&w.c64).(*[]T)
	default:
		p = any(&w.c128).(*[]T)
	}
	if cap(*p) < n {
		*p = make([]T, n)
	}
	return (*p)[:n]
}

func isComplex[T Elem]() bool {
	switch any(*new(T)).(type) {
	case complex64, complex128:
		return true
	}
	return false
}

// Cache blocks of the packed path: the kernel works on blockM rows of
// op(A) and blockN columns of op(B) over blockK of k at a time, so the
// copies stay in the caches it reads them from, and the workspace holds at
// most blockM*blockK + blockK*blockN elements.
const (
	blockM = 128
	blockK = 256
	blockN = 512
)

// smallDim is the largest m, n and k the plain loops take: below it,
// copying the operands into panels costs more than the tiles save.
const smallDim = 8

// Gemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices: op(A)
// is m x k (A is m x k with row stride lda, or k x m when transA), op(B) is
// k x n (B is k x n with row stride ldb, or n x k when transB), and C is
// m x n with row stride ldc. w holds the copies it makes; nil takes a
// fresh one. It panics when a dimension is negative, a stride is shorter
// than its row or a slice shorter than its matrix: the caller checks its
// problems before running them.
func Gemm[T Elem](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int, w *Workspace) {
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("hostblas: negative dimension: m %d, n %d, k %d", m, n, k))
	}
	checkMatrix("A", a, ar, ac, lda)
	checkMatrix("B", b, br, bc, ldb)
	checkMatrix("C", c, m, n, ldc)
	if m == 0 || n == 0 {
		return
	}
	if alpha == 0 || k == 0 {
		for i := range m {
			scaleRow(c[i*ldc:i*ldc+n], beta)
		}
		return
	}
	if w == nil {
		w = new(Workspace)
	}
	if m <= smallDim && n <= smallDim && k <= smallDim {
		if transB {
			dotLoops(transA, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, w)
		} else {
			axpyLoops(transA, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		}
		return
	}
	packed(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, w)
}

func checkMatrix[T Elem](name string, x []T, rows, cols, ld int) {
	if ld < max(cols, 1) {
		panic(fmt.Sprintf("hostblas: %s: row stride %d shorter than its %d columns", name, ld, cols))
	}
	if rows > 0 && cols > 0 && len(x) < (rows-1)*ld+cols {
		panic(fmt.Sprintf("hostblas: %s: %d elements for %d x %d with row stride %d", name, len(x), rows, cols, ld))
	}
}

// scaleRow sets row to beta*row, writing zeros without reading when beta
// is 0.
func scaleRow[T Elem](row []T, beta T) {
	switch beta {
	case 1:
	case 0:
		clear(row)
	default:
		for j := range row {
			row[j] *= beta
		}
	}
}

// axpyLoops is the small product with B untransposed: row i of C takes
// alpha*op(A)[i,l] times row l of B, for each l, contiguous in j.
func axpyLoops[T Elem](transA bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	rs, cs := lda, 1 // op(A)[i,l] = a[i*rs+l*cs]
	if transA {
		rs, cs = 1, lda
	}
	for i := range m {
		crow := c[i*ldc : i*ldc+n]
		scaleRow(crow, beta)
		for l := range k {
			s := alpha * a[i*rs+l*cs]
			brow := b[l*ldb : l*ldb+n]
			for j, x := range brow {
				crow[j] += s * x
			}
		}
	}
}

// dotLoops is the small product with B transposed: element (i, j) of C is
// the dot product of row i of op(A) with row j of B, both contiguous (a
// transposed A's row is copied first).
func dotLoops[T Elem](transA bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int, w *Workspace) {
	var col []T
	if transA {
		col = scratch[T](w, k)
	}
	for i := range m {
		var arow []T
		if transA {
			for l := range col {
				col[l] = a[l*lda+i]
			}
			arow = col
		} else {
			arow = a[i*lda : i*lda+k]
		}
		crow := c[i*ldc : i*ldc+n]
		for j := range crow {
			brow := b[j*ldb : j*ldb+k]
			brow = brow[:len(arow)]
			var sum T
			for l, x := range arow {
				sum += x * brow[l]
			}
			switch beta {
			case 0:
				crow[j] = alpha * sum
			case 1:
				crow[j] += alpha * sum
			default:
				crow[j] = beta*crow[j] + alpha*sum
			}
		}
	}
}

// packed is the product through panels: for each cache block of op(B) and
// op(A), copy op(B) into the workspace as panels of NR columns and run the
// micro-kernel over every MR x NR tile of C, beta applying in the first
// block of k only. The kernel reads op(A)'s rows in place when A is not
// transposed, and from a copy when it is.
func packed[T Elem](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int, w *Workspace) {
	mr, nr, micro := microKernel[T]()
	mc, kc, nc := min(m, blockM), min(k, blockK), min(n, blockN)
	ncUp := (nc + nr - 1) / nr * nr
	aLen := 0
	if transA {
		aLen = mc * kc
	}
	buf := scratch[T](w, aLen+kc*ncUp+mr*nr)
	ap, bp, tile := buf[:aLen], buf[aLen:aLen+kc*ncUp], buf[aLen+kc*ncUp:]
	for j0 := 0; j0 < n; j0 += blockN {
		nb := min(blockN, n-j0)
		for l0 := 0; l0 < k; l0 += blockK {
			kb := min(blockK, k-l0)
			bt := beta
			if l0 > 0 {
				bt = 1
			}
			packB(transB, b, ldb, l0, kb, j0, nb, nr, bp)
			for i0 := 0; i0 < m; i0 += blockM {
				mb := min(blockM, m-i0)
				// row r of the block of op(A) is rowA[r*rs+off : ...+kb]
				rowA, rs, off := a, lda, i0*lda+l0
				if transA {
					packA(a, lda, i0, mb, l0, kb, ap)
					rowA, rs, off = ap, kb, 0
				}
				for jt := 0; jt < nb; jt += nr {
					bpan := bp[jt*kb : (jt+nr)*kb]
					for it := 0; it < mb; it += mr {
						rows := min(mr, mb-it)
						a0 := rowA[off+it*rs : off+it*rs+kb]
						a1 := a0 // a last single row is computed twice, stored once
						if rows > 1 {
							a1 = rowA[off+(it+1)*rs : off+(it+1)*rs+kb]
						}
						cols := min(nr, nb-jt)
						ct := c[(i0+it)*ldc+j0+jt:]
						if rows == mr && cols == nr { // a whole tile: the kernel writes C
							micro(a0, a1, bpan, ct[:nr], ct[ldc:ldc+nr], alpha, bt)
							continue
						}
						micro(a0, a1, bpan, tile[:nr], tile[nr:2*nr], 1, 0)
						store(tile, nr, rows, cols, alpha, bt, ct, ldc)
					}
				}
			}
		}
	}
}

// packA copies op(A)[i0:i0+mb, l0:l0+kb] of a transposed A into dst, row
// after row: op(A)'s row i is A's column i.
func packA[T Elem](a []T, lda, i0, mb, l0, kb int, dst []T) {
	for l := range kb {
		src := a[(l0+l)*lda+i0 : (l0+l)*lda+i0+mb]
		for r, x := range src {
			dst[r*kb+l] = x
		}
	}
}

// packB copies op(B)[l0:l0+kb, j0:j0+nb] into dst as panels of nr
// columns, each stored l-major, the last one padded with zeros: the sums
// of the padding columns are never stored, and zeros keep a stale NaN or
// denormal from slowing them down.
func packB[T Elem](transB bool, b []T, ldb, l0, kb, j0, nb, nr int, dst []T) {
	for jt := 0; jt < nb; jt += nr {
		pan := dst[jt*kb : (jt+nr)*kb]
		cols := min(nr, nb-jt)
		if !transB { // row l of B holds the panel's l-slice
			for l := range kb {
				src := b[(l0+l)*ldb+j0+jt:]
				d := pan[l*nr : l*nr+nr]
				copy(d, src[:cols])
				clear(d[cols:])
			}
			continue
		}
		for cc := range cols { // op(B)[l,j] = b[j*ldb+l]
			src := b[(j0+jt+cc)*ldb+l0 : (j0+jt+cc)*ldb+l0+kb]
			for l, x := range src {
				pan[l*nr+cc] = x
			}
		}
		for cc := cols; cc < nr; cc++ {
			for l := range kb {
				pan[l*nr+cc] = 0
			}
		}
	}
}

// store writes the rows x cols corner of an MR x NR tile of sums (row-major,
// nr to a row) into c as alpha*sum + beta*c.
func store[T Elem](tile []T, nr, rows, cols int, alpha, beta T, c []T, ldc int) {
	for r := range rows {
		crow := c[r*ldc : r*ldc+cols]
		sums := tile[r*nr : r*nr+cols]
		switch beta {
		case 0:
			for j, s := range sums {
				crow[j] = alpha * s
			}
		case 1:
			for j, s := range sums {
				crow[j] += alpha * s
			}
		default:
			for j, s := range sums {
				crow[j] = beta*crow[j] + alpha*s
			}
		}
	}
}

// microKernel is the tile size and kernel for T: MR = 2 rows of op(A) by
// NR = 4 columns for real types and 2 for complex ones, eight sums in
// either case, as many as the sixteen SSE registers hold beside the
// operands (a 4 x 4 real tile spills and runs at half the speed).
func microKernel[T Elem]() (mr, nr int, micro func(a0, a1, bp, c0, c1 []T, alpha, beta T)) {
	if isComplex[T]() {
		return 2, 2, micro2x2[T]
	}
	return 2, 4, micro2x4[T]
}

// micro2x2 sums, over l, a0[l] and a1[l] (two rows of op(A)) times bp's
// l-slice of 2 columns, and writes the 2 x 2 sums into the rows c0 and c1
// of C as alpha*sum + beta*C.
func micro2x2[T Elem](a0, a1, bp, c0, c1 []T, alpha, beta T) {
	var c00, c01, c10, c11 T
	a1, bp = a1[:len(a0)], bp[:2*len(a0)]
	for len(a0) >= 1 && len(a1) >= 1 && len(bp) >= 2 {
		x0, x1 := a0[0], a1[0]
		b0, b1 := bp[0], bp[1]
		c00 += x0 * b0
		c01 += x0 * b1
		c10 += x1 * b0
		c11 += x1 * b1
		a0, a1, bp = a0[1:], a1[1:], bp[2:]
	}
	c0, c1 = c0[:2], c1[:2]
	switch beta {
	case 0:
		c0[0], c0[1] = alpha*c00, alpha*c01
		c1[0], c1[1] = alpha*c10, alpha*c11
	default:
		c0[0], c0[1] = alpha*c00+beta*c0[0], alpha*c01+beta*c0[1]
		c1[0], c1[1] = alpha*c10+beta*c1[0], alpha*c11+beta*c1[1]
	}
}

// micro2x4 is micro2x2 for 4 columns, unrolled by two in l.
func micro2x4[T Elem](a0, a1, bp, c0, c1 []T, alpha, beta T) {
	var c00, c01, c02, c03, c10, c11, c12, c13 T
	a1, bp = a1[:len(a0)], bp[:4*len(a0)]
	for len(a0) >= 2 && len(a1) >= 2 && len(bp) >= 8 {
		x0, x1 := a0[0], a1[0]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		c00 += x0 * b0
		c01 += x0 * b1
		c02 += x0 * b2
		c03 += x0 * b3
		c10 += x1 * b0
		c11 += x1 * b1
		c12 += x1 * b2
		c13 += x1 * b3
		x0, x1 = a0[1], a1[1]
		b0, b1, b2, b3 = bp[4], bp[5], bp[6], bp[7]
		c00 += x0 * b0
		c01 += x0 * b1
		c02 += x0 * b2
		c03 += x0 * b3
		c10 += x1 * b0
		c11 += x1 * b1
		c12 += x1 * b2
		c13 += x1 * b3
		a0, a1, bp = a0[2:], a1[2:], bp[8:]
	}
	if len(a0) >= 1 && len(a1) >= 1 && len(bp) >= 4 {
		x0, x1 := a0[0], a1[0]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		c00 += x0 * b0
		c01 += x0 * b1
		c02 += x0 * b2
		c03 += x0 * b3
		c10 += x1 * b0
		c11 += x1 * b1
		c12 += x1 * b2
		c13 += x1 * b3
	}
	c0, c1 = c0[:4], c1[:4]
	switch beta {
	case 0:
		c0[0], c0[1], c0[2], c0[3] = alpha*c00, alpha*c01, alpha*c02, alpha*c03
		c1[0], c1[1], c1[2], c1[3] = alpha*c10, alpha*c11, alpha*c12, alpha*c13
	case 1:
		c0[0], c0[1], c0[2], c0[3] = c0[0]+alpha*c00, c0[1]+alpha*c01, c0[2]+alpha*c02, c0[3]+alpha*c03
		c1[0], c1[1], c1[2], c1[3] = c1[0]+alpha*c10, c1[1]+alpha*c11, c1[2]+alpha*c12, c1[3]+alpha*c13
	default:
		c0[0], c0[1], c0[2], c0[3] = alpha*c00+beta*c0[0], alpha*c01+beta*c0[1], alpha*c02+beta*c0[2], alpha*c03+beta*c0[3]
		c1[0], c1[1], c1[2], c1[3] = alpha*c10+beta*c1[0], alpha*c11+beta*c1[1], alpha*c12+beta*c1[2], alpha*c13+beta*c1[3]
	}
}
