package devalloc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
)

// ledgerModel drives random reads, writes, holds, frees and devalloc's own
// memsets and copies (which end in stream marks) on several host streams and
// checks, inside the work itself, that every access sees the data the ledger
// promises: a read sees the last write declared before it, and no buffer's
// memory is reused while work on it is pending (reuse would show up as
// another buffer's signature).
type ledgerModel struct {
	t       *testing.T
	a       *Allocator
	streams []*Stream
	bufs    []*modelBuf
	failed  atomic.Pointer[string]
	wg      sync.WaitGroup
	sleepy  bool
}

type modelBuf struct {
	b       *Buffer
	id      uint64
	version uint64
	want    [16]byte // the head every access should see, in ledger order
	holds   []*modelHold
	freed   bool
}

type modelHold struct {
	h     *Hold
	ready chan struct{} // closed once the hold's own work is done
}

func (m *ledgerModel) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	m.failed.CompareAndSwap(nil, &msg)
}

func (m *ledgerModel) nap(r uint8) {
	if m.sleepy && r%8 == 0 {
		time.Sleep(time.Duration(r/4) * time.Microsecond)
	}
}

// stamp is the head a write of buffer id at version leaves.
func stamp(id, version uint64) (h [16]byte) {
	binary.LittleEndian.PutUint64(h[0:], id)
	binary.LittleEndian.PutUint64(h[8:], version)
	return h
}

func (m *ledgerModel) check(mem []byte, id uint64, want [16]byte, what string) {
	if got := [16]byte(mem[:16]); got != want {
		m.fail("%s of buffer %d: saw head %x, want %x", what, id, got, want)
	}
}

func (m *ledgerModel) write(mb *modelBuf, s *Stream, r uint8) {
	x, err := mb.b.Write(s)
	if errors.Is(err, distbuf.ErrConflict) && len(mb.holds) > 0 {
		return // an outside writer holds it: refused by design
	}
	if err != nil {
		m.fail("write: %v", err)
		return
	}
	mb.version++
	mem, _ := mb.b.Bytes()
	id, before, after := mb.id, mb.want, stamp(mb.id, mb.version)
	mb.want = after
	_ = s.Enqueue(func() error {
		m.nap(r)
		m.check(mem, id, before, "write precondition")
		copy(mem, after[:])
		return nil
	})
	if err := x.Done(); err != nil {
		m.fail("write done: %v", err)
	}
}

func (m *ledgerModel) read(mb *modelBuf, s *Stream, r uint8) {
	x, err := mb.b.Read(s)
	if err != nil {
		m.fail("read: %v", err)
		return
	}
	mem, _ := mb.b.Bytes()
	id, want := mb.id, mb.want
	_ = s.Enqueue(func() error {
		m.nap(r)
		m.check(mem, id, want, "read")
		return nil
	})
	if err := x.Done(); err != nil {
		m.fail("read done: %v", err)
	}
}

func (m *ledgerModel) hold(mb *modelBuf, mode Mode, r uint8) {
	h, err := mb.b.Hold(mode)
	if err != nil {
		return // conflicting holds are refused by design
	}
	mem, _ := mb.b.Bytes()
	mh := &modelHold{h: h, ready: make(chan struct{})}
	id, before, after := mb.id, mb.want, mb.want
	if mode == Write {
		mb.version++
		after = stamp(mb.id, mb.version)
		mb.want = after
	}
	mb.holds = append(mb.holds, mh)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(mh.ready)
		if err := h.Wait(); err != nil {
			m.fail("hold wait: %v", err)
			return
		}
		m.nap(r)
		m.check(mem, id, before, "hold "+mode.String())
		if mode == Write {
			copy(mem, after[:])
		}
	}()
}

// releaseHold releases the oldest hold of mb whose own work is done. It
// never blocks: a hold may be waiting, through a stream, for another hold
// the sequence has not released yet, as an MPI request would.
func (m *ledgerModel) releaseHold(mb *modelBuf) bool {
	for i, mh := range mb.holds {
		select {
		case <-mh.ready:
		default:
			continue
		}
		mb.holds = append(mb.holds[:i], mb.holds[i+1:]...)
		if err := mh.h.Release(); err != nil {
			m.fail("release: %v", err)
		}
		return true
	}
	return false
}

