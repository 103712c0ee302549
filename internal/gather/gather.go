// Package gather is the gather/scatter copy kernel of package packing's
// Mover and of msg's window copies: one launch copies a table of spans
// (source address, destination address, bytes), where the time of a
// cudaMemcpyBatchAsync grows with its copies. The kernel is CUDA C++ kept
// here and compiled at run time by NVRTC for the device's own architecture,
// then loaded with cudaLibraryLoadData and launched with cudaLaunchKernel
// (CUDA 12.8+): no toolkit is needed at build time and no PTX is shipped,
// at the cost of one compilation (docs/PERFORMANCE.md) per process,
// runtime and device. Each row of the table is three little-endian 64-bit
// words: the scattered address, the block address and the byte count;
// spans over MaxChunk bytes are cut into several rows, so that big blocks
// spread over many thread blocks. Errors match distbuf.ErrUnavailable when
// the kernel cannot be had (no runtime, no NVRTC, a compile error).
package gather

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/nvrtc"
)

// copyKernelSource is the kernel, compiled at run time by NVRTC for the
// device's own architecture. Each entry of the
// table is three 64-bit words: the scattered address, the block address and
// the byte count (blocks over MaxChunk bytes are split into several
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
	// EntryBytes is the size of one row of the kernel's table.
	EntryBytes = 24
	maxGrid    = 1 << 20
	// MaxChunk bounds one table entry; a multiple of 16 keeps the pieces of
	// an aligned block aligned.
	MaxChunk = 64 << 10
)

// Kernel compiles and loads the kernel for a device once; a failure is
// remembered, so that a caller falls back without retrying.
func Kernel(d *cudart.Device) (cudart.Kernel, error) {
	ks, err := nvrtc.Kernels(d, copyKernelSource, "distbuf_copy.cu", copyKernelName)
	if err != nil {
		return 0, err
	}
	return ks[0], nil
}

// Device loads the CUDA runtime and returns its handle for device dev.
func Device(dev int) (*cudart.Device, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, err
	}
	return rt.Device(dev), nil
}

// Status reports whether the kernel is usable on device dev: nil, or why
// not (no runtime, no NVRTC, a compile error), matching
// distbuf.ErrUnavailable.
func Status(dev int) error {
	d, err := Device(dev)
	if err != nil {
		return fmt.Errorf("gather: %w: %w", distbuf.ErrUnavailable, err)
	}
	if _, err := Kernel(d); err != nil {
		return fmt.Errorf("gather: %w: %w", distbuf.ErrUnavailable, err)
	}
	return nil
}

// Entry is one row of the kernel's table: Ref bytes at the scattered
// address, Blk at the block address, N bytes. A forward launch copies Ref
// to Blk, a reverse one Blk to Ref.
type Entry struct{ Ref, Blk, N uintptr }

// Table cuts every span k (refAddr[k], blkAddr[k], sizes[k]) into entries
// of at most MaxChunk bytes.
func Table(refAddr, blkAddr, sizes []uintptr) []Entry {
	entries := make([]Entry, 0, len(sizes))
	for k, sz := range sizes {
		for off := uintptr(0); off < sz; off += MaxChunk {
			entries = append(entries, Entry{refAddr[k] + off, blkAddr[k] + off, min(MaxChunk, sz-off)})
		}
	}
	return entries
}

// Put writes entries as the kernel's table rows into mem, which holds at
// least len(entries)*EntryBytes bytes.
func Put(mem []byte, entries []Entry) {
	for k, e := range entries {
		row := mem[k*EntryBytes : (k+1)*EntryBytes]
		binary.LittleEndian.PutUint64(row[0:], uint64(e.Ref))
		binary.LittleEndian.PutUint64(row[8:], uint64(e.Blk))
		binary.LittleEndian.PutUint64(row[16:], uint64(e.N))
	}
}

// Launch enqueues the kernel k of device d on stream over the n entries of
// the table at device-readable address table, copying each entry's Ref to
// its Blk, or the other way round when reverse.
func Launch(d *cudart.Device, k cudart.Kernel, stream cudart.Stream, table uintptr, n int, reverse bool) error {
	rev := uint64(0)
	if reverse {
		rev = 1
	}
	// distbuf_copy_table(table, int n, int reverse)
	if err := d.Launch(k, min(n, maxGrid), 1, copyKernelThreads, 0, stream, uint64(table), uint64(n), rev); err != nil {
		return fmt.Errorf("gather: launch: %w", err)
	}
	return nil
}

// CopySpans enqueues on s the copy of sizes[i] bytes from srcs[i] to
// dsts[i] for every i, as one launch of the kernel: one runtime call and
// one kernel on the device however many spans. Addresses are device
// pointers, or host pointers of pinned memory, which the device reads
// through unified addressing. No destination may overlap another span. The
// kernel reads its list from pinned memory taken from s's allocator and
// freed in the order of s; the caller declares the accesses to the spans'
// buffers. It returns an error matching distbuf.ErrUnavailable when the
// kernel cannot load (Status says why), and then enqueues nothing.
func CopySpans(s *devalloc.Stream, dsts, srcs, sizes []uintptr) error {
	if s == nil || len(dsts) != len(srcs) || len(dsts) != len(sizes) {
		return fmt.Errorf("gather: copy spans: nil stream or lists of different lengths: %w", distbuf.ErrInvalid)
	}
	a := s.Allocator()
	info := a.Info()
	if info.Backend != devalloc.BackendCUDA {
		return fmt.Errorf("gather: copy spans: the %s backend has no kernel: %w", info.Backend, distbuf.ErrUnavailable)
	}
	d, err := Device(info.Device)
	if err != nil {
		return fmt.Errorf("gather: copy spans: %w: %w", distbuf.ErrUnavailable, err)
	}
	k, err := Kernel(d)
	if err != nil {
		return fmt.Errorf("gather: copy spans: %w: %w", distbuf.ErrUnavailable, err)
	}
	entries := Table(srcs, dsts, sizes)
	n := len(entries)
	if n == 0 {
		return nil
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("gather: copy spans: %d table entries: too many: %w", n, distbuf.ErrInvalid)
	}
	table, err := a.AllocPinned(int64(n)*EntryBytes, s)
	if err != nil {
		return fmt.Errorf("gather: copy spans: %w", err)
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
		err = Launch(d, k, cudart.Stream(s.Handle()), addr, n, false)
	}
	if ferr := table.Free(); err == nil {
		err = ferr
	}
	if err != nil {
		return fmt.Errorf("gather: copy spans: %w", err)
	}
	return nil
}

// writeTable fills a pinned table with entries, under a write hold.
func writeTable(table *devalloc.Buffer, entries []Entry) error {
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
		Put(mem, entries)
	}
	return errors.Join(err, h.Release())
}
