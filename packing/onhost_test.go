package packing

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/stretchr/testify/require"
)

// onHostDescs has every dtype in several shapes; dest, when not nil, gives
// each block's destination.
func onHostDescs(n int, dest func(i int) int) []Desc {
	dts := []DType{Float32, Float64, Complex64, Complex128}
	out := make([]Desc, n)
	for i := range out {
		out[i] = Desc{ID: uint64(1000 - 7*i), DType: dts[i%len(dts)], Rows: 1 + i%5, Cols: 1 + (3*i)%7}
		if dest != nil {
			out[i].Dest = dest(i)
		}
	}
	return out
}

// pattern is what the tests write into block d: distinct for every block,
// element and salt.
func pattern(d Desc, salt int) any {
	n := d.Rows * d.Cols
	base := float64(d.ID)*1000 + float64(salt)*1e6
	switch d.DType {
	case Float32:
		s := make([]float32, n)
		for j := range s {
			s[j] = float32(base + float64(j))
		}
		return s
	case Float64:
		s := make([]float64, n)
		for j := range s {
			s[j] = base + float64(j) + 0.5
		}
		return s
	case Complex64:
		s := make([]complex64, n)
		for j := range s {
			s[j] = complex(float32(base), float32(-j))
		}
		return s
	case Complex128:
		s := make([]complex128, n)
		for j := range s {
			s[j] = complex(base+0.25, float64(j))
		}
		return s
	}
	panic(fmt.Sprintf("dtype %v", d.DType))
}

// rawBytes is the memory of a typed slice, as it lies in a block.
func rawBytes(v any) []byte {
	switch s := v.(type) {
	case []float32:
		return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)))
	case []float64:
		return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s)))
	case []complex64:
		return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s)))
	case []complex128:
		return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 16*len(s)))
	}
	panic(fmt.Sprintf("%T", v))
}

// fillBlock writes pattern(d, salt) into block k through the typed method
// of its dtype.
func fillBlock(h *HostBlocks, k, salt int) error {
	d, err := h.Desc(k)
	if err != nil {
		return err
	}
	switch want := pattern(d, salt).(type) {
	case []float32:
		return fillAs(h.Float32s, k, want)
	case []float64:
		return fillAs(h.Float64s, k, want)
	case []complex64:
		return fillAs(h.Complex64s, k, want)
	case []complex128:
		return fillAs(h.Complex128s, k, want)
	}
	return nil
}

// fillAs copies want into block k as the typed method elems gives it.
func fillAs[T any](elems func(int) ([]T, error), k int, want []T) error {
	s, err := elems(k)
	copy(s, want)
	return err
}

// checkBlock compares block k, read through its typed method, with
// pattern(d, salt).
func checkBlock(h *HostBlocks, k, salt int) error {
	d, err := h.Desc(k)
	if err != nil {
		return err
	}
	var got any
	switch d.DType {
	case Float32:
		got, err = h.Float32s(k)
	case Float64:
		got, err = h.Float64s(k)
	case Complex64:
		got, err = h.Complex64s(k)
	case Complex128:
		got, err = h.Complex128s(k)
	}
	if err != nil {
		return err
	}
	if want := pattern(d, salt); !bytes.Equal(rawBytes(want), rawBytes(got)) {
		return fmt.Errorf("block %d (id %d): got %v, want %v", k, d.ID, got, want)
	}
	return nil
}

// checkAll checks every block of c through OnHost: salt def unless salts
// says otherwise for a position.
func checkAll(t *testing.T, s *devalloc.Stream, c *Coalesced, def int, salts map[int]int) {
	t.Helper()
	require.NoError(t, c.OnHost(s, devalloc.Read, func(h *HostBlocks) error {
		var errs []error
		for k := range h.Len() {
			salt, ok := salts[k]
			if !ok {
				salt = def
			}
			errs = append(errs, checkBlock(h, k, salt))
		}
		return errors.Join(errs...)
	}))
}

