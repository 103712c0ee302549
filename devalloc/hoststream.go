package devalloc

import (
	"fmt"
	"sync"

	"github.com/distbuf/distbuf"
)

// hostStream runs its work in order on one goroutine, like a device stream:
// enqueueing never waits for the work, and events mark points in the queue.
// The queue is unbounded so that enqueueing never blocks on a stream that is
// itself waiting for the enqueuer (an outside agent's hold).
type hostStream struct {
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []func()
	closed  bool
	running bool // an op is executing
	stopped chan struct{}
	abort   chan struct{} // closed by abandonHostWaits: waits on outside agents give up
	aborted sync.Once
	err     error // sticky: the first failure of enqueued work since the last synchronize
}

func newHostStream() *hostStream {
	s := &hostStream{stopped: make(chan struct{}), abort: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	go s.run()
	return s
}

func (s *hostStream) run() {
	defer close(s.stopped)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		op := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.running = true
		s.mu.Unlock()
		op()
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
	}
}

func (s *hostStream) push(op func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("host stream: %w", distbuf.ErrClosed)
	}
	s.queue = append(s.queue, op)
	s.cond.Signal()
	return nil
}

// runNowIfIdle runs op on the calling goroutine when the stream has no work
// queued or running, which is then the same as running it in stream order;
// it holds the stream's lock so nothing can be enqueued meanwhile.
func (s *hostStream) runNowIfIdle(op func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running || len(s.queue) > 0 || s.closed {
		return false
	}
	op()
	return true
}

func (s *hostStream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

func (s *hostStream) handle() uintptr { return 0 }

func (s *hostStream) record() (eventImpl, error) {
	ev := &hostEvent{done: make(chan struct{})}
	if s.runNowIfIdle(func() { close(ev.done) }) {
		return ev, nil
	}
	if err := s.push(func() { close(ev.done) }); err != nil {
		return nil, err
	}
	return ev, nil
}

func (s *hostStream) wait(e eventImpl) error {
	ev, ok := baseEvent(e).(*hostEvent)
	if !ok {
		return fmt.Errorf("host stream: event from another backend: %w", distbuf.ErrInvalid)
	}
	return s.push(func() { <-ev.done })
}

func (s *hostStream) waitHost(ch <-chan struct{}) error {
	return s.push(func() { waitOrAbandon(ch, s.abort, s.fail) })
}

func (s *hostStream) abandonHostWaits() { s.aborted.Do(func() { close(s.abort) }) }

func (s *hostStream) enqueue(fn func() error) error {
	return s.push(func() {
		defer func() {
			if r := recover(); r != nil {
				s.fail(fmt.Errorf("stream function panicked: %v", r))
			}
		}()
		if err := fn(); err != nil {
			s.fail(err)
		}
	})
}

// hostFunctionsSeen needs nothing: the host stream's functions and events
// are goroutines and channels, whose order Go sees.
func (s *hostStream) hostFunctionsSeen() {}

func (s *hostStream) synchronize() error {
	e, err := s.record()
	if err != nil {
		return err
	}
	_ = e.synchronize()
	s.mu.Lock()
	defer s.mu.Unlock()
	err, s.err = s.err, nil
	return err
}

func (s *hostStream) destroy() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cond.Signal()
	s.mu.Unlock()
	s.abandonHostWaits()
	<-s.stopped
	return nil
}

type hostEvent struct{ done chan struct{} }

func (e *hostEvent) query() (bool, error) {
	select {
	case <-e.done:
		return true, nil
	default:
		return false, nil
	}
}

func (e *hostEvent) synchronize() error { <-e.done; return nil }
func (e *hostEvent) destroy() error     { return nil }
