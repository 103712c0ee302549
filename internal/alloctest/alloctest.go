package alloctest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/stretchr/testify/require"
)

// Harness opens allocators on the backend under test.
type Harness struct {
	// Backend is passed in Options.Backend.
	Backend devalloc.Backend
	// Pool is the Info.Pool the allocators must report: true for the CUDA
	// pool, false for the cudaMalloc fallback and the host backend.
	Pool bool
	// Device is passed in Options.Device.
	Device int
}

func (h Harness) open(t *testing.T, cfg devalloc.Config, mod ...func(*devalloc.Options)) *devalloc.Allocator {
	t.Helper()
	opts := devalloc.Options{Backend: h.Backend, Device: h.Device, Config: &cfg, Warn: func(msg string) { t.Log(msg) }}
	for _, m := range mod {
		m(&opts)
	}
	a, err := devalloc.Open(opts)
	require.NoError(t, err)
	require.Equal(t, h.Backend, a.Info().Backend)
	require.Equal(t, h.Pool, a.Info().Pool)
	return a
}

// closeClean closes a and requires that nothing leaked.
func closeClean(t *testing.T, a *devalloc.Allocator) {
	t.Helper()
	require.NoError(t, a.Close())
}

// gate holds stream s back until the returned function is called.
func gate(t *testing.T, s *devalloc.Stream) (open func()) {
	t.Helper()
	ch := make(chan struct{})
	require.NoError(t, s.Enqueue(func() error { <-ch; return nil }))
	var once sync.Once
	open = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(open)
	return open
}

// stillPending records an event on s after its work so far, waits a
// moment, and requires that it has not completed (why says what must not
// have run yet); it returns the event.
func stillPending(t *testing.T, s *devalloc.Stream, why string) *devalloc.Event {
	t.Helper()
	ev, err := s.Record()
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	done, err := ev.Done()
	require.NoError(t, err)
	require.False(t, done, why)
	return ev
}

// alloc allocates size bytes of device memory of a on s.
func alloc(t *testing.T, a *devalloc.Allocator, size int64, s *devalloc.Stream) *devalloc.Buffer {
	t.Helper()
	b, err := a.Alloc(size, s)
	require.NoError(t, err)
	return b
}

// allocPinned allocates size bytes of pinned host memory of a on s.
func allocPinned(t *testing.T, a *devalloc.Allocator, size int64, s *devalloc.Stream) *devalloc.Buffer {
	t.Helper()
	b, err := a.AllocPinned(size, s)
	require.NoError(t, err)
	return b
}

// newStream makes a stream of a, closed with it.
func newStream(t *testing.T, a *devalloc.Allocator) *devalloc.Stream {
	t.Helper()
	s, err := a.NewStream()
	require.NoError(t, err)
	return s
}

// readBack copies b into a fresh pinned buffer of a on s and returns its
// bytes once s has run.
func readBack(t *testing.T, a *devalloc.Allocator, s *devalloc.Stream, b *devalloc.Buffer) []byte {
	t.Helper()
	p := allocPinned(t, a, b.Size(), s)
	require.NoError(t, s.Copy(p, 0, b, 0, b.Size()))
	require.NoError(t, s.Synchronize())
	mem, err := p.Bytes()
	require.NoError(t, err)
	out := bytes.Clone(mem)
	require.NoError(t, p.Free())
	return out
}

// ReadAll copies a buffer's bytes to the host, through pinned memory of its
// own allocator, once s has run: the one way tests read device memory.
func ReadAll(t *testing.T, s *devalloc.Stream, b *devalloc.Buffer) []byte {
	t.Helper()
	return readBack(t, b.Allocator(), s, b)
}

// WriteAll fills a buffer from host bytes in the order of s, through pinned
// memory of its own allocator.
func WriteAll(t *testing.T, s *devalloc.Stream, b *devalloc.Buffer, data []byte) {
	t.Helper()
	require.Equal(t, int(b.Size()), len(data))
	p, err := b.Allocator().AllocPinned(b.Size(), s)
	require.NoError(t, err)
	mem, err := p.Bytes()
	require.NoError(t, err)
	copy(mem, data)
	require.NoError(t, s.Copy(b, 0, p, 0, b.Size()))
	require.NoError(t, p.Free())
}

func fill(n int, v byte) []byte { return bytes.Repeat([]byte{v}, n) }