func fillAll(h *HostBlocks, salt int) error {
	var errs []error
	for k := range h.Len() {
		errs = append(errs, fillBlock(h, k, salt))
	}
	return errors.Join(errs...)
}

// gateStream holds s back until open is called; defer open, so that a
// failed test does not leave the stream (and the allocator's Close) waiting.
func gateStream(t *testing.T, s *devalloc.Stream) (open func()) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(ch) }) }
	require.NoError(t, s.Enqueue(func() error { <-ch; return nil }))
	return open
}

// within runs f and fails the test if it has not returned within d: a hold
// or access that OnHost left open makes later work wait for ever.
func within(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(d):
		t.Fatalf("%s did not finish within %v", what, d)
	}
}

// onHostAlloc makes the Coalesced of a test: "pinned" in pinned memory,
// anything else with Alloc (device memory on the CUDA backend).
func onHostAlloc(t *testing.T, kind string, a *devalloc.Allocator, p *Plan, s *devalloc.Stream) *Coalesced {
	t.Helper()
	var c *Coalesced
	var err error
	if kind == "pinned" {
		c, err = Alloc(a, p, s, AllocOptions{Group: 0, Pinned: true})
	} else {
		c, err = Alloc(a, p, s)
	}
	require.NoError(t, err)
	return c
}

