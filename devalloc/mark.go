package devalloc

import (
	"fmt"

	"github.com/distbuf/distbuf"
)

// A stream mark is "everything enqueued on a stream so far", recorded as an
// event only when something must wait for it. devalloc's own work (the
// allocation that is a buffer's first writer, Stream.Memset, Stream.Copy)
// ends in a mark rather than an event: a solve that allocates, fills and
// frees its buffers on one stream never needs one, and each record is a
// driver call as dear as the allocation itself. Completions made between two
// records share one mark, and so one event.
//
// A stream numbers its marks: the newest epoch is the one entries taken now
// get; recording the current mark starts the next. A ledger entry on a mark
// is the pair (stream, epoch), held by value, and the stream counts the
// entries on each mark, so that taking one costs no heap object: the
// current mark's count is a field of the stream, and a recorded mark keeps
// its event in a short list until its last entry is dropped.
//
// The current mark's count is kept under the allocator's lock, which Alloc
// and Free take anyway for the list of live buffers: the mark an allocation
// ends in, and the one a free drops, cost no lock of their own. Recording
// and the recorded marks are under the stream's markMu, so that no driver
// call is made under the allocator's lock. Lock order: markMu, then the
// allocator's mu.
//
// Recorded late, a mark covers work enqueued after the completions it
// stands for. That is harmless for device work, which completes by itself,
// but not for a wait on the host or on work the caller declares (an MPI
// request, a collective waiting for its peer): a stream made to wait for
// the mark could then wait for an agent that waits for it. So the stream
// seals its mark, recording it, before it enqueues a host wait or a host
// function and before the caller begins an access on it.

// recordedMark is a mark that has its event: the epochs lo to hi, more than
// one when a record failed and the mark stayed current.
type recordedMark struct {
	lo, hi uint64
	ev     eventImpl
	seq    uint64 // the event's number on the stream (recordLedger)
	refs   int    // entries on it; the event is destroyed at 0
}

// takeMark returns an entry on the stream's current mark.
func (s *Stream) takeMark() entry {
	s.a.mu.Lock()
	e := s.takeMarkLocked()
	s.a.mu.Unlock()
	return e
}

// takeMarkLocked is takeMark with the allocator's mu held.
func (s *Stream) takeMarkLocked() entry {
	s.curRefs++
	return entry{s: s, epoch: s.epoch.Load()}
}

// isCurrent reports whether the mark epoch is the newest: when it is
// recorded later, its event covers all work enqueued on s before this call.
// It takes no lock: recordMarkLocked moves the epoch on before it records.
func (s *Stream) isCurrent(epoch uint64) bool { return s.epoch.Load() == epoch }

// dropCurrentLocked drops an entry on mark epoch if that mark is the
// current one and reports whether it did; a recorded mark needs markMu
// (dropMark). Called with the allocator's mu held.
func (s *Stream) dropCurrentLocked(epoch uint64) bool {
	if epoch < s.base {
		return false
	}
	s.curRefs--
	return true
}

// refMark adds delta entries on mark epoch.
func (s *Stream) refMark(epoch uint64, delta int) {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	s.a.mu.Lock()
	if epoch >= s.base {
		s.curRefs += delta
		s.a.mu.Unlock()
		return
	}
	s.a.mu.Unlock()
	s.refMarkRecordedLocked(epoch, delta)
}

// dropMark drops an entry on mark epoch.
func (s *Stream) dropMark(epoch uint64) { s.refMark(epoch, -1) }

// addMarkRef adds an entry on mark epoch, which an entry already stands on.
func (s *Stream) addMarkRef(epoch uint64) { s.refMark(epoch, 1) }

// moveToCurrent turns the entry old on mark epoch of s into one on the
// current mark: for own work just enqueued on s, which the current mark
// covers. It takes no lock when old already stands on the newest epoch.
func (s *Stream) moveToCurrent(epoch uint64) entry {
	if s.isCurrent(epoch) {
		return entry{s: s, epoch: epoch}
	}
	s.markMu.Lock()
	defer s.markMu.Unlock()
	s.a.mu.Lock()
	if epoch >= s.base {
		// Still counted on the current mark (a record of it failed).
		e := entry{s: s, epoch: s.epoch.Load()}
		s.a.mu.Unlock()
		return e
	}
	e := s.takeMarkLocked()
	s.a.mu.Unlock()
	s.refMarkRecordedLocked(epoch, -1)
	return e
}