// Run runs every conformance test against the harness's backend.
func Run(t *testing.T, h Harness) {
	t.Run("Open", func(t *testing.T) { testOpen(t, h) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, h) })
	t.Run("UseAfterFree", func(t *testing.T) { testUseAfterFree(t, h) })
	t.Run("AfterClose", func(t *testing.T) { testAfterClose(t, h) })
	t.Run("Events", func(t *testing.T) { testEvents(t, h) })
	t.Run("WaitOrdersStreams", func(t *testing.T) { testWaitOrdersStreams(t, h) })
	t.Run("EnqueueErrors", func(t *testing.T) { testEnqueueErrors(t, h) })
	t.Run("ReadWaitsForWriter", func(t *testing.T) { testReadWaitsForWriter(t, h) })
	t.Run("WriteWaitsForReaders", func(t *testing.T) { testWriteWaitsForReaders(t, h) })
	t.Run("FreeAfterCompletions", func(t *testing.T) { testFreeAfterCompletions(t, h) })
	t.Run("AllocStreamOrder", func(t *testing.T) { testAllocStreamOrder(t, h) })
	t.Run("Conflicts", func(t *testing.T) { testConflicts(t, h) })
	t.Run("HoldRead", func(t *testing.T) { testHoldRead(t, h) })
	t.Run("HoldWrite", func(t *testing.T) { testHoldWrite(t, h) })
	t.Run("MarksRecordNothingOnOneStream", func(t *testing.T) { testMarksOneStream(t, h) })
	t.Run("MarkSealedBeforeHostWait", func(t *testing.T) { testMarkSealedBeforeHostWait(t, h) })
	t.Run("MarkSealedBeforeEnqueue", func(t *testing.T) { testMarkSealedBeforeEnqueue(t, h) })
	t.Run("Policy", func(t *testing.T) { testPolicy(t, h) })
	t.Run("PrimeTrim", func(t *testing.T) { testPrimeTrim(t, h) })
	t.Run("Budget", func(t *testing.T) { testBudget(t, h) })
	t.Run("OOMLadder", func(t *testing.T) { testOOMLadder(t, h) })
	t.Run("BackendOOM", func(t *testing.T) { testBackendOOM(t, h) })
	t.Run("Stats", func(t *testing.T) { testStats(t, h) })
	t.Run("Leaks", func(t *testing.T) { testLeaks(t, h) })
	t.Run("CloseAbandonsHoldWaits", func(t *testing.T) { testCloseAbandonsHoldWaits(t, h) })
	t.Run("OOMCallbackFreesDuringClose", func(t *testing.T) { testOOMCallbackDuringClose(t, h) })
	t.Run("Pinned", func(t *testing.T) { testPinned(t, h) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, h) })
	t.Run("Config", func(t *testing.T) { testConfig(t, h) })
}

func testOpen(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	info := a.Info()
	require.NotEmpty(t, info.Description)
	require.Equal(t, h.Backend == devalloc.BackendCUDA && !h.Pool, info.FallbackReason != "", "a fallback, and only a fallback, gives a reason: %q", info.FallbackReason)
	require.Equal(t, devalloc.Auto, info.Config.Policy, "auto is the default")
	require.Zero(t, info.Limit)
	require.Equal(t, h.Device, info.Device)
	require.NotNil(t, a.DefaultStream())
	require.Positive(t, info.TotalMemory)
	closeClean(t, a)
}

func testBadInput(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	for _, n := range []int64{0, -1, 1 << 51} {
		_, err := a.Alloc(n, s)
		require.ErrorIs(t, err, distbuf.ErrInvalid, "size %d", n)
		_, err = a.AllocPinned(n, s)
		require.ErrorIs(t, err, distbuf.ErrInvalid, "pinned size %d", n)
	}
	_, err := a.Alloc(64, nil)
	require.ErrorIs(t, err, distbuf.ErrInvalid)

	other := h.open(t, devalloc.Config{})
	_, err = a.Alloc(64, other.DefaultStream())
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "another allocator")

	b := alloc(t, a, 100, s)
	_, err = b.Read(other.DefaultStream())
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorIs(t, s.Memset(b, 90, 20, 0), distbuf.ErrInvalid)
	require.ErrorIs(t, s.Memset(b, -1, 2, 0), distbuf.ErrInvalid)
	require.ErrorIs(t, s.Copy(b, 0, b, 10, 20), distbuf.ErrInvalid, "overlap")
	require.ErrorIs(t, s.Copy(b, 0, nil, 0, 1), distbuf.ErrInvalid)
	_, err = b.Hold(devalloc.Mode(7))
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorIs(t, s.Enqueue(nil), distbuf.ErrInvalid)
	_, err = devalloc.Open(devalloc.Options{Backend: h.Backend, Device: h.Device, Config: &devalloc.Config{Prime: -2}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorIs(t, a.Trim(-1), distbuf.ErrInvalid)
	require.ErrorIs(t, a.SetPolicy(devalloc.Policy(9)), distbuf.ErrInvalid)
	require.ErrorIs(t, a.DefaultStream().Close(), distbuf.ErrInvalid)
	if a.Info().Backend != devalloc.BackendCUDA {
		_, err = b.Bytes()
		require.NoError(t, err)
	} else {
		_, err = b.Bytes()
		require.ErrorIs(t, err, distbuf.ErrNotHostAccessible)
	}
	require.NoError(t, b.Free())
	closeClean(t, other)
	closeClean(t, a)
}

func testUseAfterFree(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	b := alloc(t, a, 4096, s)
	x, err := b.Write(s)
	require.NoError(t, err)
	require.NoError(t, b.Free())
	err = b.Free()
	require.ErrorIs(t, err, distbuf.ErrFreed)
	require.ErrorContains(t, err, "double free")
	require.ErrorIs(t, x.Done(), distbuf.ErrInvalid, "Free closed the open access")
	_, err = b.Bytes()
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, _, _, err = b.Region()
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = b.Read(s)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = b.Write(s)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	_, err = b.Hold(devalloc.Read)
	require.ErrorIs(t, err, distbuf.ErrFreed)
	require.ErrorIs(t, s.Memset(b, 0, 1, 0), distbuf.ErrFreed)

	c := alloc(t, a, 64, s)
	x, err = c.Read(s)
	require.NoError(t, err)
	require.NoError(t, x.Done())
	require.ErrorIs(t, x.Done(), distbuf.ErrInvalid, "Done twice")
	hd, err := c.Hold(devalloc.Read)
	require.NoError(t, err)
	require.NoError(t, hd.Release())
	require.ErrorIs(t, hd.Release(), distbuf.ErrInvalid, "Release twice")
	require.ErrorIs(t, hd.Wait(), distbuf.ErrInvalid, "Wait after Release")
	require.NoError(t, c.Free())
	closeClean(t, a)
}

func testAfterClose(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := newStream(t, a)
	ev, err := s.Record()
	require.NoError(t, err)
	closeClean(t, a)
	require.ErrorIs(t, a.Close(), distbuf.ErrClosed)
	_, err = a.Alloc(64, s)
	require.ErrorIs(t, err, distbuf.ErrClosed)
	_, err = a.NewStream()
	require.ErrorIs(t, err, distbuf.ErrClosed)
	require.ErrorIs(t, s.Synchronize(), distbuf.ErrClosed)
	require.ErrorIs(t, s.Enqueue(func() error { return nil }), distbuf.ErrClosed)
	_, err = ev.Done()
	require.ErrorIs(t, err, distbuf.ErrClosed)
	require.ErrorIs(t, a.Trim(0), distbuf.ErrClosed)
	require.ErrorIs(t, a.SetPolicy(devalloc.AggressiveFree), distbuf.ErrClosed)
	_ = a.Stats() // still readable for final reports
}

func testEvents(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s1, s2 := newStream(t, a), newStream(t, a)
	b := alloc(t, a, 1024, s1)
	require.NoError(t, s1.Memset(b, 0, 1024, 0))
	require.NoError(t, s1.Synchronize())

	open := gate(t, s1)
	// Written on s1 behind the gate; s2 is ordered only by the user's event.
	require.NoError(t, s1.Memset(b, 0, 1024, 0x5a))
	ev, err := s1.Record()
	require.NoError(t, err)
	done, err := ev.Done()
	require.NoError(t, err)
	require.False(t, done, "event behind a closed gate must not be done")
	require.NoError(t, s2.Wait(ev))
	p := allocPinned(t, a, 1024, s2)
	// Copy on s2 without a ledger declaration for b: only the event orders it.
	x, err := p.Write(s2)
	require.NoError(t, err)
	ev2, err := s2.Record()
	require.NoError(t, err)
	open()
	require.NoError(t, ev.Wait())
	require.NoError(t, ev2.Wait())
	done, err = ev.Done()
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, x.Done())
	require.NoError(t, s2.Copy(p, 0, b, 0, 1024))
	require.NoError(t, s2.Synchronize())
	mem, err := p.Bytes()
	require.NoError(t, err)
	require.Equal(t, fill(1024, 0x5a), mem)
	require.NoError(t, ev.Release())
	require.ErrorIs(t, ev.Release(), distbuf.ErrInvalid)
	require.ErrorIs(t, ev.Wait(), distbuf.ErrInvalid)
	require.ErrorIs(t, s2.Wait(ev), distbuf.ErrInvalid)
	require.NoError(t, ev2.Release())
	require.NoError(t, p.Free())
	require.NoError(t, b.Free())
	require.NoError(t, s2.Close())
	require.ErrorIs(t, s2.Close(), distbuf.ErrClosed)
	closeClean(t, a)
}