// testOnHost runs the OnHost tests that hold on every backend and kind of
// memory. On device memory they go through the staging path.
func testOnHost(t *testing.T, a *devalloc.Allocator, kind string) {
	s := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	descs := onHostDescs(40, nil)
	p, err := NewPlan(descs, Options{})
	require.NoError(t, err)

	t.Run("RoundTrip", func(t *testing.T) {
		c := onHostAlloc(t, kind, a, p, s)
		defer func() { require.NoError(t, c.Free()) }()
		if kind == "device" {
			require.Equal(t, devalloc.OnDevice, c.Buffer().Location())
			v, err := c.View(0)
			require.NoError(t, err)
			_, err = viewSlice[byte](v, 0)
			require.ErrorIs(t, err, distbuf.ErrNotHostAccessible, "device memory, so OnHost stages")
		}
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error {
			require.Equal(t, len(descs), h.Len())
			for k, d := range descs {
				got, err := h.Desc(k)
				require.NoError(t, err)
				require.Equal(t, d, got)
				at, err := c.Position(d.ID)
				require.NoError(t, err)
				require.Equal(t, k, at)
				raw, err := h.Bytes(k)
				require.NoError(t, err)
				require.Len(t, raw, int(d.Bytes()))
			}
			return fillAll(h, 0)
		}))
		checkAll(t, s, c, 0, nil)
		// The same bytes reach Go slices by UnpackHost, on another stream:
		// the ledger orders it after the write.
		out := unpacked(t, s2, c)
		for k, d := range descs {
			require.Equal(t, rawBytes(pattern(d, 0)), out[k], "block %d", k)
		}
		// A write of one block leaves the others as they were: on device
		// memory the staging copy is filled from c before fn runs.
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error { return fillBlock(h, 3, 1) }))
		checkAll(t, s2, c, 0, map[int]int{3: 1})
		// PackHost on s, OnHost on s2 after it.
		for k, d := range descs {
			out[k] = rawBytes(pattern(d, 2))
		}
		require.NoError(t, PackHost(s, c, out))
		checkAll(t, s2, c, 2, nil)
	})

	t.Run("SeesEarlierWork", func(t *testing.T) {
		c := onHostAlloc(t, kind, a, p, s)
		defer func() { require.NoError(t, c.Free()) }()
		// Work on OnHost's stream, and work on another stream that the
		// ledger orders before it, both held back: fn must not run before
		// they have.
		for i, on := range []*devalloc.Stream{s, s2} {
			val := byte(0x3C + i)
			open := gateStream(t, on)
			defer open()
			require.NoError(t, on.Memset(c.Buffer(), c.Start(), c.Size(), val))
			var ran atomic.Bool
			res := make(chan error, 1)
			go func() {
				res <- c.OnHost(s, devalloc.Read, func(h *HostBlocks) error {
					ran.Store(true)
					for k := range h.Len() {
						raw, err := h.Bytes(k)
						if err != nil {
							return err
						}
						if !bytes.Equal(raw, bytes.Repeat([]byte{val}, len(raw))) {
							return fmt.Errorf("block %d: fn does not see the memset of stream %d", k, i)
						}
					}
					return nil
				})
			}()
			time.Sleep(50 * time.Millisecond)
			require.False(t, ran.Load(), "fn ran before the memset on stream %d", i)
			open()
			select {
			case err := <-res:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("OnHost did not return")
			}
			require.True(t, ran.Load())
		}
	})

	t.Run("WritesSeenByLaterWork", func(t *testing.T) {
		c := onHostAlloc(t, kind, a, p, s)
		defer func() { require.NoError(t, c.Free()) }()
		// fn holds s back, so that on device memory the copy back is still
		// waiting in s when OnHost returns.
		var open func()
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error {
			open = gateStream(t, s)
			return fillAll(h, 4)
		}))
		defer open()
		// The staging memory must not be handed out again before the copy
		// back has read it: scribble on whatever the pinned pool gives now.
		scratch, err := a.AllocPinned(max(c.Size(), 1), s2)
		require.NoError(t, err)
		mem, err := scratch.Bytes()
		require.NoError(t, err)
		for i := range mem {
			mem[i] = 0xEE
		}
		require.NoError(t, scratch.Free())
		// A copy on another stream waits for the copy back.
		dst, err := a.AllocPinned(c.Size(), s2)
		require.NoError(t, err)
		require.NoError(t, s2.Copy(dst, 0, c.Buffer(), c.Start(), c.Size()))
		ev, err := s2.Record()
		require.NoError(t, err)
		time.Sleep(50 * time.Millisecond)
		if c.Buffer().Location() == devalloc.OnDevice {
			done, err := ev.Done()
			require.NoError(t, err)
			require.False(t, done, "a copy on another stream ran before OnHost's copy back")
		}
		open()
		require.NoError(t, ev.Wait())
		require.NoError(t, ev.Release())
		got, err := dst.Bytes()
		require.NoError(t, err)
		for k, d := range descs {
			v, err := c.View(k)
			require.NoError(t, err)
			require.Equal(t, rawBytes(pattern(d, 4)), got[v.Offset():v.Offset()+v.bytes()], "block %d", k)
		}
		require.NoError(t, dst.Free())
	})

	t.Run("WaitsForHolds", func(t *testing.T) {
		c := onHostAlloc(t, kind, a, p, s)
		defer func() { require.NoError(t, c.Free()) }()
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error { return fillAll(h, 0) }))
		// An outside agent in flight (a receive, a send) is waited for where
		// it conflicts, not refused; two readers go together.
		for _, tc := range []struct {
			hold, mode devalloc.Mode
			waits      bool
		}{{devalloc.Write, devalloc.Read, true}, {devalloc.Read, devalloc.Write, true}, {devalloc.Read, devalloc.Read, false}} {
			hd, err := c.Buffer().Hold(tc.hold)
			require.NoError(t, err)
			require.NoError(t, hd.Wait())
			var once sync.Once
			release := func() { once.Do(func() { require.NoError(t, hd.Release()) }) }
			defer release()
			var ran atomic.Bool
			res := make(chan error, 1)
			go func() {
				res <- c.OnHost(s, tc.mode, func(h *HostBlocks) error { ran.Store(true); return nil })
			}()
			if tc.waits {
				time.Sleep(50 * time.Millisecond)
				require.False(t, ran.Load(), "a %v ran during an outside %v hold", tc.mode, tc.hold)
				release()
			}
			select {
			case err := <-res:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatalf("OnHost (%v) did not return with an outside %v hold (released: %v)", tc.mode, tc.hold, tc.waits)
			}
			require.True(t, ran.Load())
			release()
		}
	})

	t.Run("OthersDuringWrite", func(t *testing.T) {
		c := onHostAlloc(t, kind, a, p, s)
		defer func() { require.NoError(t, c.Free()) }()
		// A write declared on another stream while fn writes is refused
		// (on device memory, so that the copy back cannot overwrite it);
		// a read waits for fn in place and is refused on device memory.
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error {
			x, err := c.Buffer().Write(s2)
			if err == nil {
				require.NoError(t, x.Done())
			}
			require.ErrorIs(t, err, distbuf.ErrConflict, "a write on another stream during fn")
			hd, err := c.Buffer().Hold(devalloc.Read)
			if err == nil {
				require.NoError(t, hd.Release())
			}
			require.ErrorIs(t, err, distbuf.ErrConflict, "a hold during fn")
			if c.Buffer().Location() == devalloc.OnDevice {
				x, err := c.Buffer().Read(s2)
				if err == nil {
					require.NoError(t, x.Done())
				}
				require.ErrorIs(t, err, distbuf.ErrConflict, "a read on another stream during a staged fn")
			}
			return fillAll(h, 3)
		}))
		checkAll(t, s2, c, 3, nil)
	})

	t.Run("Prefixed", func(t *testing.T) {
		// The layout after a header: only the layout is read and written.
		const prefix = 512
		c, err := Alloc(a, p, s, AllocOptions{Group: 0, Prefix: prefix})
		require.NoError(t, err)
		defer func() { require.NoError(t, c.Free()) }()
		require.NoError(t, s.Memset(c.Buffer(), 0, prefix, 0xEE))
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error { return fillAll(h, 5) }))
		mem := readAll(t, s2, c.Buffer())
		require.Equal(t, bytes.Repeat([]byte{0xEE}, prefix), mem[:prefix])
		for k, d := range descs {
			v, err := c.View(k)
			require.NoError(t, err)
			at := prefix + v.Offset()
			require.Equal(t, rawBytes(pattern(d, 5)), mem[at:at+v.bytes()], "block %d", k)
		}
	})

	t.Run("Groups", func(t *testing.T) {
		gd := onHostDescs(30, func(i int) int { return i % 3 })
		gp, err := NewPlan(gd, Options{})
		require.NoError(t, err)
		cs, err := allocGroups(a, gp, s)
		require.NoError(t, err)
		defer func() {
			for _, c := range cs {
				require.NoError(t, c.Free())
			}
		}()
		c := cs[1]
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error {
			for i, d := range gd {
				k, err := c.Position(d.ID)
				if d.Dest != 1 {
					require.ErrorIs(t, err, distbuf.ErrInvalid, "block %d of group %d", i, d.Dest)
					continue
				}
				require.NoError(t, err)
				v, err := c.View(k)
				require.NoError(t, err)
				require.Equal(t, d.ID, v.id())
				got, err := h.Desc(k)
				require.NoError(t, err)
				require.Equal(t, d, got)
			}
			return fillAll(h, 6)
		}))
		views, err := views(c)
		require.NoError(t, err)
		out := unpacked(t, s, c)
		for k, v := range views {
			require.Equal(t, rawBytes(pattern(v.Desc(), 6)), out[k], "block %d", k)
		}
	})

	t.Run("Misuse", func(t *testing.T) {
		c := onHostAlloc(t, kind, a, p, s)
		defer func() { require.NoError(t, c.Free()) }()
		accessors := map[DType]func(h *HostBlocks, k int) error{
			Float32:    func(h *HostBlocks, k int) error { _, err := h.Float32s(k); return err },
			Float64:    func(h *HostBlocks, k int) error { _, err := h.Float64s(k); return err },
			Complex64:  func(h *HostBlocks, k int) error { _, err := h.Complex64s(k); return err },
			Complex128: func(h *HostBlocks, k int) error { _, err := h.Complex128s(k); return err },
		}
		var kept *HostBlocks
		require.NoError(t, c.OnHost(s, devalloc.Read, func(h *HostBlocks) error {
			kept = h
			for k, d := range descs[:4] {
				for dt, get := range accessors {
					err := get(h, k)
					if dt == d.DType {
						require.NoError(t, err)
						continue
					}
					require.ErrorIs(t, err, distbuf.ErrInvalid)
					for _, part := range []string{fmt.Sprintf("block %d (id %d)", k, d.ID), d.DType.String(), dt.String()} {
						require.Contains(t, err.Error(), part)
					}
				}
			}
			for _, k := range []int{-1, h.Len()} {
				_, err := h.Bytes(k)
				require.ErrorIs(t, err, distbuf.ErrInvalid)
				_, err = h.Desc(k)
				require.ErrorIs(t, err, distbuf.ErrInvalid)
				require.ErrorIs(t, accessors[Float64](h, k), distbuf.ErrInvalid)
			}
			return nil
		}))
		// The HostBlocks refuses use once fn has returned.
		require.Equal(t, len(descs), kept.Len())
		for k, d := range descs[:4] {
			err := accessors[d.DType](kept, k)
			require.ErrorIs(t, err, distbuf.ErrInvalid)
			require.Contains(t, err.Error(), "after OnHost's function returned")
		}
		_, err := kept.Bytes(0)
		require.ErrorIs(t, err, distbuf.ErrInvalid)
		_, err = kept.Desc(0)
		require.ErrorIs(t, err, distbuf.ErrInvalid)
	})

	t.Run("ErrorAndPanic", func(t *testing.T) {
		c := onHostAlloc(t, kind, a, p, s)
		defer func() { require.NoError(t, c.Free()) }()
		require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error { return fillAll(h, 0) }))
		// Work on c on another stream, then a write of c through OnHost:
		// neither may wait for ever behind a hold or access left open.
		later := func(salt int) func() error {
			return func() error {
				x, err := c.Buffer().Write(s2)
				if err != nil {
					return err
				}
				if err := x.Done(); err != nil {
					return err
				}
				err = c.OnHost(s2, devalloc.Write, func(h *HostBlocks) error { return fillBlock(h, 1, salt) })
				return errors.Join(err, s2.Synchronize())
			}
		}

		boom := errors.New("boom")
		err := c.OnHost(s, devalloc.Write, func(h *HostBlocks) error {
			if err := fillBlock(h, 0, 7); err != nil {
				return err
			}
			return boom
		})
		require.Equal(t, boom, err, "fn's error comes back as is")
		within(t, 10*time.Second, "work after an error in fn", later(8))
		checkAll(t, s, c, 0, map[int]int{0: 7, 1: 8})

		var kept *HostBlocks
		func() {
			defer func() { require.Equal(t, "fn panics", recover()) }()
			_ = c.OnHost(s, devalloc.Write, func(h *HostBlocks) error {
				kept = h
				if err := fillBlock(h, 2, 9); err != nil {
					return err
				}
				panic("fn panics")
			})
			t.Fatal("OnHost returned after a panic in fn")
		}()
		_, err = kept.Bytes(2)
		require.ErrorIs(t, err, distbuf.ErrInvalid, "the blocks end with a panic too")
		within(t, 10*time.Second, "work after a panic in fn", later(10))
		checkAll(t, s, c, 0, map[int]int{0: 7, 1: 10, 2: 9})

		// In Read mode too.
		err = c.OnHost(s, devalloc.Read, func(h *HostBlocks) error { return boom })
		require.Equal(t, boom, err)
		func() {
			defer func() { require.Equal(t, "fn panics", recover()) }()
			_ = c.OnHost(s, devalloc.Read, func(h *HostBlocks) error { panic("fn panics") })
		}()
		within(t, 10*time.Second, "work after a panic in a read", later(11))
	})
}

