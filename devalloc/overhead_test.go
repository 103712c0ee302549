package devalloc

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/distbuf/distbuf"
)

// nullBackend does no memory or stream work at all: benchmarks on it time
// devalloc's own Go code on the hot path (the ledger, the live list, the
// counters), which every backend pays on top of its driver.
type nullBackend struct {
	mu   sync.Mutex
	next uintptr
}

type nullStream struct{}

type nullEvent struct{}

func (*nullBackend) kind() backendKind              { return kindCUDAPool }
func (*nullBackend) describe() string               { return "null" }
func (*nullBackend) memInfo() (int64, int64)        { return 1 << 40, 1 << 40 }
func (*nullBackend) newStream() (streamImpl, error) { return nullStream{}, nil }
func (b *nullBackend) alloc(size int64, _ streamImpl) (uintptr, unsafe.Pointer, error) {
	b.mu.Lock()
	b.next += uintptr(size)
	a := b.next
	b.mu.Unlock()
	return a, nil, nil
}
func (*nullBackend) freeAsync(uintptr, int64, streamImpl) error        { return nil }
func (*nullBackend) copyAsync(memRef, memRef, int64, streamImpl) error { return nil }
func (*nullBackend) memsetAsync(memRef, byte, int64, streamImpl) error { return nil }
func (*nullBackend) allocPinned(int64) (unsafe.Pointer, error)         { return nil, distbuf.ErrUnavailable }
func (*nullBackend) freePinned(unsafe.Pointer, int64) error            { return nil }
func (*nullBackend) setReleaseThreshold(uint64) error                  { return nil }
func (*nullBackend) prime(int64, streamImpl) error                     { return nil }
func (*nullBackend) trim(int64) error                                  { return nil }
func (*nullBackend) reserved() int64                                   { return 0 }
func (*nullBackend) releaseUnused() error                              { return nil }
func (*nullBackend) syncPoint()                                        {}
func (*nullBackend) usage() poolUsage                                  { return poolUsage{} }
func (*nullBackend) resetHigh()                                        {}
func (*nullBackend) close() error                                      { return nil }
func (nullStream) handle() uintptr                                     { return 0 }
func (nullStream) record() (eventImpl, error)                          { return nullEvent{}, nil }
func (nullStream) wait(eventImpl) error                                { return nil }
func (nullStream) waitHost(<-chan struct{}) error                      { return nil }
func (nullStream) abandonHostWaits()                                   {}
func (nullStream) enqueue(func() error) error                          { return nil }
func (nullStream) synchronize() error                                  { return nil }
func (nullStream) hostFunctionsSeen()                                  {}
func (nullStream) destroy() error                                      { return nil }
func (nullEvent) query() (bool, error)                                 { return true, nil }
func (nullEvent) synchronize() error                                   { return nil }
func (nullEvent) destroy() error                                       { return nil }

// openOn makes an allocator on a test backend, such as the null one; the
// caller closes it.
func openOn(tb testing.TB, be backend) *Allocator {
	tb.Helper()
	a := &Allocator{be: be, warn: func(string) {}, streams: map[*Stream]struct{}{}, drained: make(chan struct{}, 1)}
	if err := a.init("test"); err != nil {
		tb.Fatal(err)
	}
	return a
}

func openNull(tb testing.TB) *Allocator {
	tb.Helper()
	a := openOn(tb, &nullBackend{})
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Error(err)
		}
	})
	return a
}

// BenchmarkOverhead times devalloc's Go code per operation, with a backend
// that does nothing: what the allocator adds to each driver call.
func BenchmarkOverhead(b *testing.B) { benchOverhead(b, openNull) }

// benchOverhead times Alloc+Free, Alloc+Memset+Free and a 2020-buffer
// cycle on allocators that open makes, one per sub-benchmark and closed by
// its cleanup.
func benchOverhead(b *testing.B, open func(testing.TB) *Allocator) {
	// 4 KiB is served by the same-stream reuse on the CUDA pool; 32 MiB is
	// past its bound, so its Alloc and Free each reach the driver.
	for _, size := range []int64{4 << 10, 32 << 20} {
		for _, memset := range []bool{false, true} {
			name := "op=alloc-free"
			if memset {
				name = "op=alloc-memset-free"
			}
			if size > 4<<10 {
				name += "/size=32MiB"
			}
			b.Run(name, func(b *testing.B) {
				a := open(b)
				s := a.DefaultStream()
				for b.Loop() {
					buf, err := a.Alloc(size, s)
					if err != nil {
						b.Fatal(err)
					}
					if memset {
						if err := s.Memset(buf, 0, 4096, 1); err != nil {
							b.Fatal(err)
						}
					}
					if err := buf.Free(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("op=cycle/buffers=2020", func(b *testing.B) {
		a := open(b)
		s := a.DefaultStream()
		sizes := make([]int64, 2020)
		for i := range sizes {
			sizes[i] = int64(256 + i)
		}
		bufs := make([]*Buffer, len(sizes))
		for b.Loop() {
			cycle(b, a, s, sizes, 64, bufs)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2020, "ns/buffer")
	})
}

// cycle allocates a buffer of each size on s, sets the first touch bytes of
// each, frees them and synchronises s: one cycle of a solve, as the cycle
// benchmarks time it. bufs, as long as sizes, holds the buffers so that the
// cycle itself allocates nothing on the heap.
func cycle(tb testing.TB, a *Allocator, s *Stream, sizes []int64, touch int64, bufs []*Buffer) {
	for i, n := range sizes {
		buf, err := a.Alloc(n, s)
		if err != nil {
			tb.Fatal(err)
		}
		bufs[i] = buf
	}
	for _, buf := range bufs {
		if err := s.Memset(buf, 0, touch, 1); err != nil {
			tb.Fatal(err)
		}
		if err := buf.Free(); err != nil {
			tb.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		tb.Fatal(err)
	}
}