// testWaitOrdersStreams: work enqueued on s2 after s2.Wait(ev) runs after
// the work ev marks on s1, with nothing else to order them (a host function
// reading raw memory declares nothing in the ledger). s1 is held back by an
// outside writer's hold, a wait inside the stream rather than a host
// function, so that a runtime that runs host functions one at a time cannot
// order the two streams by itself.
func testWaitOrdersStreams(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s1 := newStream(t, a)
	s2 := newStream(t, a)
	const n = 256
	gateBuf := allocPinned(t, a, n, s1)
	flag := allocPinned(t, a, n, s1)
	sink := allocPinned(t, a, n, s1)
	require.NoError(t, s1.Memset(flag, 0, n, 0))
	require.NoError(t, s1.Synchronize())
	hold, err := gateBuf.Hold(devalloc.Write)
	require.NoError(t, err)
	require.NoError(t, hold.Wait())
	require.NoError(t, s1.Copy(sink, 0, gateBuf, 0, n)) // reads gateBuf: waits for the hold's release
	require.NoError(t, s1.Memset(flag, 0, n, 0x5a))
	ev, err := s1.Record()
	require.NoError(t, err)
	require.NoError(t, s2.Wait(ev))
	mem, err := flag.Bytes()
	require.NoError(t, err)
	ran := make(chan byte, 1)
	require.NoError(t, s2.Enqueue(func() error { ran <- mem[n-1]; return nil }))
	select {
	case v := <-ran:
		t.Fatalf("work after Stream.Wait ran before the event's work (read %#x): the wait did not order the streams", v)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, hold.Release())
	require.NoError(t, s2.Synchronize())
	require.Equal(t, byte(0x5a), <-ran, "s2 read the flag before s1 wrote it")
	require.NoError(t, ev.Release())
	require.NoError(t, gateBuf.Free())
	require.NoError(t, flag.Free())
	require.NoError(t, sink.Free())
	require.NoError(t, s1.Close())
	require.NoError(t, s2.Close())
	closeClean(t, a)
}

func testEnqueueErrors(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	boom := errors.New("boom")
	ran := false
	require.NoError(t, s.Enqueue(func() error { return boom }))
	require.NoError(t, s.Enqueue(func() error { panic("kaboom") }))
	require.NoError(t, s.Enqueue(func() error { ran = true; return nil }))
	err := s.Synchronize()
	require.ErrorIs(t, err, boom)
	require.True(t, ran, "work after a failure still runs")
	require.NoError(t, s.Enqueue(func() error { panic("kaboom") }))
	require.ErrorContains(t, s.Synchronize(), "panicked")
	require.NoError(t, s.Synchronize(), "errors are reported once")
	closeClean(t, a)
}

func testReadWaitsForWriter(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s1, _ := a.NewStream()
	s2, _ := a.NewStream()
	const n = 64 << 10
	b := alloc(t, a, n, s1)
	require.NoError(t, s1.Memset(b, 0, n, 0x11))
	require.NoError(t, s1.Synchronize())
	readWaitsForMemset(t, a, s1, s2, b, 0x22, nil)
	require.NoError(t, b.Free())
	closeClean(t, a)
}