func TestOnHostHost(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	testOnHost(t, a, "host")
}

// TestOnHostFakeCUDA runs the OnHost tests on the CUDA backend over the
// fake libcudart, whatever the machine: device memory that Go cannot
// address, so the staging path, without a GPU; and pinned memory, which
// OnHost uses in place.
func TestOnHostFakeCUDA(t *testing.T) {
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t))
	a := openCUDA(t)
	defer closeClean(t, a)
	t.Run("device", func(t *testing.T) { testOnHost(t, a, "device") })
	t.Run("pinned", func(t *testing.T) { testOnHost(t, a, "pinned") })
}

// TestOnHostGPU runs the OnHost tests on a real GPU. Without one the
// package's tests use the fake libcudart (TestMain), which
// TestOnHostFakeCUDA already covers, so this one skips there, and fails
// instead under DISTBUF_REQUIRE_GPU=1.
func TestOnHostGPU(t *testing.T) {
	if rt, err := cudart.Load(); err == nil && strings.HasSuffix(rt.Path(), "-fake.so") {
		gputest.Unavailable(t, "a GPU", fmt.Errorf("%w: the CUDA runtime in use is the fake %s", gputest.ErrAbsent, rt.Path()))
	}
	a := openCUDA(t)
	defer closeClean(t, a)
	t.Run("device", func(t *testing.T) { testOnHost(t, a, "device") })
	t.Run("pinned", func(t *testing.T) { testOnHost(t, a, "pinned") })
}

