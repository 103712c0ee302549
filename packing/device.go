package packing

import (
	"errors"
	"fmt"
	"math"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/gather"
)

// The device side of a Mover: the gather/scatter kernel (internal/gather)
// over a table uploaded once per Mover, or the runtime's batched or
// per-block copies when the kernel cannot be had.

func (m *Mover) prepareDevice(s *devalloc.Stream, refs []Ref, sizes []int64, method copyMethod, auto, needsDevice bool) error {
	if needsDevice {
		return fmt.Errorf("packing: mover: the kernel needs every ref in device memory: %w", distbuf.ErrUnavailable)
	}
	d, err := gather.Device(m.dev)
	if err != nil {
		return fmt.Errorf("packing: mover: %w: %w", distbuf.ErrUnavailable, err)
	}
	n := len(refs)
	m.blkAddr, m.refAddr, m.sizes = make([]uintptr, n), make([]uintptr, n), make([]uintptr, n)
	for k, r := range refs {
		base, _, _, err := r.Buf.Region()
		if err != nil {
			return fmt.Errorf("packing: mover: %w", err)
		}
		m.refAddr[k] = base + uintptr(r.Off)
		m.blkAddr[k] = m.c.viewAt(k).addr()
		m.sizes[k] = uintptr(sizes[k])
	}
	if method == copyKernel {
		_, kerr := gather.Kernel(d)
		switch {
		case kerr == nil:
			m.method = copyKernel
			return m.uploadTable(s)
		case !auto:
			return fmt.Errorf("packing: mover: %w: %w", distbuf.ErrUnavailable, kerr)
		}
		m.fallback = "gather kernel unavailable: " + kerr.Error()
		method = copyBatch
	}
	if method == copyBatch && !d.Runtime().Capabilities().MemcpyBatch {
		if !auto {
			return fmt.Errorf("packing: mover: cudaMemcpyBatchAsync needs CUDA 12.8, runtime is %s: %w",
				cudart.FormatVersion(d.Runtime().RuntimeVersion()), distbuf.ErrUnavailable)
		}
		method = copyPerBlock
	}
	m.method = method
	return nil
}

// uploadTable writes the kernel's table into pinned memory in the order of
// s and copies it to the device.
func (m *Mover) uploadTable(s *devalloc.Stream) error {
	entries := gather.Table(m.refAddr, m.blkAddr, m.sizes)
	n := len(entries)
	if n == 0 {
		return nil
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("packing: mover table of %d entries: too large: %w", n, distbuf.ErrInvalid)
	}
	m.entries = n
	a := m.c.buf.Allocator()
	bytes := int64(n) * gather.EntryBytes
	pin, err := a.AllocPinned(bytes, s)
	if err != nil {
		return fmt.Errorf("packing: mover table: %w", err)
	}
	defer func() { _ = pin.Free() }()
	mem, err := pin.Bytes()
	if err != nil {
		return fmt.Errorf("packing: mover table: %w", err)
	}
	// Work on the allocating stream needs no ledger declaration.
	if err := s.Enqueue(func() error { gather.Put(mem, entries); return nil }); err != nil {
		return fmt.Errorf("packing: mover table: %w", err)
	}
	tab, err := a.Alloc(bytes, s)
	if err != nil {
		return fmt.Errorf("packing: mover table: %w", err)
	}
	if err := s.Copy(tab, 0, pin, 0, bytes); err != nil {
		_ = tab.Free()
		return fmt.Errorf("packing: mover table: %w", err)
	}
	m.table = tab
	return nil
}

func (m *Mover) runDevice(s *devalloc.Stream, unpack bool) error {
	n := len(m.sizes)
	if n == 0 {
		return nil
	}
	d, err := gather.Device(m.dev)
	if err != nil {
		return fmt.Errorf("packing: %w: %w", distbuf.ErrUnavailable, err)
	}
	stream := cudart.Stream(s.Handle())
	dst, src := m.blkAddr, m.refAddr
	if unpack {
		dst, src = src, dst
	}
	switch m.method {
	case copyKernel:
		k, err := gather.Kernel(d)
		if err != nil {
			return fmt.Errorf("packing: %w: %w", distbuf.ErrUnavailable, err)
		}
		table, _, _, err := m.table.Region()
		if err != nil {
			return fmt.Errorf("packing: %w", err)
		}
		if err := gather.Launch(d, k, stream, table, m.entries, unpack); err != nil {
			return fmt.Errorf("packing: %w", err)
		}
	case copyBatch:
		if err := d.MemcpyBatch(stream, dst, src, m.sizes); err != nil {
			return fmt.Errorf("packing: %w", err)
		}
	case copyPerBlock:
		if err := d.MemcpyEach(stream, dst, src, m.sizes); err != nil {
			return fmt.Errorf("packing: %w", err)
		}
	default:
		return errors.New("packing: unknown device copy method")
	}
	return nil
}
