package gemm

import (
	"encoding/binary"
	"fmt"

	"github.com/distbuf/distbuf"
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

// operandBases is where each operand's layout begins: view offsets count
// from there.
func operandBases(o Operands) ([3]uintptr, error) {
	var bases [3]uintptr
	for i, c := range []*packing.Coalesced{o.A, o.B, o.C} {
		addr, _, _, err := c.Buffer().Region()
		if err != nil {
			return bases, fmt.Errorf("gemm: %w", err)
		}
		bases[i] = addr + uintptr(c.Start())
	}
	return bases, nil
}

// prepareDevice makes the plan's device memory ready for a run at bases:
// the parameter stack, uploaded once, when the engine has the kernels; the
// cuBLAS pointer arrays when a launch reads them, rebuilt when the bases
// differ from the last run's (on the device from the stack by the pointer
// kernel, else filled on the host and copied). It returns the stack and
// arrays to declare as read (nil when unused). The caller holds p.mu.
func (e *Engine) prepareDevice(p *Plan, bases [3]uintptr, kern kernelLauncher) (stack, arrays *devalloc.Buffer, err error) {
	a := e.s.Allocator()
	if p.dev == nil {
		p.dev = &deviceState{a: a, s: e.s}
	} else if p.dev.a != a {
		return nil, nil, fmt.Errorf("gemm: the plan's device memory belongs to another allocator (device %d): use one plan per device: %w", p.dev.a.Info().Device, distbuf.ErrInvalid)
	}
	d := p.dev
	n := int64(len(p.problems))
	smallOnCUBLAS := kern == nil && p.smallN > 0
	needArr := p.needArr || smallOnCUBLAS
	if kern != nil && d.stack == nil && (p.smallN > 0 || needArr) {
		if d.stack, err = upload(e.s, stackEntryBytes*n, func(mem []byte) { encodeStack(mem, p.problems) }); err != nil {
			return nil, nil, fmt.Errorf("gemm: parameter stack: %w", err)
		}
	}
	if !needArr {
		return d.stack, nil, nil
	}
	if d.arrays != nil && d.arrBases == bases {
		return d.stack, d.arrays, nil
	}
	if d.arrays == nil {
		if d.arrays, err = a.Alloc(3*8*n, e.s); err != nil {
			return nil, nil, fmt.Errorf("gemm: pointer arrays: %w", err)
		}
	}
	d.arrBases = [3]uintptr{}
	if kern != nil {
		err = e.derivePointers(d, int(n), bases, kern)
	} else {
		err = e.fillPointers(p, d, bases)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("gemm: pointer arrays: %w", err)
	}
	d.arrBases, d.arrWriter = bases, e.s
	return d.stack, d.arrays, nil
}

// follow makes s wait for the work enqueued on other so far.
func follow(s, other *devalloc.Stream) error {
	ev, err := other.Record()
	if err != nil {
		return fmt.Errorf("gemm: %w", err)
	}
	err = s.Wait(ev)
	if rerr := ev.Release(); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("gemm: %w", err)
	}
	return nil
}

// upload allocates a device buffer of n bytes and fills it through pinned
// memory with one copy on s. A pinned block is handed out only once its
// last use has completed, so the host may write it at once.
func upload(s *devalloc.Stream, n int64, fill func([]byte)) (*devalloc.Buffer, error) {
	a := s.Allocator()
	pin, err := a.AllocPinned(n, s)
	if err != nil {
		return nil, err
	}
	defer func() { _ = pin.Free() }()
	mem, err := pin.Bytes()
	if err != nil {
		return nil, err
	}
	fill(mem[:n])
	buf, err := a.Alloc(n, s)
	if err != nil {
		return nil, err
	}
	if err := s.Copy(buf, 0, pin, 0, n); err != nil {
		_ = buf.Free()
		return nil, err
	}
	return buf, nil
}

// derivePointers has the pointer kernel write the arrays from the stack.
func (e *Engine) derivePointers(d *deviceState, n int, bases [3]uintptr, kern kernelLauncher) error {
	rd, err := d.stack.Read(e.s)
	if err != nil {
		return err
	}
	wr, err := d.arrays.Write(e.s)
	if err != nil {
		return joinDone(err, rd)
	}
	stackAddr, _, _, err := d.stack.Region()
	if err != nil {
		return joinDone(err, rd, wr)
	}
	out, _, _, err := d.arrays.Region()
	if err == nil {
		err = kern.pointers(stackAddr, n, bases, out)
	}
	return joinDone(err, rd, wr)
}

func joinDone(err error, xs ...*devalloc.Access) error {
	for _, x := range xs {
		if derr := x.Done(); err == nil {
			err = derr
		}
	}
	return err
}

// fillPointers writes the arrays on the host into pinned memory and copies
// them: the path without the kernels.
func (e *Engine) fillPointers(p *Plan, d *deviceState, bases [3]uintptr) error {
	n := len(p.problems)
	tmp, err := upload(e.s, int64(24*n), func(mem []byte) {
		for i := range p.problems {
			q := &p.problems[i]
			binary.LittleEndian.PutUint64(mem[8*i:], uint64(bases[0])+uint64(q.a))
			binary.LittleEndian.PutUint64(mem[8*(n+i):], uint64(bases[1])+uint64(q.b))
			binary.LittleEndian.PutUint64(mem[8*(2*n+i):], uint64(bases[2])+uint64(q.c))
		}
	})
	if err != nil {
		return err
	}
	err = e.s.Copy(d.arrays, 0, tmp, 0, int64(24*n))
	if ferr := tmp.Free(); err == nil {
		err = ferr
	}
	return err
}