// TestOnHostHoldOrdersOtherStreams: on memory Go addresses, work that
// another stream declares while fn runs waits for fn and sees its writes.
func TestOnHostHoldOrdersOtherStreams(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)
	p, err := NewPlan([]Desc{{ID: 1, DType: Float64, Rows: 2, Cols: 2}}, Options{})
	require.NoError(t, err)
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	v, err := c.View(0)
	require.NoError(t, err)
	var seen float64
	require.NoError(t, c.OnHost(s, devalloc.Write, func(h *HostBlocks) error {
		x, err := c.Buffer().Read(s2)
		require.NoError(t, err)
		require.NoError(t, s2.Enqueue(func() error {
			f, err := viewSlice[float64](v, Float64)
			if err == nil {
				seen = f[0]
			}
			return err
		}))
		require.NoError(t, x.Done())
		time.Sleep(20 * time.Millisecond) // time for the read to run, were it not held back
		f, err := h.Float64s(0)
		require.NoError(t, err)
		f[0] = 42
		return nil
	}))
	require.NoError(t, s2.Synchronize())
	require.Equal(t, 42.0, seen)
	require.NoError(t, c.Free())
}

func TestOnHostBadInput(t *testing.T) {
	a := openHost(t)
	defer closeClean(t, a)
	s := a.DefaultStream()
	p, err := NewPlan([]Desc{{ID: 1, DType: Float64, Rows: 2, Cols: 2}}, Options{})
	require.NoError(t, err)
	c, err := Alloc(a, p, s)
	require.NoError(t, err)
	called := false
	fn := func(*HostBlocks) error { called = true; return nil }
	var none *Coalesced
	require.ErrorIs(t, none.OnHost(s, devalloc.Read, fn), distbuf.ErrInvalid)
	require.ErrorIs(t, c.OnHost(nil, devalloc.Read, fn), distbuf.ErrInvalid)
	require.ErrorIs(t, c.OnHost(s, devalloc.Write, nil), distbuf.ErrInvalid)
	for _, m := range []devalloc.Mode{0, devalloc.Write + 1, -1} {
		err := c.OnHost(s, m, fn)
		require.ErrorIs(t, err, distbuf.ErrInvalid, "mode %v", m)
		require.Contains(t, err.Error(), m.String())
	}
	b := openHost(t)
	err = c.OnHost(b.DefaultStream(), devalloc.Read, fn)
	require.ErrorIs(t, err, distbuf.ErrInvalid, "a stream of another allocator")
	require.Contains(t, err.Error(), "another allocator")
	closeClean(t, b)
	require.NoError(t, c.Free())
	require.ErrorIs(t, c.OnHost(s, devalloc.Read, fn), distbuf.ErrFreed)
	require.ErrorIs(t, c.OnHost(s, devalloc.Write, fn), distbuf.ErrFreed)
	require.False(t, called, "fn ran on bad input")
}
