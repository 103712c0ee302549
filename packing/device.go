package packing

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/nvrtc"
)

// copyKernelSource is the gather/scatter kernel, compiled at run time by
// NVRTC for the device's own architecture (see doc.go). Each entry of the
// table is three 64-bit words: the scattered address, the block address and
// the byte count (blocks over maxChunk bytes are split into several
// entries, so that big blocks spread over many thread blocks); reverse
// copies block to scattered. One thread block per entry in a grid-stride
// loop; with 16-byte alignment each thread keeps two 16-byte loads in
// flight before storing, which is what a 4 KiB block of 128 threads needs.
const copyKernelSource = `
extern "C" __global__ void distbuf_copy_table(const unsigned long long *__restrict__ table, int n, int reverse)
{
	for (int e = blockIdx.x; e < n; e += gridDim.x) {
		unsigned long long a = __ldg(table + 3ull * e);
		unsigned long long b = __ldg(table + 3ull * e + 1);
		unsigned long long bytes = __ldg(table + 3ull * e + 2);
		const char *src = (const char *)(reverse ? b : a);
		char *dst = (char *)(reverse ? a : b);
		unsigned long long m = a | b | bytes;
		unsigned long long i = threadIdx.x, step = blockDim.x;
		if ((m & 15) == 0) {
			const uint4 *__restrict__ s = (const uint4 *)src;
			uint4 *__restrict__ d = (uint4 *)dst;
			unsigned long long n16 = bytes >> 4;
			for (; i + step < n16; i += 2 * step) {
				uint4 v0 = s[i], v1 = s[i + step];
				d[i] = v0;
				d[i + step] = v1;
			}
			if (i < n16)
				d[i] = s[i];
		} else if ((m & 7) == 0) {
			const unsigned long long *__restrict__ s = (const unsigned long long *)src;
			unsigned long long *__restrict__ d = (unsigned long long *)dst;
			for (; i < (bytes >> 3); i += step)
				d[i] = s[i];
		} else if ((m & 3) == 0) {
			const unsigned int *__restrict__ s = (const unsigned int *)src;
			unsigned int *__restrict__ d = (unsigned int *)dst;
			for (; i < (bytes >> 2); i += step)
				d[i] = s[i];
		} else {
			for (; i < bytes; i += step)
				dst[i] = src[i];
		}
	}
}
`

const (
	copyKernelName    = "distbuf_copy_table"
	copyKernelThreads = 128
	tableEntryBytes   = 24
	maxGrid           = 1 << 20
	// maxChunk bounds one table entry; a multiple of 16 keeps the pieces of
	// an aligned block aligned.
	maxChunk = 64 << 10
)

type deviceKernel struct {
	once sync.Once
	k    cudart.Kernel
	err  error
}

// kernelKey names a device of one loaded runtime: a kernel loaded through
// one libcudart is not a handle another knows.
type kernelKey struct {
	rt  *cudart.Runtime
	dev int
}

var kernels sync.Map // kernelKey -> *deviceKernel

// copyKernel compiles and loads the kernel for a device once; a failure is
// remembered, so CopyAuto falls back without retrying.
func copyKernel(d *cudart.Device) (cudart.Kernel, error) {
	v, _ := kernels.LoadOrStore(kernelKey{d.Runtime(), d.Ordinal()}, &deviceKernel{})
	dk := v.(*deviceKernel)
	dk.once.Do(func() {
		image, err := nvrtc.CompileFor(d, copyKernelSource, "distbuf_copy.cu")
		if err != nil {
			dk.err = err
			return
		}
		dk.k, dk.err = d.LoadKernel(image, copyKernelName)
	})
	return dk.k, dk.err
}

// device is the runtime's handle for device dev.
func device(dev int) (*cudart.Device, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, err
	}
	return rt.Device(dev), nil
}

// KernelStatus reports whether the gather/scatter kernel is usable on the
// device: nil, or why not (no runtime, no NVRTC, a compile error).
func KernelStatus(dev int) error {
	d, err := device(dev)
	if err != nil {
		return fmt.Errorf("packing: %w: %w", ErrUnavailable, err)
	}
	if _, err := copyKernel(d); err != nil {
		return fmt.Errorf("packing: %w: %w", ErrUnavailable, err)
	}
	return nil
}

