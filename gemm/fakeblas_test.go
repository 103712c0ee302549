package gemm

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"unsafe"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cublas"
	"github.com/distbuf/distbuf/packing"
)

// fakeBLAS is a column-major reference implementation of the cuBLAS calls
// the CUDA engine makes, on host-backend memory and in stream order. Run
// through it, the engine's row-major to column-major mapping, strides,
// pointer arrays and grouped parameters are checked on machines without a
// GPU. Every address is resolved against the live buffers and bounds-checked.
type fakeBLAS struct {
	s       *devalloc.Stream
	grouped bool
	mu      sync.Mutex
	buffers func() []*devalloc.Buffer
	calls   map[string]int
}

// track makes the fake resolve addresses against the operands' buffers and
// p's device memory; a nil fake (a real engine) ignores it.
func (f *fakeBLAS) track(p *Plan, ops ...*operand) {
	if f == nil {
		return
	}
	f.buffers = func() []*devalloc.Buffer {
		out := p.deviceBuffers()
		for _, op := range ops {
			out = append(out, op.c.Buffer())
		}
		return out
	}
}

// newFakeEngine makes a CUDA engine on host memory whose cuBLAS is the fake;
// with kernels, its small-block and pointer kernels are fakeKernels, else it
// runs as where the kernels cannot load.
func newFakeEngine(s *devalloc.Stream, grouped, kernels bool) (*Engine, *fakeBLAS) {
	f := &fakeBLAS{s: s, grouped: grouped, calls: map[string]int{}}
	e := &Engine{s: s, device: true, blas: f, anyMemory: true}
	if kernels {
		e.testKern = fakeKernels{f}
	} else {
		e.kernOnce.Do(func() { e.kernErr = fmt.Errorf("gemm: small-block kernel unavailable: fake engine without kernels") })
	}
	return e, f
}

// fakeKernels runs the contract of the CUDA kernels of kernel.go on host
// memory, in stream order: it decodes the stack entries independently of
// encodeStack and indexes row-major blocks as the kernel does.
type fakeKernels struct{ f *fakeBLAS }

func (k fakeKernels) entry(stack uintptr, i int) (off [3]uint64, dims [5]int, err error) {
	p, err := k.f.ptr(stack+uintptr(stackEntryBytes*i), stackEntryBytes)
	if err != nil {
		return off, dims, err
	}
	e := unsafe.Slice((*byte)(p), stackEntryBytes)
	for j := range off {
		off[j] = binary.LittleEndian.Uint64(e[8*j:])
	}
	for j := range dims {
		dims[j] = int(int32(binary.LittleEndian.Uint32(e[24+4*j:])))
	}
	if pad := binary.LittleEndian.Uint32(e[44:]); pad != 0 {
		return off, dims, fmt.Errorf("fake kernel: stack entry %d has padding %d", i, pad)
	}
	return off, dims, nil
}