// readWaitsForMemset holds writer back, sets b to val there, copies b on
// reader into pinned memory, and requires that the copy waits for the
// memset and then sees val. afterCopy, when not nil, runs once the copy is
// enqueued.
func readWaitsForMemset(t *testing.T, a *devalloc.Allocator, writer, reader *devalloc.Stream, b *devalloc.Buffer, val byte, afterCopy func()) {
	t.Helper()
	n := b.Size()
	p := allocPinned(t, a, n, reader)
	open := gate(t, writer)
	require.NoError(t, writer.Memset(b, 0, n, val)) // the writer, held back
	require.NoError(t, reader.Copy(p, 0, b, 0, n))  // the reader must wait for it
	if afterCopy != nil {
		afterCopy()
	}
	ev := stillPending(t, reader, "the reader ran before the writer it must follow")
	open()
	require.NoError(t, ev.Wait())
	mem, _ := p.Bytes()
	require.Equal(t, fill(int(n), val), mem)
	require.NoError(t, ev.Release())
	require.NoError(t, p.Free())
}

func testWriteWaitsForReaders(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s1, _ := a.NewStream()
	s2, _ := a.NewStream()
	s3, _ := a.NewStream()
	const n = 64 << 10
	b := alloc(t, a, n, s1)
	require.NoError(t, s1.Memset(b, 0, n, 0x33))
	p1 := allocPinned(t, a, n, s1)
	p2 := allocPinned(t, a, n, s2)
	require.NoError(t, a.Sync())

	open1 := gate(t, s1)
	open2 := gate(t, s2)
	require.NoError(t, s1.Copy(p1, 0, b, 0, n)) // two readers, both held back
	require.NoError(t, s2.Copy(p2, 0, b, 0, n))
	require.NoError(t, s3.Memset(b, 0, n, 0x44)) // the writer must wait for both
	require.NoError(t, s3.Copy(p1, 0, p1, 0, 0))
	time.Sleep(10 * time.Millisecond)
	open2()
	require.NoError(t, s2.Synchronize())
	open1()
	require.NoError(t, a.Sync())
	m1, _ := p1.Bytes()
	m2, _ := p2.Bytes()
	require.Equal(t, fill(n, 0x33), m1, "reader 1 saw the later write")
	require.Equal(t, fill(n, 0x33), m2, "reader 2 saw the later write")
	require.Equal(t, fill(n, 0x44), readBack(t, a, s3, b))
	require.NoError(t, p1.Free())
	require.NoError(t, p2.Free())
	require.NoError(t, b.Free())
	closeClean(t, a)
}

// testFreeAfterCompletions: a freed buffer's memory is not reused before
// its pending reader has run, whether the reader is on the stream that
// allocated it (stream order covers it) or on another (the free must wait
// for the reader's completion).
func testFreeAfterCompletions(t *testing.T, h Harness) {
	for _, other := range []bool{false, true} {
		t.Run(map[bool]string{false: "reader-on-alloc-stream", true: "reader-on-other-stream"}[other], func(t *testing.T) {
			a := h.open(t, devalloc.Config{})
			s1, _ := a.NewStream()
			s2, _ := a.NewStream()
			churnS, _ := a.NewStream()
			const n = 1 << 20
			b := alloc(t, a, n, s1)
			require.NoError(t, s1.Memset(b, 0, n, 0x77))
			require.NoError(t, s1.Synchronize())
			reader := s1
			if other {
				reader = s2
			}
			p := allocPinned(t, a, n, reader)

			open := gate(t, reader)
			require.NoError(t, reader.Copy(p, 0, b, 0, n)) // a pending reader
			require.NoError(t, b.Free())                   // must not release b before the copy
			time.Sleep(10 * time.Millisecond)              // time for an early release to happen
			// Churn allocations of the same size on a third stream and
			// overwrite them: if b's memory came back early, the pending
			// copy would read 0xee.
			var churn []*devalloc.Buffer
			for range 8 {
				c := alloc(t, a, n, churnS)
				require.NoError(t, churnS.Memset(c, 0, n, 0xee))
				churn = append(churn, c)
			}
			// The churn never waits for b's reader, so it can all land before the gate opens.
			require.NoError(t, churnS.Synchronize())
			open()
			require.NoError(t, a.Sync())
			mem, _ := p.Bytes()
			require.Equal(t, fill(n, 0x77), mem)
			for _, c := range churn {
				require.NoError(t, c.Free())
			}
			require.NoError(t, p.Free())
			closeClean(t, a)
		})
	}
}

func testAllocStreamOrder(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s1, _ := a.NewStream()
	s2, _ := a.NewStream()
	const n = 256 << 10
	open := gate(t, s1)
	b := alloc(t, a, n, s1)
	// Undeclared work on the allocating stream: Free must still follow it.
	require.NoError(t, s1.Memset(b, 0, n, 0x99))
	require.NoError(t, s2.Memset(b, 0, n, 0x12)) // declared: waits for s1's writer
	ev := stillPending(t, s2, "a write on another stream ran before the allocating stream's work")
	open()
	require.NoError(t, ev.Wait())
	require.Equal(t, fill(n, 0x12), readBack(t, a, s2, b))
	require.NoError(t, ev.Release())
	require.NoError(t, b.Free())
	closeClean(t, a)
}

