package packing

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
)

// OnHost runs fn with c's blocks addressable from Go, in the order of s, the
// same way on every backend: host code that reads or fills blocks, written
// and tested on the host backend, runs unchanged on a GPU. It is the one
// host access to blocks that packing gives.
//
// fn sees the blocks as they are after all work enqueued on s before the
// call and after the conflicting work the ledger records on other streams
// and for outside agents (holds), which OnHost waits for. With mode
// devalloc.Write, work enqueued on s after OnHost returns, and work declared
// on any stream, sees what fn wrote. With devalloc.Read fn must not write
// the slices: on memory Go addresses they are c's own memory, which streams
// and MPI may be reading meanwhile, and on device memory they are a staging
// copy whose changes are lost.
//
// Where Go addresses c's memory (the host backend, pinned memory) the slices
// are that memory, with no copy. OnHost declares an access of the mode on s
// and waits on the host for s to reach it, then holds c's buffer (a Hold of
// the mode) while fn runs: a Free meanwhile keeps the memory until fn is
// done, and work that other streams declare meanwhile waits for fn, except
// a write during a Write, which the ledger refuses with distbuf.ErrConflict.
//
// On device memory OnHost stages the group through pinned memory: a buffer
// of c's layout from the allocator's pinned pool (reused once warm), a copy
// of c into it on s (for Write too, so that blocks fn leaves alone keep
// their values), a host wait for that copy, fn on the pinned blocks, and for
// Write a copy back on s. A staged Write is one write of c declared on s from
// before the copy in to after the copy back, so that no other stream's
// write can fall between them and be overwritten by the copy back: while fn
// runs, any access to c declared on another stream, and any Hold, fails
// with distbuf.ErrConflict. OnHost returns once the copy back is enqueued,
// without waiting for it: the staging buffer's Free is ordered after it in
// s, and its pinned block goes back to the pool only once the copy has read
// it. The cost is two copies of the whole group (one for Read) and a host
// wait for s: OnHost is for host work on the blocks, not for moving a few
// of them out of a large buffer (a Mover does that on the device).
//
// Whatever fn wrote is in c when OnHost returns, whether fn returned nil,
// an error or panicked, as on host memory, where fn writes in place. fn's
// error is returned as is, joined (errors.Join) with any error of the
// cleanup; a panic goes on up once the hold is released, or the copy back
// is enqueued and the staging buffer freed. fn must not free c, nor declare
// work on c or wait for work that touches c: that work may be waiting for
// fn. Bad input (a nil or freed c, a nil stream or function, a mode other
// than Read or Write, a stream of another allocator) returns an error
// matching distbuf.ErrInvalid or distbuf.ErrFreed, and fn is not called.
func (c *Coalesced) OnHost(s *devalloc.Stream, mode devalloc.Mode, fn func(h *HostBlocks) error) error {
	if err := c.check(); err != nil {
		return err
	}
	switch {
	case s == nil:
		return fmt.Errorf("packing: on host: nil stream: %w", distbuf.ErrInvalid)
	case fn == nil:
		return fmt.Errorf("packing: on host: nil function: %w", distbuf.ErrInvalid)
	case mode != devalloc.Read && mode != devalloc.Write:
		return fmt.Errorf("packing: on host: mode %v: want devalloc.Read or devalloc.Write: %w", mode, distbuf.ErrInvalid)
	case s.Allocator() != c.buf.Allocator():
		return fmt.Errorf("packing: on host: the stream belongs to another allocator than coalesced buffer #%d: %w", c.buf.ID(), distbuf.ErrInvalid)
	}
	if c.host != nil {
		return c.onHostInPlace(s, mode, fn)
	}
	return c.onHostStaged(s, mode, fn)
}

// onHostInPlace runs fn on c's own memory.
func (c *Coalesced) onHostInPlace(s *devalloc.Stream, mode devalloc.Mode, fn func(*HostBlocks) error) (err error) {
	// An access declared on s and ended at once makes s wait for what the
	// ledger orders before fn, outside holds included: a Hold taken first
	// would refuse an unreleased conflicting hold (an MPI receive in
	// flight) instead of waiting for it. Waiting for s then covers that and
	// s's own earlier work, undeclared work included.
	x, err := c.declare(s, mode)
	if err != nil {
		return err
	}
	if err := x.Done(); err != nil {
		return fmt.Errorf("packing: on host: %w", err)
	}
	if err := waitStream(s); err != nil {
		return err
	}
	h, err := c.buf.Hold(mode)
	if err != nil {
		return fmt.Errorf("packing: on host: %w", err)
	}
	defer func() {
		if rerr := h.Release(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("packing: on host: %w", rerr))
		}
	}()
	// What another stream declared between the wait and the hold.
	if err := h.Wait(); err != nil {
		return fmt.Errorf("packing: on host: %w", err)
	}
	return runOnHost(c, c, fn)
}

