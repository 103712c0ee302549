package devalloc

import "fmt"

// streamMark is "everything enqueued on a stream so far", recorded as an
// event only when something must wait for it. devalloc's own work (the
// allocation that is a buffer's first writer, Stream.Memset, Stream.Copy)
// ends in a mark rather than an event: a solve that allocates, fills and
// frees its buffers on one stream never needs one, and each record is a
// driver call as dear as the allocation itself. Completions made between two
// records share one mark, and so one event.
//
// Recorded late, a mark covers work enqueued after the completions it
// stands for. That is harmless for device work, which completes by itself,
// but not for a wait on the host or on work the caller declares (an MPI
// request, a collective waiting for its peer): a stream made to wait for
// the mark could then wait for an agent that waits for it. So the stream
// seals its mark, recording it, before it enqueues a host wait or a host
// function and before the caller begins an access on it.
type streamMark struct {
	s    *Stream
	ev   eventImpl // nil until recorded
	refs int       // completions that stand on it; guarded by s.markMu
}

// lazyMark returns the stream's current mark with one more reference.
func (s *Stream) lazyMark() *streamMark {
	s.markMu.Lock()
	m := s.mark
	if m == nil {
		m = &streamMark{s: s}
		s.mark = m
	}
	m.refs++
	s.markMu.Unlock()
	return m
}

// event records the mark if it is not yet and returns its event. A nil
// event with a nil error means the stream was closed first: its work has
// all run, so there is nothing to wait for.
func (m *streamMark) event() (eventImpl, error) {
	s := m.s
	s.markMu.Lock()
	defer s.markMu.Unlock()
	if m.ev != nil {
		return m.ev, nil
	}
	if err := s.recordMarkLocked(m); err != nil {
		if s.closed.Load() {
			return nil, nil
		}
		return nil, err
	}
	return m.ev, nil
}

// recordMarkLocked records m, the stream's current mark, and starts a new
// one for later completions. Called with s.markMu held.
func (s *Stream) recordMarkLocked(m *streamMark) error {
	ev, err := s.impl.record()
	if err != nil {
		return fmt.Errorf("devalloc: record event on stream %d: %w", s.id, err)
	}
	m.ev = ev
	s.a.c.ledgerEvents.Add(1)
	if s.mark == m {
		s.mark = nil
	}
	return nil
}

// release drops one reference; the last destroys the event, if recorded.
func (m *streamMark) release() {
	s := m.s
	s.markMu.Lock()
	defer s.markMu.Unlock()
	m.refs--
	if m.refs == 0 && m.ev != nil {
		_ = m.ev.destroy()
		m.ev = nil
	}
}

// seal records the current mark when completions stand on it, so that
// nothing enqueued from now on is covered by them (see streamMark).
func (s *Stream) seal() error {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	m := s.mark
	if m == nil || m.refs == 0 {
		return nil
	}
	return s.recordMarkLocked(m)
}