func (m *Mover) prepareDevice(s *devalloc.Stream, refs []Ref, sizes []int64, method CopyMethod, auto, needsDevice bool) error {
	if needsDevice {
		return fmt.Errorf("packing: mover: the kernel needs every ref in device memory: %w", ErrUnavailable)
	}
	d, err := device(m.dev)
	if err != nil {
		return fmt.Errorf("packing: mover: %w: %w", ErrUnavailable, err)
	}
	n := len(refs)
	m.blkAddr, m.refAddr, m.sizes = make([]uintptr, n), make([]uintptr, n), make([]uintptr, n)
	for k, r := range refs {
		base, _, _, err := r.Buf.Region()
		if err != nil {
			return fmt.Errorf("packing: mover: %w", err)
		}
		m.refAddr[k] = base + uintptr(r.Off)
		m.blkAddr[k] = m.c.viewAt(k).Addr()
		m.sizes[k] = uintptr(sizes[k])
	}
	if method == CopyKernel {
		_, kerr := copyKernel(d)
		switch {
		case kerr == nil:
			m.method = CopyKernel
			return m.uploadTable(s)
		case !auto:
			return fmt.Errorf("packing: mover: %w: %w", ErrUnavailable, kerr)
		}
		m.fallback = "gather kernel unavailable: " + kerr.Error()
		method = CopyBatch
	}
	if method == CopyBatch && !d.Runtime().Capabilities().MemcpyBatch {
		if !auto {
			return fmt.Errorf("packing: mover: cudaMemcpyBatchAsync needs CUDA 12.8, runtime is %s: %w",
				cudart.FormatVersion(d.Runtime().RuntimeVersion()), ErrUnavailable)
		}
		method = CopyPerBlock
	}
	m.method = method
	return nil
}

// uploadTable writes the kernel's table into pinned memory in the order of
// s and copies it to the device.
// tableEntry is one row of the kernel's table.
type tableEntry struct{ ref, blk, n uintptr }

// kernelTable cuts every block into pieces of at most maxChunk bytes.
func kernelTable(refAddr, blkAddr, sizes []uintptr) []tableEntry {
	entries := make([]tableEntry, 0, len(sizes))
	for k, sz := range sizes {
		for off := uintptr(0); off < sz; off += maxChunk {
			entries = append(entries, tableEntry{refAddr[k] + off, blkAddr[k] + off, min(maxChunk, sz-off)})
		}
	}
	return entries
}