func testConflicts(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s1, _ := a.NewStream()
	s2, _ := a.NewStream()
	b := alloc(t, a, 256, s1)
	w, err := b.Write(s1)
	require.NoError(t, err)
	_, err = b.Read(s2)
	require.ErrorIs(t, err, distbuf.ErrConflict)
	_, err = b.Hold(devalloc.Read)
	require.ErrorIs(t, err, distbuf.ErrConflict)
	r, err := b.Read(s1) // same stream: in order, no conflict
	require.NoError(t, err)
	require.NoError(t, r.Done())
	require.NoError(t, w.Done())
	r1, err := b.Read(s1)
	require.NoError(t, err)
	r2, err := b.Read(s2) // concurrent readers are fine
	require.NoError(t, err)
	_, err = b.Write(s2)
	require.ErrorIs(t, err, distbuf.ErrConflict)
	require.NoError(t, r1.Done())
	require.NoError(t, r2.Done())

	h1, err := b.Hold(devalloc.Read)
	require.NoError(t, err)
	h2, err := b.Hold(devalloc.Read)
	require.NoError(t, err)
	_, err = b.Hold(devalloc.Write)
	require.ErrorIs(t, err, distbuf.ErrConflict)
	require.NoError(t, h1.Release())
	require.NoError(t, h2.Release())
	hw, err := b.Hold(devalloc.Write)
	require.NoError(t, err)
	_, err = b.Write(s1)
	require.ErrorIs(t, err, distbuf.ErrConflict)
	require.NoError(t, hw.Release())
	require.NoError(t, b.Free())
	closeClean(t, a)
}

func testHoldRead(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	const n = 64 << 10
	// A pinned buffer stands for a send buffer: Go can look at its memory.
	p := allocPinned(t, a, n, s)
	require.NoError(t, s.Memset(p, 0, n, 0x5e))
	hd, err := p.Hold(devalloc.Read) // the "send" starts
	require.NoError(t, err)
	require.NoError(t, hd.Wait()) // the memset is complete
	view, err := p.Bytes()
	require.NoError(t, err)
	require.Equal(t, fill(n, 0x5e), view)
	addr, _, _, _ := p.Region()

	require.NoError(t, p.Free()) // freed while the send is in flight
	require.EqualValues(t, 1, a.Stats().PendingFrees)
	q := allocPinned(t, a, n, s)
	qaddr, _, _, _ := q.Region()
	require.NotEqual(t, addr, qaddr, "memory held by a send was handed out again")
	require.NoError(t, s.Memset(q, 0, n, 0xff))
	require.NoError(t, s.Synchronize())
	require.Equal(t, fill(n, 0x5e), view, "held memory was overwritten")

	require.NoError(t, hd.Release()) // the send completes
	require.EqualValues(t, 0, a.Stats().PendingFrees)
	require.NoError(t, a.Sync())
	require.NoError(t, q.Free())
	closeClean(t, a)
}

func testHoldWrite(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s1, _ := a.NewStream()
	s2, _ := a.NewStream()
	const n = 4096
	p := allocPinned(t, a, n, s1)
	out := allocPinned(t, a, n, s2)
	open := gate(t, s1)
	require.NoError(t, s1.Memset(p, 0, n, 0x01)) // pending stream work
	hw, err := p.Hold(devalloc.Write)            // the "receive" must follow it
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() { waited <- hw.Wait() }()
	select {
	case <-waited:
		t.Fatal("hold Wait returned before the stream write it follows")
	case <-time.After(20 * time.Millisecond):
	}
	open()
	require.NoError(t, <-waited)
	// A stream read declared now must wait until the receive is released.
	require.NoError(t, s2.Copy(out, 0, p, 0, n))
	ev := stillPending(t, s2, "a reader ran while an outside writer held the buffer")
	view, _ := p.Bytes()
	copy(view, fill(n, 0x7c)) // the receive lands
	require.NoError(t, hw.Release())
	require.NoError(t, ev.Wait())
	got, _ := out.Bytes()
	require.Equal(t, fill(n, 0x7c), got)
	require.NoError(t, ev.Release())
	require.NoError(t, p.Free())
	require.NoError(t, out.Free())
	closeClean(t, a)
}

// testMarksOneStream: allocating, filling, copying and freeing on one
// stream records no event; a declared access records one; a reader on
// another stream records the mark it must wait for, and sees the data.
func testMarksOneStream(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	const n = 64 << 10
	before := a.Stats().LedgerEvents
	for range 3 {
		x := alloc(t, a, n, s)
		y := alloc(t, a, n, s)
		require.NoError(t, s.Memset(x, 0, n, 0x5a))
		require.NoError(t, s.Copy(y, 0, x, 0, n))
		require.NoError(t, x.Free())
		require.NoError(t, y.Free())
	}
	require.NoError(t, s.Synchronize())
	require.Equal(t, before, a.Stats().LedgerEvents, "one stream's own work recorded events")

	x := alloc(t, a, n, s)
	w, err := x.Write(s)
	require.NoError(t, err)
	require.NoError(t, w.Done())
	// What the caller enqueues may wait for an outside agent, so the
	// alloc's mark is recorded before it, and its completion after.
	require.Equal(t, before+2, a.Stats().LedgerEvents, "a declared access")

	s2 := newStream(t, a)
	// The memset ends in s's mark; the copy on s2 must wait for it.
	readWaitsForMemset(t, a, s, s2, x, 0x6b, func() {
		require.Equal(t, before+3, a.Stats().LedgerEvents, "the reader elsewhere records the mark once")
	})
	require.NoError(t, x.Free())
	closeClean(t, a)
}

// waitsNotFor requires that s drains without the host agent that another
// stream is left waiting for.
func waitsNotFor(t *testing.T, s *devalloc.Stream, what string) {
	t.Helper()
	synced := make(chan error, 1)
	go func() { synced <- s.Synchronize() }()
	select {
	case err := <-synced:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatalf("a reader on another stream waits for %s: a mark recorded after it covers it", what)
	}
}