func (k fakeKernels) small(dt packing.DType, stack uintptr, tiny, count int, bases [3]uintptr, alpha, beta complex128, flags int) error {
	k.f.count("small")
	cdt := cublasType(dt)
	es := uintptr(dt.Size())
	return k.f.s.Enqueue(func() error {
		for p := range count {
			off, d, err := k.entry(stack, p)
			if err != nil {
				return err
			}
			m, n, kk, lda, ldb := d[0], d[1], d[2], d[3], d[4]
			if (max(m, n, kk) <= warpMax) != (p < tiny) {
				return fmt.Errorf("fake kernel: entry %d (%dx%dx%d) is on the wrong side of the first %d (tiny) entries", p, m, n, kk, tiny)
			}
			a, b, c := bases[0]+uintptr(off[0]), bases[1]+uintptr(off[1]), bases[2]+uintptr(off[2])
			ai, al := lda, 1
			if flags&flagTransA != 0 {
				ai, al = 1, lda
			}
			bl, bj := ldb, 1
			if flags&flagTransB != 0 {
				bl, bj = 1, ldb
			}
			for idx := range m * n {
				i, j := idx/n, idx%n
				var acc complex128
				for l := range kk {
					x, err := k.f.load(cdt, a+uintptr(i*ai+l*al)*es)
					if err != nil {
						return err
					}
					y, err := k.f.load(cdt, b+uintptr(l*bl+j*bj)*es)
					if err != nil {
						return err
					}
					acc += x * y
				}
				v := alpha * acc
				if flags&flagReadC != 0 {
					old, err := k.f.load(cdt, c+uintptr(idx)*es)
					if err != nil {
						return err
					}
					v += beta * old
				}
				if err := k.f.store(cdt, c+uintptr(idx)*es, v); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func (k fakeKernels) pointers(stack uintptr, count int, bases [3]uintptr, out uintptr) error {
	k.f.count("pointers")
	return k.f.s.Enqueue(func() error {
		for i := range count {
			off, _, err := k.entry(stack, i)
			if err != nil {
				return err
			}
			for j := range 3 {
				p, err := k.f.ptr(out+uintptr(8*(j*count+i)), 8)
				if err != nil {
					return err
				}
				binary.LittleEndian.PutUint64(unsafe.Slice((*byte)(p), 8), uint64(bases[j])+off[j])
			}
		}
		return nil
	})
}

func (f *fakeBLAS) count(name string) {
	f.mu.Lock()
	f.calls[name]++
	f.mu.Unlock()
}

func (f *fakeBLAS) ptr(addr uintptr, n int64) (unsafe.Pointer, error) {
	for _, b := range f.buffers() {
		if b == nil {
			continue
		}
		mem, err := b.Bytes()
		if err != nil {
			continue
		}
		base, _, _, _ := b.Region()
		if addr >= base && addr+uintptr(n) <= base+uintptr(len(mem)) {
			return unsafe.Pointer(&mem[addr-base]), nil
		}
	}
	return nil, fmt.Errorf("fake cublas: address %#x (+%d) is in no live buffer", addr, n)
}

func esize(dt cublas.DType) int64 { return [...]int64{4, 8, 8, 16}[dt] }

func (f *fakeBLAS) load(dt cublas.DType, addr uintptr) (complex128, error) {
	p, err := f.ptr(addr, esize(dt))
	if err != nil {
		return 0, err
	}
	switch dt {
	case cublas.S:
		return complex(float64(*(*float32)(p)), 0), nil
	case cublas.D:
		return complex(*(*float64)(p), 0), nil
	case cublas.C:
		return complex128(*(*complex64)(p)), nil
	}
	return *(*complex128)(p), nil
}

func (f *fakeBLAS) store(dt cublas.DType, addr uintptr, v complex128) error {
	p, err := f.ptr(addr, esize(dt))
	if err != nil {
		return err
	}
	switch dt {
	case cublas.S:
		*(*float32)(p) = float32(real(v))
	case cublas.D:
		*(*float64)(p) = real(v)
	case cublas.C:
		*(*complex64)(p) = complex64(v)
	default:
		*(*complex128)(p) = v
	}
	return nil
}

func (f *fakeBLAS) loadPtr(arr uintptr, i int) (uintptr, error) {
	p, err := f.ptr(arr+uintptr(8*i), 8)
	if err != nil {
		return 0, err
	}
	return uintptr(binary.LittleEndian.Uint64(unsafe.Slice((*byte)(p), 8))), nil
}

// gemm1 is one column-major product with cuBLAS's argument checks.
func (f *fakeBLAS) gemm1(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, a uintptr, lda int, b uintptr, ldb int, beta complex128, c uintptr, ldc int) error {
	rowsA, rowsB := m, k
	if ta == cublas.T {
		rowsA = k
	}
	if tb == cublas.T {
		rowsB = n
	}
	if m < 0 || n < 0 || k < 0 || lda < max(1, rowsA) || ldb < max(1, rowsB) || ldc < max(1, m) {
		return fmt.Errorf("fake cublas: invalid value: m %d n %d k %d lda %d ldb %d ldc %d", m, n, k, lda, ldb, ldc)
	}
	es := uintptr(esize(dt))
	for j := range n {
		for i := range m {
			var sum complex128
			for l := range k {
				ai := uintptr(i + l*lda)
				if ta == cublas.T {
					ai = uintptr(l + i*lda)
				}
				bi := uintptr(l + j*ldb)
				if tb == cublas.T {
					bi = uintptr(j + l*ldb)
				}
				x, err := f.load(dt, a+ai*es)
				if err != nil {
					return err
				}
				y, err := f.load(dt, b+bi*es)
				if err != nil {
					return err
				}
				sum += x * y
			}
			ci := c + uintptr(i+j*ldc)*es
			v := alpha * sum
			if beta != 0 {
				old, err := f.load(dt, ci)
				if err != nil {
					return err
				}
				v += beta * old
			}
			if err := f.store(dt, ci, v); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *fakeBLAS) Gemm(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, a uintptr, lda int, b uintptr, ldb int, beta complex128, c uintptr, ldc int) error {
	f.count("gemm")
	return f.s.Enqueue(func() error { return f.gemm1(dt, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) })
}

func (f *fakeBLAS) GemmStrided(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, a uintptr, lda int, sa int64, b uintptr, ldb int, sb int64,
	beta complex128, c uintptr, ldc int, sc int64, batch int) error {
	f.count("strided")
	es := esize(dt)
	return f.s.Enqueue(func() error {
		for i := range int64(batch) {
			if err := f.gemm1(dt, ta, tb, m, n, k, alpha, a+uintptr(i*sa*es), lda, b+uintptr(i*sb*es), ldb, beta, c+uintptr(i*sc*es), ldc); err != nil {
				return err
			}
		}
		return nil
	})
}

func (f *fakeBLAS) batched(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, aArr uintptr, lda int, bArr uintptr, ldb int,
	beta complex128, cArr uintptr, ldc int, batch int) error {
	for i := range batch {
		a, err := f.loadPtr(aArr, i)
		if err != nil {
			return err
		}
		b, err := f.loadPtr(bArr, i)
		if err != nil {
			return err
		}
		c, err := f.loadPtr(cArr, i)
		if err != nil {
			return err
		}
		if err := f.gemm1(dt, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeBLAS) GemmBatched(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, aArr uintptr, lda int, bArr uintptr, ldb int,
	beta complex128, cArr uintptr, ldc int, batch int) error {
	f.count("batched")
	return f.s.Enqueue(func() error {
		return f.batched(dt, ta, tb, m, n, k, alpha, aArr, lda, bArr, ldb, beta, cArr, ldc, batch)
	})
}

func (f *fakeBLAS) GemmGrouped(dt cublas.DType, groups []cublas.Group, aArr, bArr, cArr uintptr) error {
	if !f.grouped || (dt != cublas.S && dt != cublas.D) {
		return fmt.Errorf("fake cublas: no grouped GEMM for %v", dt)
	}
	f.count("grouped")
	groups = append([]cublas.Group(nil), groups...)
	return f.s.Enqueue(func() error {
		at := uintptr(0)
		for _, g := range groups {
			err := f.batched(dt, g.TransA, g.TransB, int(g.M), int(g.N), int(g.K), complex(g.Alpha, 0), aArr+8*at, int(g.LdA), bArr+8*at, int(g.LdB),
				complex(g.Beta, 0), cArr+8*at, int(g.LdC), int(g.Size))
			if err != nil {
				return err
			}
			at += uintptr(g.Size)
		}
		return nil
	})
}

func (f *fakeBLAS) HasGrouped() bool { return f.grouped }
func (f *fakeBLAS) Destroy() error   { return nil }

// TestFakeCUBLASCounts checks that the launches the CUDA engine makes are
// the ones the plan reports, also when grouped GEMM falls back.
func TestFakeCUBLASCounts(t *testing.T) {
	for _, grouped := range []bool{true, false} {
		a := openHost(t)
		s := a.DefaultStream()
		eng, fake := newFakeEngine(s, grouped, false)
		pr, A, B, C := sparseProblem(t, s, 2, NoTrans, Trans, 99) // float64
		p, err := NewPlan(pr, Options{SmallMax: -1})
		if err != nil {
			t.Fatal(err)
		}
		fake.track(p, A, B, C)
		ref, mag := reference(pr, A, B, C)
		if err := eng.Run(p); err != nil {
			t.Fatal(err)
		}
		checkResult(t, 2, C.read(t, s), ref, mag)
		sum := p.Summary()
		st := eng.Stats()
		if grouped {
			if fake.calls["grouped"] != sum.Grouped || st.Launches != int64(sum.Launches) || st.GroupedFallbacks != 0 {
				t.Fatalf("calls %v, stats %+v, plan %+v", fake.calls, st, sum)
			}
		} else if st.GroupedFallbacks != int64(sum.Grouped) || fake.calls["grouped"] != 0 || st.Launches <= int64(sum.Launches) {
			t.Fatalf("fallback: calls %v, stats %+v, plan %+v", fake.calls, st, sum)
		}
		_ = p.Close()
		for _, op := range []*operand{A, B, C} {
			_ = op.c.Free()
		}
		closeClean(t, a)
	}
}
