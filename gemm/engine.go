package gemm

import (
	"fmt"
	"sync"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cublas"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/packing"
)

// EngineOptions configures NewEngine.
type EngineOptions struct {
	// TF32 lets cuBLAS use TF32 tensor cores for float32 products: faster,
	// with about 1e-3 relative error. Off by default (full float32).
	TF32 bool
}

// Engine runs plans in the order of one stream: gonum's BLAS on the host
// backend, cuBLAS on CUDA with one handle bound to the stream. The
// Engine owns the handle until Close. It is safe for concurrent use, though its work is
// serialised by the stream anyway.
type Engine struct {
	s      *devalloc.Stream
	device bool
	blas   deviceBLAS // nil on the host backend
	// anyMemory lets a device engine run on host memory: tests drive the
	// CUDA launch code through a column-major fake of cuBLAS.
	anyMemory bool
	// kern runs the small-block and pointer kernels: loaded on the first
	// plan that has a use for them, nil with kernErr when they cannot be
	// (no NVRTC, a runtime older than 12.8), and then small launches go to
	// cuBLAS. testKern replaces the loader in tests.
	kernOnce sync.Once
	kern     kernelLauncher
	kernErr  error
	testKern kernelLauncher

	mu     sync.Mutex
	closed bool
	stats  EngineStats
}

// deviceBLAS is the part of cuBLAS the CUDA engine calls, column-major, on
// device addresses.
type deviceBLAS interface {
	Gemm(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, a uintptr, lda int, b uintptr, ldb int, beta complex128, c uintptr, ldc int) error
	GemmStrided(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, a uintptr, lda int, sa int64, b uintptr, ldb int, sb int64,
		beta complex128, c uintptr, ldc int, sc int64, batch int) error
	GemmBatched(dt cublas.DType, ta, tb cublas.Op, m, n, k int, alpha complex128, aArr uintptr, lda int, bArr uintptr, ldb int,
		beta complex128, cArr uintptr, ldc int, batch int) error
	GemmGrouped(dt cublas.DType, groups []cublas.Group, aArr, bArr, cArr uintptr) error
	HasGrouped() bool
	Destroy() error
}

type cublasDevice struct {
	*cublas.Handle
	lib *cublas.Lib
}

func (c cublasDevice) HasGrouped() bool { return c.lib.HasGrouped() }

// EngineStats counts an engine's work.
type EngineStats struct {
	Runs     int64
	Launches int64 // library calls made (a grouped call that fell back counts each per-shape call)
	// GroupedFallbacks counts grouped launches run as per-shape calls
	// because the loaded cuBLAS lacks grouped batched GEMM.
	GroupedFallbacks int64
	// SmallFallbacks counts small-kernel launches run through cuBLAS
	// because the kernels could not be loaded (see KernelStatus).
	SmallFallbacks int64
}

// NewEngine makes an engine for stream s, on the backend of s's allocator.
func NewEngine(s *devalloc.Stream, opts EngineOptions) (*Engine, error) {
	if s == nil {
		return nil, fmt.Errorf("gemm: nil stream: %w", distbuf.ErrInvalid)
	}
	e := &Engine{s: s, device: s.Allocator().Info().Backend == devalloc.BackendCUDA}
	if !e.device {
		return e, nil
	}
	lib, err := cublas.Load()
	if err != nil {
		return nil, fmt.Errorf("gemm: %w: %w", distbuf.ErrUnavailable, err)
	}
	h, err := lib.NewHandle(s.Allocator().Info().Device, s.Handle(), opts.TF32)
	if err != nil {
		return nil, fmt.Errorf("gemm: %w", err)
	}
	e.blas = cublasDevice{Handle: h, lib: lib}
	return e, nil
}

// Device reports whether the engine runs on the GPU.
func (e *Engine) Device() bool { return e.device }

// Stream is the stream the engine's work goes to.
func (e *Engine) Stream() *devalloc.Stream { return e.s }

// Stats returns the engine's counters.
func (e *Engine) Stats() EngineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Close destroys the cuBLAS handle. Work already enqueued still runs.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("gemm: engine closed twice: %w", distbuf.ErrClosed)
	}
	e.closed = true
	if e.blas != nil {
		return e.blas.Destroy()
	}
	return nil
}

