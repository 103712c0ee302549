package gemm

import (
	"encoding/binary"
	"fmt"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cublas"
	"github.com/distbuf/distbuf/packing"
)

func cublasType(d packing.DType) cublas.DType {
	switch d {
	case packing.Float32:
		return cublas.S
	case packing.Complex64:
		return cublas.C
	case packing.Complex128:
		return cublas.Z
	}
	return cublas.D
}

// deviceArrays returns the plan's device pointer arrays, building them on
// the first run: A, B and C pointers of every problem, filled in pinned
// memory in the order of s and moved with one copy.
func (p *Plan) deviceArrays(s *devalloc.Stream, bases [3]uintptr) (*devalloc.Buffer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.arrays != nil {
		return p.arrays, nil
	}
	a := s.Allocator()
	n := int64(len(p.problems))
	bytes := 3 * 8 * n
	pin, err := a.AllocPinned(bytes, s)
	if err != nil {
		return nil, fmt.Errorf("gemm: pointer arrays: %w", err)
	}
	defer func() { _ = pin.Free() }()
	mem, err := pin.Bytes()
	if err != nil {
		return nil, fmt.Errorf("gemm: pointer arrays: %w", err)
	}
	probs := p.problems
	// Work on the allocating stream needs no ledger declaration.
	if err := s.Enqueue(func() error {
		for i := range probs {
			q := &probs[i]
			binary.LittleEndian.PutUint64(mem[8*i:], uint64(bases[0])+uint64(q.a))
			binary.LittleEndian.PutUint64(mem[8*(int(n)+i):], uint64(bases[1])+uint64(q.b))
			binary.LittleEndian.PutUint64(mem[8*(2*int(n)+i):], uint64(bases[2])+uint64(q.c))
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("gemm: pointer arrays: %w", err)
	}
	arr, err := a.Alloc(bytes, s)
	if err != nil {
		return nil, fmt.Errorf("gemm: pointer arrays: %w", err)
	}
	if err := s.Copy(arr, 0, pin, 0, bytes); err != nil {
		_ = arr.Free()
		return nil, fmt.Errorf("gemm: pointer arrays: %w", err)
	}
	p.arrays = arr
	return arr, nil
}

// runCUDA makes the plan's cuBLAS calls on the engine's handle. Blocks are
// row-major and cuBLAS is column-major: a row-major m x n matrix is the
// column-major n x m transpose with the same leading dimension, so each
// product C = op(A) op(B) is issued as C^T = op(B)^T op(A)^T, that is with
// the B block first, the operations unchanged, and m and n swapped.
func (e *Engine) runCUDA(p *Plan, declare func(*devalloc.Buffer, bool) error) error {
	pr := &p.prob
	var bases [3]uintptr
	for i, c := range []*packing.Coalesced{pr.A, pr.B, pr.C} {
		addr, err := c.Buffer().Addr()
		if err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
		bases[i] = addr + uintptr(c.Start()) // view offsets count from the layout's start
	}
	var arrA, arrB, arrC uintptr
	if p.needArr {
		arr, err := p.deviceArrays(e.s, bases)
		if err != nil {
			return err
		}
		if err := declare(arr, false); err != nil {
			return err
		}
		base, err := arr.Addr()
		if err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
		n := uintptr(len(p.problems))
		arrA, arrB, arrC = base, base+8*n, base+16*n
	}
	dt := cublasType(p.dtype)
	opA, opB := cublas.Op(pr.TransA), cublas.Op(pr.TransB)
	es := p.dtype.Size()
	h := e.blas
	alpha := pr.Alpha
	for _, l := range p.launches {
		q := &p.problems[l.lo]
		m, n, k := int(q.m), int(q.n), int(q.k)
		lda, ldb := int(q.lda), int(q.ldb)
		count := l.hi - l.lo
		at := 8 * uintptr(l.lo)
		var err error
		calls := 1
		switch l.kind {
		case single:
			err = h.Gemm(dt, opB, opA, n, m, k, alpha, bases[1]+uintptr(q.b), ldb, bases[0]+uintptr(q.a), lda, l.beta, bases[2]+uintptr(q.c), n)
		case strided:
			err = h.GemmStrided(dt, opB, opA, n, m, k, alpha, bases[1]+uintptr(q.b), ldb, l.sb/es, bases[0]+uintptr(q.a), lda, l.sa/es,
				l.beta, bases[2]+uintptr(q.c), n, l.sc/es, count)
		case pointers:
			err = h.GemmBatched(dt, opB, opA, n, m, k, alpha, arrB+at, ldb, arrA+at, lda, l.beta, arrC+at, n, count)
		case grouped:
			calls, err = e.grouped(p, l, dt, opA, opB, arrA, arrB, arrC)
		}
		if err != nil {
			return fmt.Errorf("gemm: %v launch of wave %d: %w", l.kind, l.wave, err)
		}
		e.stats.Launches += int64(calls)
	}
	return nil
}

// grouped issues one grouped launch, or one pointer-array call per shape
// when the loaded cuBLAS has no grouped GEMM.
func (e *Engine) grouped(p *Plan, l launch, dt cublas.DType, opA, opB cublas.Op, arrA, arrB, arrC uintptr) (int, error) {
	pr := &p.prob
	if e.blas.HasGrouped() {
		groups := make([]cublas.Group, len(l.groups))
		at := l.lo
		for g, size := range l.groups {
			q := &p.problems[at]
			groups[g] = cublas.Group{TransA: opB, TransB: opA, M: q.n, N: q.m, K: q.k, Alpha: real(pr.Alpha), Beta: real(l.beta),
				LdA: q.ldb, LdB: q.lda, LdC: q.n, Size: int32(size)}
			at += size
		}
		off := 8 * uintptr(l.lo)
		return 1, e.blas.GemmGrouped(dt, groups, arrB+off, arrA+off, arrC+off)
	}
	e.stats.GroupedFallbacks++
	at := l.lo
	for _, size := range l.groups {
		q := &p.problems[at]
		off := 8 * uintptr(at)
		if err := e.blas.GemmBatched(dt, opB, opA, int(q.n), int(q.m), int(q.k), pr.Alpha, arrB+off, int(q.ldb), arrA+off, int(q.lda),
			l.beta, arrC+off, int(q.n), size); err != nil {
			return 0, err
		}
		at += size
	}
	return len(l.groups), nil
}