// testMarkSealedBeforeHostWait: devalloc's own work on a stream, then a wait
// on that stream for an outside agent's hold. A reader on another stream of
// the first work's buffer must not wait for the agent.
func testMarkSealedBeforeHostWait(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	s2 := newStream(t, a)
	const n = 4096
	held := alloc(t, a, n, s)
	hr, err := held.Hold(devalloc.Read) // an outside send from held
	require.NoError(t, err)
	require.NoError(t, hr.Wait())
	x := alloc(t, a, n, s)
	require.NoError(t, s.Memset(x, 0, n, 0x3c))    // x's writer: s's mark
	require.NoError(t, s.Memset(held, 0, n, 0x00)) // s now waits for the send
	p := allocPinned(t, a, n, s2)
	require.NoError(t, s2.Copy(p, 0, x, 0, n))
	waitsNotFor(t, s2, "an unreleased hold")
	mem, _ := p.Bytes()
	require.Equal(t, fill(n, 0x3c), mem)
	require.NoError(t, hr.Release())
	require.NoError(t, s.Synchronize())
	for _, b := range []*devalloc.Buffer{p, x, held} {
		require.NoError(t, b.Free())
	}
	closeClean(t, a)
}

// testMarkSealedBeforeEnqueue is testMarkSealedBeforeHostWait with a host
// function that blocks on the host in place of the hold.
func testMarkSealedBeforeEnqueue(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	s2 := newStream(t, a)
	const n = 4096
	x := alloc(t, a, n, s)
	require.NoError(t, s.Memset(x, 0, n, 0x4d))
	open := gate(t, s)
	p := allocPinned(t, a, n, s2)
	require.NoError(t, s2.Copy(p, 0, x, 0, n))
	waitsNotFor(t, s2, "a host function behind it")
	mem, _ := p.Bytes()
	require.Equal(t, fill(n, 0x4d), mem)
	open()
	require.NoError(t, s.Synchronize())
	require.NoError(t, p.Free())
	require.NoError(t, x.Free())
	closeClean(t, a)
}

func testPolicy(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	const n = 32 << 20
	cycle := func() {
		b := alloc(t, a, n, s)
		require.NoError(t, s.Memset(b, 0, n, 1))
		require.NoError(t, b.Free())
		require.NoError(t, a.Sync())
		require.NoError(t, a.EndPhase())
	}
	cycle()
	require.GreaterOrEqual(t, a.Stats().ReservedCurrent, int64(n), "retain keeps freed memory")

	require.NoError(t, a.SetPolicy(devalloc.AggressiveFree))
	require.Equal(t, devalloc.AggressiveFree, a.Info().Config.Policy)
	require.Zero(t, a.Stats().ReservedCurrent, "switching to free releases unused memory")
	cycle()
	require.Zero(t, a.Stats().ReservedCurrent, "aggressive-free returns memory at the phase boundary")

	require.NoError(t, a.SetPolicy(devalloc.Retain))
	cycle()
	require.GreaterOrEqual(t, a.Stats().ReservedCurrent, int64(n), "switching back retains again")
	closeClean(t, a)
}

func testPrimeTrim(t *testing.T, h Harness) {
	const prime = 64 << 20
	a := h.open(t, devalloc.Config{Prime: prime})
	s := a.DefaultStream()
	st := a.Stats()
	require.GreaterOrEqual(t, st.ReservedCurrent, int64(prime))
	b := alloc(t, a, prime/2, s)
	require.Equal(t, st.ReservedCurrent, a.Stats().ReservedCurrent, "allocation inside the primed pool reserves nothing new")
	require.NoError(t, a.Trim(0))
	require.GreaterOrEqual(t, a.Stats().ReservedCurrent, int64(prime/2), "trim never releases memory in use")
	require.NoError(t, b.Free())
	require.NoError(t, a.Trim(0))
	st = a.Stats()
	require.Zero(t, st.ReservedCurrent)
	require.GreaterOrEqual(t, st.Trims, int64(2))
	closeClean(t, a)
}

func testBudget(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{Limit: 1 << 20})
	require.EqualValues(t, 1<<20, a.Info().Limit)
	s := a.DefaultStream()
	b1 := alloc(t, a, 512<<10, s)
	_, err := a.Alloc(768<<10, s)
	require.ErrorIs(t, err, distbuf.ErrOutOfMemory)
	var oom *devalloc.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.EqualValues(t, 768<<10, oom.Requested)
	require.EqualValues(t, 1<<20, oom.Limit)
	require.EqualValues(t, 512<<10, oom.Used)
	require.Equal(t, 2, oom.Retries, "sync and trim were each retried once")
	require.ErrorContains(t, err, "budget")
	b2, err := a.Alloc(512<<10, s) // exactly up to the budget is fine
	require.NoError(t, err)
	require.NoError(t, b1.Free())
	b3 := alloc(t, a, 256<<10, s)
	require.NoError(t, b2.Free())
	require.NoError(t, b3.Free())

	// A percentage resolves against the memory the backend reports.
	c := h.open(t, devalloc.Config{LimitFraction: 0.5})
	total := c.Info().TotalMemory
	require.InDelta(t, float64(total)/2, float64(c.Info().Limit), float64(total)/1000)
	closeClean(t, c)
	closeClean(t, a)
}

