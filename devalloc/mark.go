package devalloc

import "fmt"

// A stream mark is "everything enqueued on a stream so far", recorded as an
// event only when something must wait for it. devalloc's own work (the
// allocation that is a buffer's first writer, Stream.Memset, Stream.Copy)
// ends in a mark rather than an event: a solve that allocates, fills and
// frees its buffers on one stream never needs one, and each record is a
// driver call as dear as the allocation itself. Completions made between two
// records share one mark, and so one event.
//
// A stream numbers its marks: the current one, not yet recorded, is its
// epoch; recording it starts the next. A ledger entry on a mark is the pair
// (stream, epoch), held by value, and the stream counts the entries on each
// mark, so that taking one costs no heap object: the current mark's count is
// a field of the stream, and a recorded mark keeps its event in a short list
// until its last entry is dropped.
//
// Recorded late, a mark covers work enqueued after the completions it
// stands for. That is harmless for device work, which completes by itself,
// but not for a wait on the host or on work the caller declares (an MPI
// request, a collective waiting for its peer): a stream made to wait for
// the mark could then wait for an agent that waits for it. So the stream
// seals its mark, recording it, before it enqueues a host wait or a host
// function and before the caller begins an access on it.

// recordedMark is a mark that has its event.
type recordedMark struct {
	epoch uint64
	ev    eventImpl
	refs  int // entries on it; the event is destroyed at 0
}

// takeMark returns an entry on the stream's current mark.
func (s *Stream) takeMark() entry {
	s.markMu.Lock()
	s.curRefs++
	e := entry{s: s, epoch: s.epoch.Load()}
	s.markMu.Unlock()
	return e
}

// isCurrent reports whether the mark epoch is not recorded yet: when it is
// recorded later, its event covers all work enqueued on s before this call.
// It takes no lock: recordMarkLocked moves the epoch on before it records.
func (s *Stream) isCurrent(epoch uint64) bool { return s.epoch.Load() == epoch }

// refMarkLocked adds delta entries on mark epoch. Called with s.markMu held.
func (s *Stream) refMarkLocked(epoch uint64, delta int) {
	if epoch == s.epoch.Load() {
		s.curRefs += delta
		return
	}
	for i := range s.recorded {
		m := &s.recorded[i]
		if m.epoch != epoch {
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

// dropMark drops an entry on mark epoch.
func (s *Stream) dropMark(epoch uint64) {
	s.markMu.Lock()
	s.refMarkLocked(epoch, -1)
	s.markMu.Unlock()
}

// addMarkRef adds an entry on mark epoch, which an entry already stands on.
func (s *Stream) addMarkRef(epoch uint64) {
	s.markMu.Lock()
	s.refMarkLocked(epoch, 1)
	s.markMu.Unlock()
}

// moveToCurrent turns the entry old on mark epoch of s into one on the
// current mark: for own work just enqueued on s, which the current mark
// covers. It takes the lock once, and does nothing when old already stands
// on the current mark.
func (s *Stream) moveToCurrent(epoch uint64) entry {
	if s.isCurrent(epoch) {
		return entry{s: s, epoch: epoch}
	}
	s.markMu.Lock()
	cur := s.epoch.Load()
	if epoch != cur {
		s.refMarkLocked(epoch, -1)
		s.curRefs++
	}
	s.markMu.Unlock()
	return entry{s: s, epoch: cur}
}

// markEvent returns the event of mark epoch, recording the mark if it is
// the current one. The caller holds an entry on it, which keeps the event
// alive. A nil event with a nil error means the stream was closed first:
// its work has all run, so there is nothing to wait for.
func (s *Stream) markEvent(epoch uint64) (eventImpl, error) {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	if epoch == s.epoch.Load() {
		if err := s.recordMarkLocked(); err != nil {
			if s.closed.Load() {
				return nil, nil
			}
			return nil, err
		}
	}
	for i := range s.recorded {
		if s.recorded[i].epoch == epoch {
			return s.recorded[i].ev, nil
		}
	}
	return nil, fmt.Errorf("devalloc: stream %d: mark %d has no entry left: %w", s.id, epoch, ErrInvalid)
}

// recordMarkLocked records the current mark and starts the next. Called
// with s.markMu held.
func (s *Stream) recordMarkLocked() error {
	// The epoch moves on before the record, so that isCurrent, which takes
	// no lock, never reports a mark current whose event misses work
	// enqueued before it looked.
	e := s.epoch.Load()
	s.epoch.Store(e + 1)
	ev, err := s.impl.record()
	if err != nil {
		s.epoch.Store(e)
		return fmt.Errorf("devalloc: record event on stream %d: %w", s.id, err)
	}
	s.a.c.ledgerEvents.Add(1)
	s.recorded = append(s.recorded, recordedMark{epoch: e, ev: ev, refs: s.curRefs})
	s.curRefs = 0
	return nil
}

// seal records the current mark when entries stand on it, so that nothing
// enqueued from now on is covered by them.
func (s *Stream) seal() error {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	if s.curRefs == 0 {
		return nil
	}
	return s.recordMarkLocked()
}