// onHostStaged runs fn on a pinned copy of c's device memory.
func (c *Coalesced) onHostStaged(s *devalloc.Stream, mode devalloc.Mode, fn func(*HostBlocks) error) (err error) {
	// The staging copy brings c's padding, so there is none to clear.
	stage, err := allocLayout(c.buf.Allocator(), c.plan, c.group, 0, s, true, false)
	if err != nil {
		return err
	}
	// Deferred calls run last first: the copy back, the end of the write,
	// then this free, which the stream orders after the copy back.
	defer func() {
		if ferr := stage.Free(); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}()
	if mode == devalloc.Write {
		x, derr := c.declare(s, devalloc.Write)
		if derr != nil {
			return derr
		}
		defer func() {
			if derr := x.Done(); derr != nil {
				err = errors.Join(err, fmt.Errorf("packing: on host: %w", derr))
			}
		}()
	}
	if err := transfer(s, stage, c); err != nil {
		return err
	}
	if err := waitStream(s); err != nil {
		return err
	}
	if mode == devalloc.Write {
		defer func() {
			if terr := transfer(s, c, stage); terr != nil {
				err = errors.Join(err, terr)
			}
		}()
	}
	return runOnHost(c, stage, fn)
}

// declare opens an access of the given mode to c's buffer on s.
func (c *Coalesced) declare(s *devalloc.Stream, mode devalloc.Mode) (*devalloc.Access, error) {
	var x *devalloc.Access
	var err error
	if mode == devalloc.Write {
		x, err = c.buf.Write(s)
	} else {
		x, err = c.buf.Read(s)
	}
	if err != nil {
		return nil, fmt.Errorf("packing: on host: %w", err)
	}
	return x, nil
}

// waitStream blocks until s has run the work enqueued on it so far.
func waitStream(s *devalloc.Stream) error {
	ev, err := s.Record()
	if err != nil {
		return fmt.Errorf("packing: on host: %w", err)
	}
	err = ev.Wait()
	if rerr := ev.Release(); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("packing: on host: wait for the stream: %w", err)
	}
	return nil
}

// runOnHost calls fn on the blocks of mem (c itself or its staging copy)
// and ends the HostBlocks when fn returns or panics.
func runOnHost(c, mem *Coalesced, fn func(*HostBlocks) error) error {
	h := &HostBlocks{mem: mem, buf: c.buf.ID()}
	defer h.over.Store(true)
	return fn(h)
}

// HostBlocks is the blocks of a Coalesced, addressable from Go, that OnHost
// hands to its function: typed slices of each block's elements (row-major)
// by group position (Coalesced.Position gives a block id's), checked
// against the block's dtype. The slices are valid only while that function runs (on device
// memory they are staging memory that goes back to the pool afterwards):
// keep none. Once the function has returned, every method but Len returns
// an error matching distbuf.ErrInvalid. The methods are safe for concurrent use.
type HostBlocks struct {
	mem  *Coalesced // the memory fn works on: the Coalesced or its staging copy
	buf  uint64     // the Coalesced's buffer, to name in errors
	over atomic.Bool
}

// Len is the number of blocks.
func (h *HostBlocks) Len() int { return h.mem.n }

func (h *HostBlocks) live() error {
	if h.over.Load() {
		return fmt.Errorf("packing: blocks of coalesced buffer #%d used after OnHost's function returned: %w", h.buf, distbuf.ErrInvalid)
	}
	return nil
}

// Desc is the descriptor of the block at group position k: its id, dtype
// and shape.
func (h *HostBlocks) Desc(k int) (Desc, error) {
	if err := h.check(k); err != nil {
		return Desc{}, err
	}
	return h.mem.viewAt(k).Desc(), nil
}

func (h *HostBlocks) check(k int) error {
	if err := h.live(); err != nil {
		return err
	}
	if uint(k) >= uint(h.mem.n) {
		return fmt.Errorf("packing: block %d of coalesced buffer #%d, which has %d: %w", k, h.buf, h.mem.n, distbuf.ErrInvalid)
	}
	return nil
}

// block returns the address and view of the block at position k, checking
// that it holds want (0: any dtype).
func (h *HostBlocks) block(k int, want DType) (unsafe.Pointer, View, error) {
	if err := h.check(k); err != nil {
		return nil, View{}, err
	}
	v := h.mem.viewAt(k)
	if want != 0 && v.dtype() != want {
		return nil, View{}, fmt.Errorf("packing: block %d (id %d) of coalesced buffer #%d holds %s, not %s: %w", k, v.id(), h.buf, v.dtype(), want, distbuf.ErrInvalid)
	}
	return unsafe.Add(h.mem.host, v.Offset()), v, nil
}

func hostSlice[T any](h *HostBlocks, k int, want DType) ([]T, error) {
	p, v, err := h.block(k, want)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*T)(p), v.length()), nil
}

// Bytes is the bytes of the block at position k, whatever its dtype.
func (h *HostBlocks) Bytes(k int) ([]byte, error) {
	p, v, err := h.block(k, 0)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), v.bytes()), nil
}

// Float32s is the elements of the Float32 block at position k.
func (h *HostBlocks) Float32s(k int) ([]float32, error) { return hostSlice[float32](h, k, Float32) }

// Float64s is the elements of the Float64 block at position k.
func (h *HostBlocks) Float64s(k int) ([]float64, error) { return hostSlice[float64](h, k, Float64) }

// Complex64s is the elements of the Complex64 block at position k.
func (h *HostBlocks) Complex64s(k int) ([]complex64, error) {
	return hostSlice[complex64](h, k, Complex64)
}

// Complex128s is the elements of the Complex128 block at position k.
func (h *HostBlocks) Complex128s(k int) ([]complex128, error) {
	return hostSlice[complex128](h, k, Complex128)
}