func testOOMLadder(t *testing.T, h Harness) {
	var a *devalloc.Allocator
	var victim *devalloc.Buffer
	var events []*devalloc.OutOfMemoryError
	var trimsAtCallback []int64
	a = h.open(t, devalloc.Config{Limit: 1 << 20}, func(o *devalloc.Options) {
		o.OnOutOfMemory = func(report *devalloc.OutOfMemoryError) bool {
			events = append(events, report)
			trimsAtCallback = append(trimsAtCallback, a.Stats().Trims)
			if victim != nil {
				require.NoError(t, victim.Free())
				victim = nil
			}
			return true
		}
	})
	s := a.DefaultStream()
	var err error
	victim, err = a.Alloc(768<<10, s)
	require.NoError(t, err)
	b, err := a.Alloc(512<<10, s) // over budget: the callback frees victim
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.EqualValues(t, 512<<10, events[0].Requested)
	require.Equal(t, 2, events[0].Retries, "the sync and trim retries came first")
	require.EqualValues(t, 768<<10, events[0].Used)
	require.EqualValues(t, 1<<20, events[0].Limit)
	require.ErrorIs(t, events[0], distbuf.ErrOutOfMemory)
	require.EqualValues(t, 1, trimsAtCallback[0], "trim runs before the callback")
	require.EqualValues(t, 3, a.Stats().OOMRetries)

	// A callback that always asks again without freeing is bounded.
	events = nil
	_, err = a.Alloc(768<<10, s)
	var oom *devalloc.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Len(t, events, 8)
	require.Equal(t, 2+8, oom.Retries)
	require.NoError(t, b.Free())
	closeClean(t, a)
}

func testBackendOOM(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	_, err := a.Alloc(1<<49, a.DefaultStream()) // 512 TiB: more than any machine has
	require.ErrorIs(t, err, distbuf.ErrOutOfMemory)
	var oom *devalloc.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.EqualValues(t, 1<<49, oom.Requested)
	require.Zero(t, oom.Limit)
	require.GreaterOrEqual(t, oom.Retries, 2)
	require.Positive(t, oom.Total)
	require.NotContains(t, err.Error(), "budget")
	closeClean(t, a)
}

func testStats(t *testing.T, h Harness) {
	// No prime: every backend call counted below is an allocation's.
	a := h.open(t, devalloc.Config{Prime: -1})
	s := a.DefaultStream()
	st := a.Stats()
	require.Zero(t, st.RequestedCurrent)
	sizes := []int64{100, 4096, 1 << 20, 3}
	var bufs []*devalloc.Buffer
	var total int64
	for _, n := range sizes {
		b := alloc(t, a, n, s)
		bufs = append(bufs, b)
		total += n
	}
	st = a.Stats()
	require.Equal(t, total, st.RequestedCurrent)
	require.Equal(t, total, st.RequestedPeak)
	require.Equal(t, total, st.RequestedTotal)
	require.EqualValues(t, len(sizes), st.AllocCalls)
	require.EqualValues(t, len(sizes), st.BackendCalls)
	require.EqualValues(t, len(sizes), st.LiveBuffers)
	require.GreaterOrEqual(t, st.PoolUsedCurrent, total)
	require.GreaterOrEqual(t, st.ReservedCurrent, st.PoolUsedCurrent)
	require.GreaterOrEqual(t, st.ReservedPeak, st.ReservedCurrent)
	require.GreaterOrEqual(t, st.ReservedTotal, st.ReservedCurrent)

	require.NoError(t, bufs[2].Free())
	require.NoError(t, a.Sync())
	st = a.Stats()
	require.Equal(t, total-(1<<20), st.RequestedCurrent)
	require.Equal(t, total, st.RequestedPeak)
	require.EqualValues(t, 1, st.Frees)
	require.EqualValues(t, len(sizes)-1, st.LiveBuffers)
	a.ResetPeak()
	st = a.Stats()
	require.Equal(t, st.RequestedCurrent, st.RequestedPeak)
	require.LessOrEqual(t, st.ReservedPeak, st.ReservedCurrent+0)
	b := alloc(t, a, 10, s)
	st = a.Stats()
	require.Equal(t, total-(1<<20)+10, st.RequestedPeak)
	require.Equal(t, total+10, st.RequestedTotal)
	require.NoError(t, b.Free())
	for i, b := range bufs {
		if i != 2 {
			require.NoError(t, b.Free())
		}
	}
	st = a.Stats()
	require.Zero(t, st.RequestedCurrent)
	require.Zero(t, st.LiveBuffers)
	require.EqualValues(t, len(sizes)+1, st.Frees)
	closeClean(t, a)
}

func testLeaks(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	b1, _ := a.Alloc(1000, s)
	_, _ = a.Alloc(24, s)
	b3, _ := a.Alloc(500, s)
	require.NoError(t, b3.Free())
	held, _ := a.Alloc(64, s)
	hd, err := held.Hold(devalloc.Read)
	require.NoError(t, err)
	require.NoError(t, held.Free()) // freed, but the hold is never released
	err = a.Close()
	require.ErrorIs(t, err, distbuf.ErrLeak)
	var leak *devalloc.LeakError
	require.ErrorAs(t, err, &leak)
	require.Equal(t, 3, leak.Count)
	require.EqualValues(t, 1000+24+64, leak.Bytes)
	require.Len(t, leak.Buffers, 3)
	require.Equal(t, b1.ID(), leak.Buffers[0].ID)
	require.EqualValues(t, 1000, leak.Buffers[0].Bytes)
	require.True(t, leak.Buffers[2].Held)
	require.ErrorContains(t, err, "3 leaked buffer(s)")
	require.ErrorContains(t, err, fmt.Sprintf("#%d ", b1.ID()))
	require.ErrorIs(t, hd.Release(), distbuf.ErrClosed)
}

// within waits for ch to deliver, failing the test after a few seconds.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
	}
	panic("unreachable")
}

