package gemm

import (
	"fmt"
	"sync"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cublas"
	"github.com/distbuf/distbuf/packing"
)

// EngineOptions configures NewEngine.
type EngineOptions struct {
	// TF32 lets cuBLAS use TF32 tensor cores for float32 products: faster,
	// with about 1e-3 relative error. Off by default (full float32).
	TF32 bool
}

// Engine runs plans in the order of one stream: gonum on the host backend,
// cuBLAS on CUDA with one handle bound to the stream. The Engine owns the
// handle until Close. It is safe for concurrent use, though its work is
// serialised by the stream anyway.
type Engine struct {
	s      *devalloc.Stream
	device bool
	blas   deviceBLAS // nil on the host backend
	// anyMemory lets a device engine run on host memory: tests drive the
	// CUDA launch code through a column-major fake of cuBLAS.
	anyMemory bool

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
}

// NewEngine makes an engine for stream s, on the backend of s's allocator.
func NewEngine(s *devalloc.Stream, opts EngineOptions) (*Engine, error) {
	if s == nil {
		return nil, fmt.Errorf("gemm: nil stream: %w", ErrInvalid)
	}
	e := &Engine{s: s, device: s.Allocator().Kind().IsDevice()}
	if !e.device {
		return e, nil
	}
	lib, err := cublas.Load()
	if err != nil {
		return nil, fmt.Errorf("gemm: %w: %w", ErrUnavailable, err)
	}
	h, err := lib.NewHandle(s.Allocator().Device(), s.Handle(), opts.TF32)
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
		return fmt.Errorf("gemm: engine closed twice: %w", ErrInvalid)
	}
	e.closed = true
	if e.blas != nil {
		return e.blas.Destroy()
	}
	return nil
}

// Run enqueues the plan on the engine's stream. It declares the reads of A
// and B and the write of C in the buffers' ledgers, so the products follow
// earlier writers and readers on any stream and Free waits for them.
func (e *Engine) Run(p *Plan) (err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("gemm: run on a closed engine: %w", ErrInvalid)
	}
	if p == nil {
		return fmt.Errorf("gemm: nil plan: %w", ErrInvalid)
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return fmt.Errorf("gemm: run of a closed plan: %w", ErrInvalid)
	}
	if len(p.launches) == 0 {
		return nil
	}
	pr := &p.prob
	for _, c := range []*packing.Coalesced{pr.A, pr.B, pr.C} {
		loc := c.Location()
		if e.device && loc != devalloc.OnDevice && !e.anyMemory || !e.device && !loc.HostAccessible() {
			return fmt.Errorf("gemm: %s memory on a %s engine: %w", loc, map[bool]string{true: "CUDA", false: "host"}[e.device], ErrUnavailable)
		}
	}
	var open []*devalloc.Access
	defer func() {
		for _, x := range open {
			if derr := x.Done(); derr != nil && err == nil {
				err = fmt.Errorf("gemm: %w", derr)
			}
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
	bufA, bufB, bufC := pr.A.Buffer(), pr.B.Buffer(), pr.C.Buffer()
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
		return e.runCUDA(p, declare)
	}
	return e.runHost(p)
}