// refMarkRecordedLocked adds delta entries on the recorded mark that holds
// epoch. Called with markMu held.
func (s *Stream) refMarkRecordedLocked(epoch uint64, delta int) {
	for i := range s.recorded {
		m := &s.recorded[i]
		if epoch < m.lo || epoch > m.hi {
			continue
		}
		m.refs += delta
		if m.refs == 0 {
			_ = m.ev.destroy()
			s.recorded = append(s.recorded[:i], s.recorded[i+1:]...)
		}
		return
	}
}

// markEvent returns the event of mark epoch, recording the mark if it is
// the current one. The caller holds an entry on it, which keeps the event
// alive. A nil event with a nil error means the stream was closed first:
// its work has all run, so there is nothing to wait for.
func (s *Stream) markEvent(epoch uint64) (eventImpl, uint64, error) {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	if err := s.recordMarkLocked(epoch, false); err != nil {
		if s.closed.Load() {
			return nil, 0, nil
		}
		return nil, 0, err
	}
	for i := range s.recorded {
		if m := &s.recorded[i]; m.lo <= epoch && epoch <= m.hi {
			return m.ev, m.seq, nil
		}
	}
	return nil, 0, fmt.Errorf("devalloc: stream %d: mark %d has no entry left: %w", s.id, epoch, distbuf.ErrInvalid)
}

// markRan reports whether mark epoch has been recorded and its event has
// completed: all the work it stands for has run. It records nothing.
func (s *Stream) markRan(epoch uint64) bool {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	s.a.mu.Lock()
	current := epoch >= s.base
	s.a.mu.Unlock()
	if current {
		return false
	}
	for i := range s.recorded {
		if m := &s.recorded[i]; m.lo <= epoch && epoch <= m.hi {
			if s.ranThrough(m.seq) {
				return true
			}
			done, err := m.ev.query()
			if err == nil && done {
				s.sawRan(m.seq)
			}
			return err == nil && done
		}
	}
	return false
}

// recordMarkLocked records the current mark and starts the next, if the
// mark holding epoch is still the current one, and only if entries stand
// on it when sealing. Called with markMu held.
func (s *Stream) recordMarkLocked(epoch uint64, sealing bool) error {
	a := s.a
	// The epoch moves on before the record, so that isCurrent, which takes
	// no lock, never reports a mark current whose event misses work
	// enqueued before it looked. Entries taken meanwhile go on the next
	// mark; those dropped meanwhile wait for markMu.
	a.mu.Lock()
	lo, refs := s.base, s.curRefs
	if (sealing && refs == 0) || (!sealing && epoch < lo) {
		a.mu.Unlock()
		return nil
	}
	hi := s.epoch.Load()
	s.epoch.Store(hi + 1)
	s.base, s.curRefs = hi+1, 0
	a.mu.Unlock()
	ev, seq, err := s.recordLedger()
	if err != nil {
		// The mark stays current, under its epochs and the next one's.
		a.mu.Lock()
		s.base = lo
		s.curRefs += refs
		a.mu.Unlock()
		return fmt.Errorf("devalloc: record event on stream %d: %w", s.id, err)
	}
	a.c.ledgerEvents.Add(1)
	s.recorded = append(s.recorded, recordedMark{lo: lo, hi: hi, ev: ev, seq: seq, refs: refs})
	return nil
}

// seal records the current mark when entries stand on it, so that nothing
// enqueued from now on is covered by them.
func (s *Stream) seal() error {
	s.a.mu.Lock()
	idle := s.curRefs == 0
	s.a.mu.Unlock()
	if idle {
		return nil
	}
	s.markMu.Lock()
	defer s.markMu.Unlock()
	return s.recordMarkLocked(0, true)
}