// testCloseAbandonsHoldWaits: a stream waits for an outside hold that is
// never released, and a goroutine waits for that stream. Close must still
// finish, reporting the leak, and the waiting goroutine gets ErrClosed.
func testCloseAbandonsHoldWaits(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	const n = 4096
	b := alloc(t, a, n, s)
	hr, err := b.Hold(devalloc.Read) // an MPI send that never completes
	require.NoError(t, err)
	require.NoError(t, s.Memset(b, 0, n, 1)) // a write: the stream waits for the send
	synced := make(chan error, 1)
	go func() { synced <- s.Synchronize() }()
	time.Sleep(20 * time.Millisecond) // let the synchronisation block
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	err = within(t, closed, "Close, with a stream waiting for a hold never released,")
	require.ErrorIs(t, err, distbuf.ErrLeak)
	require.ErrorIs(t, within(t, synced, "Synchronize"), distbuf.ErrClosed)
	require.ErrorIs(t, hr.Release(), distbuf.ErrClosed)
}

// testOOMCallbackDuringClose: the out-of-memory callback frees a buffer
// (which the docs allow) while Close runs on another goroutine. Neither
// may wait for the other for ever.
func testOOMCallbackDuringClose(t *testing.T, h Harness) {
	var victim *devalloc.Buffer
	inCallback, proceed := make(chan struct{}), make(chan struct{})
	freed := make(chan error, 1)
	var once sync.Once
	a := h.open(t, devalloc.Config{Limit: 1 << 20}, func(o *devalloc.Options) {
		o.OnOutOfMemory = func(*devalloc.OutOfMemoryError) bool {
			once.Do(func() {
				close(inCallback)
				<-proceed
				freed <- victim.Free()
			})
			return true
		}
	})
	s := a.DefaultStream()
	var err error
	victim, err = a.Alloc(768<<10, s)
	require.NoError(t, err)
	allocated := make(chan error, 1)
	go func() {
		b, err := a.Alloc(512<<10, s)
		if err == nil {
			err = b.Free()
		}
		allocated <- err
	}()
	within(t, inCallback, "the out-of-memory callback")
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	time.Sleep(20 * time.Millisecond) // let Close begin
	close(proceed)
	if err := within(t, freed, "Free inside the callback"); err != nil {
		require.ErrorIs(t, err, distbuf.ErrClosed)
	}
	if err := within(t, allocated, "Alloc"); err != nil {
		require.ErrorIs(t, err, distbuf.ErrClosed)
	}
	if err := within(t, closed, "Close"); err != nil {
		require.ErrorIs(t, err, distbuf.ErrLeak)
	}
}

func testPinned(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	s := a.DefaultStream()
	p := allocPinned(t, a, 10000, s)
	require.Equal(t, devalloc.Pinned, p.Location())
	mem, err := p.Bytes()
	require.NoError(t, err)
	require.Len(t, mem, 10000)
	for i := range mem {
		mem[i] = byte(i)
	}
	addr, _, device, err := p.Region()
	require.NoError(t, err)
	require.False(t, device)
	require.NotZero(t, addr)
	// Round trip through device (or host-backend) memory.
	d := alloc(t, a, 10000, s)
	require.NoError(t, s.Copy(d, 0, p, 0, 10000))
	got := readBack(t, a, s, d)
	require.Equal(t, mem, got)
	require.NoError(t, d.Free())
	require.NoError(t, p.Free())
	calls := a.Stats().PinnedAllocCalls
	require.NoError(t, a.Sync())
	for range 5 { // once its guard has passed, the block is reused
		q := allocPinned(t, a, 9000, s)
		require.NoError(t, q.Free())
		require.NoError(t, a.Sync())
	}
	st := a.Stats()
	require.Equal(t, calls, st.PinnedAllocCalls, "pinned memory was allocated again instead of reused")
	require.Zero(t, st.PinnedUsed)
	require.Positive(t, st.PinnedReserved)
	closeClean(t, a)
}

func testConcurrent(t *testing.T, h Harness) {
	a := h.open(t, devalloc.Config{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := a.NewStream()
			if err != nil {
				errs <- err
				return
			}
			for i := range 200 {
				n := int64(64 << (i % 12))
				b, err := a.Alloc(n, s)
				if err != nil {
					errs <- err
					return
				}
				if err := s.Memset(b, 0, n, byte(g)); err != nil {
					errs <- err
					return
				}
				if err := b.Free(); err != nil {
					errs <- err
					return
				}
				_ = a.Stats()
			}
			errs <- s.Synchronize()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := a.Stats()
	require.EqualValues(t, 800, st.AllocCalls)
	require.EqualValues(t, 800, st.Frees)
	require.Zero(t, st.LiveBuffers)
	closeClean(t, a)
}

func testConfig(t *testing.T, h Harness) {
	t.Setenv("DISTBUF_ALLOC_CONF", "policy:free,limit:2MiB")
	a, err := devalloc.Open(devalloc.Options{Backend: h.Backend, Device: h.Device})
	require.NoError(t, err)
	require.Equal(t, devalloc.AggressiveFree, a.Info().Config.Policy)
	require.EqualValues(t, 2<<20, a.Info().Limit)
	closeClean(t, a)

	t.Setenv("DISTBUF_ALLOC_CONF", "policy:retain,prime:lots")
	_, err = devalloc.Open(devalloc.Options{Backend: h.Backend, Device: h.Device})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, `DISTBUF_ALLOC_CONF: key "prime"`)

	t.Setenv("DISTBUF_BACKEND", "quantum")
	_, err = devalloc.Open(devalloc.Options{Device: h.Device, Config: &devalloc.Config{}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "quantum")

	_, err = devalloc.Open(devalloc.Options{Backend: h.Backend, Config: &devalloc.Config{LimitFraction: 2}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	_, err = devalloc.Open(devalloc.Options{Backend: h.Backend, Device: -1, Config: &devalloc.Config{}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
}