func (m *Mover) uploadTable(s *devalloc.Stream) error {
	entries := kernelTable(m.refAddr, m.blkAddr, m.sizes)
	n := len(entries)
	if n == 0 {
		return nil
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("packing: mover table of %d entries: %w", n, ErrOverflow)
	}
	m.entries = n
	a := m.c.buf.Allocator()
	bytes := int64(n) * tableEntryBytes
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
	if err := s.Enqueue(func() error { putTable(mem, entries); return nil }); err != nil {
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
	d, err := device(m.dev)
	if err != nil {
		return fmt.Errorf("packing: %w: %w", ErrUnavailable, err)
	}
	stream := cudart.Stream(s.Handle())
	dst, src := m.blkAddr, m.refAddr
	if unpack {
		dst, src = src, dst
	}
	switch m.method {
	case CopyKernel:
		k, err := copyKernel(d)
		if err != nil {
			return fmt.Errorf("packing: %w: %w", ErrUnavailable, err)
		}
		table, _, _, err := m.table.Region()
		if err != nil {
			return fmt.Errorf("packing: %w", err)
		}
		rev := uint64(0)
		if unpack {
			rev = 1
		}
		// distbuf_copy_table(table, int n, int reverse)
		err = d.Launch(k, min(m.entries, maxGrid), 1, copyKernelThreads, 0, stream, uint64(table), uint64(m.entries), rev)
		if err != nil {
			return fmt.Errorf("packing: gather kernel: %w", err)
		}
	case CopyBatch:
		if err := d.MemcpyBatch(stream, dst, src, m.sizes); err != nil {
			return fmt.Errorf("packing: %w", err)
		}
	case CopyPerBlock:
		if err := d.MemcpyEach(stream, dst, src, m.sizes); err != nil {
			return fmt.Errorf("packing: %w", err)
		}
	default:
		return errors.New("packing: unknown device copy method")
	}
	return nil
}

// CopySpans enqueues on s the copy of sizes[i] bytes from srcs[i] to
// dsts[i] for every i, as one launch of the copy kernel: one runtime call
// and one kernel on the device however many spans, where the time of a
// cudaMemcpyBatchAsync grows with its copies (docs/PERFORMANCE.md, "Ranks
// sharing a GPU"). Addresses are device
// pointers, or host pointers of pinned memory (AllocPinned), which the
// device reads through unified addressing. No destination may overlap
// another span. The kernel reads its list from pinned memory taken from
// s's allocator and freed in the order of s; the caller declares the
// accesses to the spans' buffers. It returns an error matching
// ErrUnavailable when the kernel cannot load (KernelStatus says why), and
// then enqueues nothing.
func CopySpans(s *devalloc.Stream, dsts, srcs, sizes []uintptr) error {
	if s == nil || len(dsts) != len(srcs) || len(dsts) != len(sizes) {
		return fmt.Errorf("packing: copy spans: nil stream or lists of different lengths: %w", ErrInvalid)
	}
	a := s.Allocator()
	if a.Info().Backend != devalloc.BackendCUDA {
		return fmt.Errorf("packing: copy spans: the %s backend has no kernel: %w", a.Info().Backend, ErrUnavailable)
	}
	d, err := device(a.Info().Device)
	if err != nil {
		return fmt.Errorf("packing: copy spans: %w: %w", ErrUnavailable, err)
	}
	k, err := copyKernel(d)
	if err != nil {
		return fmt.Errorf("packing: copy spans: %w: %w", ErrUnavailable, err)
	}
	entries := kernelTable(srcs, dsts, sizes)
	n := len(entries)
	if n == 0 {
		return nil
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("packing: copy spans: %d table entries: %w", n, ErrOverflow)
	}
	table, err := a.AllocPinned(int64(n)*tableEntryBytes, s)
	if err != nil {
		return fmt.Errorf("packing: copy spans: %w", err)
	}
	// Written from here: pinned memory comes with no earlier use left to
	// wait for (a hold on it waits for nothing), and the kernel, on the
	// allocating stream, is ordered before the free.
	err = writeTable(table, entries)
	var addr uintptr
	if err == nil {
		addr, _, _, err = table.Region()
	}
	if err == nil {
		// distbuf_copy_table(table, int n, int reverse): entries copy their first address to their second.
		err = d.Launch(k, min(n, maxGrid), 1, copyKernelThreads, 0, cudart.Stream(s.Handle()), uint64(addr), uint64(n), 0)
	}
	if ferr := table.Free(); err == nil {
		err = ferr
	}
	if err != nil {
		return fmt.Errorf("packing: copy spans: %w", err)
	}
	return nil
}

// writeTable fills a pinned table with entries, under a write hold.
func writeTable(table *devalloc.Buffer, entries []tableEntry) error {
	h, err := table.Hold(devalloc.Write)
	if err != nil {
		return err
	}
	err = h.Wait()
	var mem []byte
	if err == nil {
		mem, err = table.Bytes()
	}
	if err == nil {
		putTable(mem, entries)
	}
	return errors.Join(err, h.Release())
}

// putTable writes entries as the kernel's table rows into mem.
func putTable(mem []byte, entries []tableEntry) {
	for k, e := range entries {
		row := mem[k*tableEntryBytes : (k+1)*tableEntryBytes]
		binary.LittleEndian.PutUint64(row[0:], uint64(e.ref))
		binary.LittleEndian.PutUint64(row[8:], uint64(e.blk))
		binary.LittleEndian.PutUint64(row[16:], uint64(e.n))
	}
}