// kernels returns the small-block kernels for this engine's device, loading
// them on first need, or nil when they are unavailable.
func (e *Engine) kernels(p *Plan) kernelLauncher {
	if e.testKern != nil {
		return e.testKern
	}
	if p.smallN == 0 && !p.needArr {
		return e.kern
	}
	e.kernOnce.Do(func() {
		dev := e.s.Allocator().Info().Device
		d, ks, err := loadKernels(dev)
		if err != nil {
			e.kernErr = fmt.Errorf("gemm: small-block kernel unavailable, cuBLAS runs those products: %w", err)
			return
		}
		e.kern = &cudaKernels{dev: d, stream: cudart.Stream(e.s.Handle()), k: ks}
	})
	return e.kern
}

// KernelStatus reports whether the CUDA engine runs small products in its
// own kernel: nil once the kernel is loaded (or on the host backend, where
// nothing needs it), else why not. The kernel loads on the first plan that
// uses it, so call it after a Run.
func (e *Engine) KernelStatus() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kernErr
}

// Run enqueues the plan on the operands it was planned on, with its
// problem's Alpha and Beta: RunOn(p, Operands{A, B, C, Alpha, Beta}).
func (e *Engine) Run(p *Plan) error {
	if p == nil {
		return fmt.Errorf("gemm: nil plan: %w", distbuf.ErrInvalid)
	}
	pr := &p.prob
	return e.RunOn(p, Operands{A: pr.A, B: pr.B, C: pr.C, Alpha: pr.Alpha, Beta: pr.Beta})
}

// RunOn enqueues the plan on the engine's stream over o's buffers, which
// must be laid out as the plan's operands (the same packing plans and
// groups; an error matching distbuf.ErrInvalid otherwise): a solver whose block structure repeats plans
// once and runs the plan on each solve's new buffers. It declares the reads
// of A and B and the write of C in the buffers' ledgers, so the products
// follow earlier writers and readers on any stream and Free waits for them;
// the three accesses end in one event (devalloc.DoneAll). Runs of one plan
// are serialised: on CUDA they share its device memory.
func (e *Engine) RunOn(p *Plan, o Operands) (err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("gemm: run on a closed engine: %w", distbuf.ErrClosed)
	}
	if p == nil {
		return fmt.Errorf("gemm: nil plan: %w", distbuf.ErrInvalid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("gemm: run of a closed plan: %w", distbuf.ErrClosed)
	}
	if err := p.bind(o); err != nil {
		return err
	}
	if len(p.launches) == 0 {
		return nil
	}
	for _, c := range []*packing.Coalesced{o.A, o.B, o.C} {
		loc := c.Buffer().Location()
		if e.device && loc != devalloc.OnDevice && !e.anyMemory || !e.device && !loc.HostAccessible() {
			return fmt.Errorf("gemm: %s memory on a %s engine: %w", loc, map[bool]string{true: "CUDA", false: "host"}[e.device], distbuf.ErrUnavailable)
		}
	}
	// The accesses end together, after the launches, in one event.
	var open []*devalloc.Access
	defer func() {
		if derr := devalloc.DoneAll(open...); derr != nil && err == nil {
			err = fmt.Errorf("gemm: %w", derr)
		}
	}()
	declare := func(b *devalloc.Buffer, write bool) error {
		var x *devalloc.Access
		var err error
		if write {
			x, err = b.Write(e.s)
		} else {
			x, err = b.Read(e.s)
		}
		if err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
		open = append(open, x)
		return nil
	}
	bufA, bufB, bufC := o.A.Buffer(), o.B.Buffer(), o.C.Buffer()
	if err := declare(bufC, true); err != nil {
		return err
	}
	if bufA != bufC {
		if err := declare(bufA, false); err != nil {
			return err
		}
	}
	if bufB != bufC && bufB != bufA {
		if err := declare(bufB, false); err != nil {
			return err
		}
	}
	e.stats.Runs++
	if e.device {
		return e.runCUDA(p, o, declare)
	}
	return e.runHost(p, o)
}