// releaseAll releases every hold. Holds only ever wait for holds created
// before them, so releasing whatever is ready always makes progress.
func (m *ledgerModel) releaseAll() {
	deadline := time.Now().Add(20 * time.Second)
	for {
		pending, progressed := false, false
		for _, mb := range m.bufs {
			for len(mb.holds) > 0 {
				pending = true
				if !m.releaseHold(mb) {
					break
				}
				progressed = true
			}
		}
		if !pending {
			return
		}
		if !progressed {
			if time.Now().After(deadline) {
				m.fail("holds never became ready: the ledger deadlocked")
				return
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
}

func (m *ledgerModel) alloc(s *Stream, r uint8) {
	size := int64(16 + int(r)*97)
	b, err := m.a.Alloc(size, s)
	if err != nil {
		m.fail("alloc: %v", err)
		return
	}
	mb := &modelBuf{b: b, id: b.ID(), want: stamp(b.ID(), 0)}
	mem, _ := b.Bytes()
	m.bufs = append(m.bufs, mb)
	x, err := b.Write(s)
	if err != nil {
		m.fail("first write: %v", err)
		return
	}
	head := mb.want
	_ = s.Enqueue(func() error { copy(mem, head[:]); return nil })
	if err := x.Done(); err != nil {
		m.fail("first write done: %v", err)
	}
}

// memset is devalloc's own write of the whole buffer: it ends in s's mark.
func (m *ledgerModel) memset(mb *modelBuf, s *Stream, r uint8) {
	err := s.Memset(mb.b, 0, mb.b.Size(), r)
	if errors.Is(err, distbuf.ErrConflict) && len(mb.holds) > 0 {
		return
	}
	if err != nil {
		m.fail("memset: %v", err)
		return
	}
	for i := range mb.want {
		mb.want[i] = r
	}
}

// copyTo is devalloc's own copy of src's head and more into dst: a read of
// src and a write of dst, both ending in s's mark.
func (m *ledgerModel) copyTo(dst, src *modelBuf, s *Stream) {
	n := min(dst.b.Size(), src.b.Size())
	err := s.Copy(dst.b, 0, src.b, 0, n)
	if errors.Is(err, distbuf.ErrConflict) && len(dst.holds) > 0 {
		return
	}
	if err != nil {
		m.fail("copy: %v", err)
		return
	}
	dst.want = src.want
}

func (m *ledgerModel) run(ops []byte) {
	for i := 0; i+2 < len(ops) && m.failed.Load() == nil; i += 3 {
		op, arg, r := ops[i], ops[i+1], ops[i+2]
		s := m.streams[int(arg)%len(m.streams)]
		var mb *modelBuf
		if len(m.bufs) > 0 {
			mb = m.bufs[int(arg/4)%len(m.bufs)]
		}
		if mb == nil || mb.freed {
			if op%10 != 7 {
				m.alloc(s, r)
				continue
			}
		}
		switch op % 10 {
		case 8:
			m.memset(mb, s, r)
		case 9:
			if src := m.bufs[int(r)%len(m.bufs)]; src != mb && !src.freed {
				m.copyTo(mb, src, s)
			}
		case 0:
			m.alloc(s, r)
		case 1, 2:
			m.write(mb, s, r)
		case 3, 4:
			m.read(mb, s, r)
		case 5:
			m.hold(mb, Mode(1+int(r)%2), r)
		case 6:
			m.releaseHold(mb)
		case 7:
			if mb != nil && !mb.freed && r%2 == 0 {
				if err := mb.b.Free(); err != nil {
					m.fail("free: %v", err)
				}
				mb.freed = true
			} else if r%3 == 0 && m.noHolds() {
				// Sync with a hold outstanding would wait for this very
				// goroutine to release it, as MPI_Wait on oneself would.
				if err := m.a.Sync(); err != nil {
					m.fail("sync: %v", err)
				}
			}
		}
	}
	m.releaseAll()
	for _, mb := range m.bufs {
		if !mb.freed {
			if err := mb.b.Free(); err != nil {
				m.fail("final free: %v", err)
			}
			mb.freed = true
		}
	}
	m.wg.Wait()
}

func (m *ledgerModel) noHolds() bool {
	for _, mb := range m.bufs {
		if len(mb.holds) > 0 {
			return false
		}
	}
	return true
}

func runLedgerModel(t *testing.T, ops []byte, sleepy bool) {
	a, err := Open(Options{Backend: BackendHost, Config: &Config{}})
	if err != nil {
		t.Fatal(err)
	}
	m := &ledgerModel{t: t, a: a, sleepy: sleepy}
	for range 3 {
		s, err := a.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		m.streams = append(m.streams, s)
	}
	m.run(ops)
	if err := a.Sync(); err != nil {
		t.Fatalf("sync: %v", err)
	}
	// Every buffer is freed and every hold released: no entry may still
	// stand on a mark, or an event would never be destroyed.
	for _, s := range append([]*Stream{a.defaultS, a.reclaim}, m.streams...) {
		if n, rec := s.markRefs(); n != 0 || rec != 0 {
			t.Fatalf("stream %d: %d entries on the current mark and %d recorded marks left", s.id, n, rec)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if msg := m.failed.Load(); msg != nil {
		t.Fatal(*msg)
	}
}

func TestLedgerRandomSequences(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for seq := range 60 {
		ops := make([]byte, 3*200)
		for i := range ops {
			ops[i] = byte(rng.UintN(256))
		}
		t.Run(fmt.Sprint("seq=", seq), func(t *testing.T) { runLedgerModel(t, ops, seq%2 == 0) })
	}
}

func FuzzLedger(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 1, 2, 3, 2, 3, 7, 0, 0, 0, 1, 5})
	f.Add([]byte{5, 4, 1, 1, 4, 9, 3, 5, 8, 6, 4, 0, 7, 4, 0, 0, 1, 0})
	f.Add([]byte{1, 1, 1, 1, 2, 2, 3, 3, 3, 5, 0, 1, 7, 0, 2, 3, 0, 4, 6, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 3*150 {
			ops = ops[:3*150]
		}
		runLedgerModel(t, ops, true)
	})
}