// runCUDA makes the plan's launches on the engine's stream. Blocks are
// row-major and cuBLAS is column-major: a row-major m x n matrix is the
// column-major n x m transpose with the same leading dimension, so each
// product C = op(A) op(B) is issued as C^T = op(B)^T op(A)^T, that is with
// the B block first, the operations unchanged, and m and n swapped. The
// small-block kernel reads row-major blocks as they are.
func (e *Engine) runCUDA(p *Plan, o Operands, declare func(*devalloc.Buffer, bool) error) error {
	bases, err := operandBases(o)
	if err != nil {
		return err
	}
	kern := e.kernels(p)
	// The plan's memory may have been made on another stream, whose own
	// runs read it without declaring (stream order covers them): follow
	// them before rewriting or reading it here, and declare this stream's
	// reads for the ledger.
	foreign := p.dev != nil && p.dev.s != e.s
	if foreign {
		if err := follow(e.s, p.dev.s); err != nil {
			return err
		}
	}
	stack, arr, err := e.prepareDevice(p, bases, kern)
	if err != nil {
		return err
	}
	var stackAddr, arrA, arrB, arrC uintptr
	// The arrays may have been rewritten by another stream even where the
	// plan's memory is this stream's: declaring the read waits for it (a
	// run on the same C would too, through C's ledger, but a run on other
	// buffers with the same addresses would not).
	for _, b := range []*devalloc.Buffer{stack, arr} {
		if b != nil && (foreign || b == arr && p.dev.arrWriter != e.s) {
			if err := declare(b, false); err != nil {
				return err
			}
		}
	}
	if stack != nil {
		if stackAddr, _, _, err = stack.Region(); err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
	}
	if arr != nil {
		base, _, _, err := arr.Region()
		if err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
		n := uintptr(len(p.problems))
		arrA, arrB, arrC = base, base+8*n, base+16*n
	}
	dt := cublasType(p.dtype)
	pr := &p.prob
	opA, opB := cublas.Op(pr.TransA), cublas.Op(pr.TransB)
	es := p.dtype.Size()
	h := e.blas
	alpha := o.Alpha
	for _, l := range p.launches {
		q := &p.problems[l.lo]
		m, n, k := int(q.m), int(q.n), int(q.k)
		lda, ldb := int(q.lda), int(q.ldb)
		count := l.hi - l.lo
		at := 8 * uintptr(l.lo)
		beta := betaOf(o.Beta, l.wave)
		var err error
		calls := 1
		switch l.kind {
		case single:
			err = h.Gemm(dt, opB, opA, n, m, k, alpha, bases[1]+uintptr(q.b), ldb, bases[0]+uintptr(q.a), lda, beta, bases[2]+uintptr(q.c), n)
		case strided:
			err = h.GemmStrided(dt, opB, opA, n, m, k, alpha, bases[1]+uintptr(q.b), ldb, l.sb/es, bases[0]+uintptr(q.a), lda, l.sa/es,
				beta, bases[2]+uintptr(q.c), n, l.sc/es, count)
		case pointers:
			err = h.GemmBatched(dt, opB, opA, n, m, k, alpha, arrB+at, ldb, arrA+at, lda, beta, arrC+at, n, count)
		case grouped:
			calls, err = e.grouped(p, l, alpha, beta, dt, opA, opB, arrA, arrB, arrC)
		case small:
			if kern == nil {
				e.stats.SmallFallbacks++
				calls, err = e.grouped(p, l, alpha, beta, dt, opA, opB, arrA, arrB, arrC)
				break
			}
			flags := 0
			if pr.TransA == Trans {
				flags |= flagTransA
			}
			if pr.TransB == Trans {
				flags |= flagTransB
			}
			if beta != 0 {
				flags |= flagReadC
			}
			err = kern.small(p.dtype, stackAddr+uintptr(stackEntryBytes*l.lo), l.tiny, count, bases, alpha, beta, flags)
		}
		if err != nil {
			return fmt.Errorf("gemm: %v launch of wave %d: %w", l.kind, l.wave, err)
		}
		e.stats.Launches += int64(calls)
	}
	return nil
}

// grouped issues one grouped launch, or one pointer-array call per shape
// when the loaded cuBLAS has no grouped GEMM or the dtype is complex.
func (e *Engine) grouped(p *Plan, l launch, alpha, beta complex128, dt cublas.DType, opA, opB cublas.Op, arrA, arrB, arrC uintptr) (int, error) {
	if e.blas.HasGrouped() && !p.dtype.IsComplex() {
		groups := make([]cublas.Group, len(l.groups))
		at := l.lo
		for g, size := range l.groups {
			q := &p.problems[at]
			groups[g] = cublas.Group{TransA: opB, TransB: opA, M: q.n, N: q.m, K: q.k, Alpha: real(alpha), Beta: real(beta),
				LdA: q.ldb, LdB: q.lda, LdC: q.n, Size: int32(size)}
			at += size
		}
		off := 8 * uintptr(l.lo)
		return 1, e.blas.GemmGrouped(dt, groups, arrB+off, arrA+off, arrC+off)
	}
	if l.kind == grouped {
		e.stats.GroupedFallbacks++
	}
	at := l.lo
	for _, size := range l.groups {
		q := &p.problems[at]
		off := 8 * uintptr(at)
		if err := e.blas.GemmBatched(dt, opB, opA, int(q.n), int(q.m), int(q.k), alpha, arrB+off, int(q.ldb), arrA+off, int(q.lda),
			beta, arrC+off, int(q.n), size); err != nil {
			return 0, err
		}
		at += size
	}
	return len(l.groups), nil
}
