//go:build cgo

package devalloc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/cudart"
)

// cudaStream is a non-blocking cudaStream_t. Calls that use the handle hold
// mu for reading; destroy holds it for writing, so a handle is never used
// after cudaStreamDestroy.
//
// Host work (Enqueue functions, waits for an outside agent's Hold) is
// ordered on the device by one word of mapped pinned memory per stream (see
// envCUDAHostWait): each host operation takes the next sequence number and
// the stream waits until the word reaches it (cuStreamWaitValue32, GEQ). A
// worker goroutine completes the operations in order and writes their
// numbers, so the word only grows and one word serves the stream's life. An
// Enqueue function starts when a cudaLaunchHostFunc placed before the wait
// signals that the stream has reached it; the runtime's callback thread is
// never blocked.
type cudaStream struct {
	be *cudaBackend
	h  cudart.Stream

	mu   sync.RWMutex
	dead bool
	// shared: the reclamation stream, on which nothing is allocated; the
	// blocks freed in its order are kept for every stream (streamReuse).
	shared bool
	// kept holds the blocks kept for reuse on this stream, by size
	// (streamReuse, under its lock).
	kept map[int64]*keptList

	hostMu   sync.Mutex
	cond     *sync.Cond // on hostMu: the worker's queue
	err      error      // first failure of a host function since the last synchronize
	word     *hostWord
	seq      uint32
	queue    []*hostOp
	running  bool
	stopping bool
	stopped  chan struct{}
	abort    chan struct{} // closed by abandonHostWaits: waits for outside agents give up
	aborted  sync.Once
	// seenMu is taken, empty, at the end of every Enqueue function and by
	// the waits after which the caller may read what they wrote (see
	// run). It is never held across anything else: hostMu is, across
	// driver calls that may wait for the device, and the device may be
	// waiting for the function's end.
	seenMu sync.Mutex
}

// hostOp is an Enqueue function (fn, started by ready) or a wait for an
// outside agent (ch).
type hostOp struct {
	seq   uint32
	fn    func() error
	ready chan struct{}
	ch    <-chan struct{}
}

func newCUDAStream(be *cudaBackend, h cudart.Stream) *cudaStream {
	s := &cudaStream{be: be, h: h, stopped: make(chan struct{}), abort: make(chan struct{})}
	s.cond = sync.NewCond(&s.hostMu)
	return s
}

// use runs fn with the handle guaranteed alive.
func (s *cudaStream) use(fn func() error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.dead {
		return fmt.Errorf("cuda stream: %w", distbuf.ErrClosed)
	}
	return fn()
}

func (s *cudaStream) handle() uintptr { return uintptr(s.h) }

// keepForAll is called before the stream's first use when nothing is to be
// allocated on it: the blocks freed in its order serve every stream.
func (s *cudaStream) keepForAll() { s.shared = true }

func (s *cudaStream) record() (eventImpl, error) {
	var ev *cudaEvent
	err := s.use(func() error {
		h, err := s.be.events.get()
		if err != nil {
			return err
		}
		if err := s.be.dev.EventRecord(h, s.h); err != nil {
			s.be.events.put(h)
			return wrapCUDA("record an event", err)
		}
		ev = &cudaEvent{be: s.be, h: h}
		return nil
	})
	return ev, err
}

func (s *cudaStream) wait(e eventImpl) error {
	ev, ok := baseEvent(e).(*cudaEvent)
	if !ok || ev.be != s.be {
		return fmt.Errorf("cuda stream: event of another backend: %w", distbuf.ErrInvalid)
	}
	return s.use(func() error { return wrapCUDA("wait for an event", s.be.dev.StreamWaitEvent(s.h, ev.h)) })
}

func (s *cudaStream) waitHost(ch <-chan struct{}) error {
	if s.be.hostWait == hostWaitMemop {
		return s.hostOp(&hostOp{ch: ch})
	}
	return s.use(func() error {
		return wrapCUDA("wait for the host", s.be.dev.LaunchHostFunc(s.h, func() { waitOrAbandon(ch, s.abort, s.fail) }))
	})
}

func (s *cudaStream) abandonHostWaits() { s.aborted.Do(func() { close(s.abort) }) }

func (s *cudaStream) enqueue(fn func() error) error {
	if s.be.hostWait == hostWaitMemop {
		return s.hostOp(&hostOp{fn: fn, ready: make(chan struct{})})
	}
	return s.use(func() error {
		return wrapCUDA("enqueue a host function", s.be.dev.LaunchHostFunc(s.h, func() { s.run(fn) }))
	})
}

// run calls an Enqueue function, keeping its error or panic for synchronize.
// It ends under seenMu, which synchronize and hostFunctionsSeen take once
// the stream has run past it: the device orders the function before the
// stream's end (through the driver, which Go's memory model does not see),
// and the lock shows that order to Go, so that the caller reads what the
// function wrote without a race.
func (s *cudaStream) run(fn func() error) {
	defer func() {
		if r := recover(); r != nil {
			s.fail(fmt.Errorf("stream function panicked: %v", r))
		}
		s.seenMu.Lock()
		//lint:ignore SA2001 the empty critical section is the point: hostFunctionsSeen's lock orders its caller after it
		s.seenMu.Unlock()
	}()
	if err := fn(); err != nil {
		s.fail(err)
	}
}

func (s *cudaStream) fail(err error) {
	s.hostMu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.hostMu.Unlock()
}

func (s *cudaStream) hostOp(op *hostOp) error {
	return s.use(func() error {
		s.hostMu.Lock()
		defer s.hostMu.Unlock()
		if s.word == nil {
			w, err := s.be.words.get()
			if err != nil {
				return err
			}
			s.word = w
		}
		if !s.running {
			s.running = true
			go s.work()
		}
		op.seq = s.seq + 1
		if op.ready != nil {
			ready := op.ready
			if err := s.be.dev.LaunchHostFunc(s.h, func() { close(ready) }); err != nil {
				return wrapCUDA("enqueue a host function", err)
			}
		}
		s.seq = op.seq
		s.queue = append(s.queue, op)
		s.cond.Signal()
		// Should this fail, the worker still completes op in order; only the
		// device work after it is not held back.
		return wrapCUDA("wait for the host", s.be.dev.StreamWaitValueGEQ(s.h, s.word.dptr, op.seq))
	})
}

// work completes host operations in stream order and releases the device
// past each by writing its sequence number.
func (s *cudaStream) work() {
	defer close(s.stopped)
	for {
		s.hostMu.Lock()
		for len(s.queue) == 0 && !s.stopping {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.hostMu.Unlock()
			return
		}
		op := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.hostMu.Unlock()
		if op.fn != nil {
			<-op.ready // the device reaches it: destroy synchronises the stream
			s.run(op.fn)
		} else {
			waitOrAbandon(op.ch, s.abort, s.fail)
		}
		atomic.StoreUint32(s.word.ptr, op.seq)
	}
}

// hostFunctionsSeen takes the lock every Enqueue function ends under (run):
// the empty critical section is the point, it orders the caller after them.
func (s *cudaStream) hostFunctionsSeen() {
	s.seenMu.Lock()
	//lint:ignore SA2001 the empty critical section is the point: it orders the caller after run's
	s.seenMu.Unlock()
}

func (s *cudaStream) synchronize() error {
	fb := s.be.fb
	var sealed *classMap
	if fb != nil {
		sealed = fb.seal(s)
	}
	err := s.use(func() error { return wrapCUDA("synchronize a stream", s.be.dev.StreamSynchronize(s.h)) })
	if fb != nil {
		fb.synced(s, sealed, err == nil)
	}
	if err != nil {
		return err
	}
	s.hostFunctionsSeen()
	s.hostMu.Lock()
	defer s.hostMu.Unlock()
	err, s.err = s.err, nil
	return err
}

// destroy lets waits for outside agents give up, runs the work already
// enqueued (Enqueue functions included) and destroys the stream.
func (s *cudaStream) destroy() error {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return nil
	}
	s.dead = true
	s.mu.Unlock()
	// The blocks kept for reuse here go back to the pool in its order
	// before the handle goes: no free is kept on a dead stream.
	errKept := s.be.reuse.drain(s)
	s.abandonHostWaits()
	errSync := wrapCUDA("synchronize a stream being destroyed", s.be.dev.StreamSynchronize(s.h))
	s.hostMu.Lock()
	s.stopping = true
	s.cond.Broadcast()
	running := s.running
	s.hostMu.Unlock()
	if running {
		<-s.stopped
	}
	if s.be.fb != nil && errSync == nil {
		s.be.fb.streamDone(s)
	}
	errDestroy := wrapCUDA("destroy a stream", s.be.dev.StreamDestroy(s.h))
	if s.word != nil {
		s.be.words.put(s.word)
		s.word = nil
	}
	return errors.Join(errKept, errSync, errDestroy)
}

// cudaEvent is a cudaEvent_t from the backend's pool.
type cudaEvent struct {
	be *cudaBackend
	h  cudart.Event
}

func (e *cudaEvent) query() (bool, error) {
	done, err := e.be.dev.EventQuery(e.h)
	return done, wrapCUDA("query an event", err)
}

func (e *cudaEvent) synchronize() error {
	return wrapCUDA("wait for an event", e.be.dev.EventSynchronize(e.h))
}

// destroy returns the event to the pool. Streams already waiting on it keep
// waiting for the record they saw: re-recording it later does not change
// that, which is what makes the reuse safe.
func (e *cudaEvent) destroy() error {
	e.be.events.put(e.h)
	return nil
}

// eventPool recycles events so the ledger's hot path (a record per declared
// access, per stream mark waited for, and per free of the fallback) does not
// create and destroy one each time.
type eventPool struct {
	dev    *cudart.Device
	mu     sync.Mutex
	free   []cudart.Event
	closed bool
}

const maxPooledEvents = 4096

func (p *eventPool) get() (cudart.Event, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		ev := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return ev, nil
	}
	p.mu.Unlock()
	ev, err := p.dev.EventCreate()
	return ev, wrapCUDA("create an event", err)
}

func (p *eventPool) put(ev cudart.Event) {
	p.mu.Lock()
	if !p.closed && len(p.free) < maxPooledEvents {
		p.free = append(p.free, ev)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	_ = p.dev.EventDestroy(ev)
}

func (p *eventPool) close() error {
	p.mu.Lock()
	evs := p.free
	p.free, p.closed = nil, true
	p.mu.Unlock()
	var errs []error
	for _, ev := range evs {
		if err := p.dev.EventDestroy(ev); err != nil {
			errs = append(errs, wrapCUDA("destroy an event", err))
		}
	}
	return errors.Join(errs...)
}

// hostWord is a 32-bit word of mapped pinned memory that one stream waits
// on; the host writes it.
type hostWord struct {
	ptr  *uint32
	dptr uintptr // its device address
}

// wordSlab hands out host words from 4 KiB blocks of pinned memory, one
// cache line apart. cudaHostAlloc is slow, so blocks are allocated on first
// need and kept until the backend closes.
type wordSlab struct {
	dev    *cudart.Device
	mu     sync.Mutex
	blocks []unsafe.Pointer
	free   []*hostWord
	out    int
}

const (
	wordSlabBytes = 4096
	wordStride    = 64
)

func (w *wordSlab) get() (*hostWord, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.free) == 0 {
		p, err := w.dev.HostAlloc(wordSlabBytes, cudart.HostAllocPortable|cudart.HostAllocMapped)
		if err != nil {
			return nil, wrapCUDA("allocate host words", err)
		}
		dp, err := w.dev.HostDevicePointer(p)
		if err != nil {
			_ = w.dev.FreeHost(p)
			return nil, wrapCUDA("map host words", err)
		}
		w.blocks = append(w.blocks, p)
		for off := 0; off < wordSlabBytes; off += wordStride {
			w.free = append(w.free, &hostWord{ptr: (*uint32)(unsafe.Add(p, off)), dptr: dp + uintptr(off)})
		}
	}
	hw := w.free[len(w.free)-1]
	w.free = w.free[:len(w.free)-1]
	w.out++
	atomic.StoreUint32(hw.ptr, 0)
	return hw, nil
}

// put takes back the word of a destroyed stream: nothing waits on it any more.
func (w *wordSlab) put(hw *hostWord) {
	w.mu.Lock()
	w.free = append(w.free, hw)
	w.out--
	w.mu.Unlock()
}

// close frees the blocks unless a stream still holds a word (then a device
// wait may still read it, and the memory is left to the process's end).
func (w *wordSlab) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.out > 0 {
		return nil
	}
	var errs []error
	for _, p := range w.blocks {
		if err := w.dev.FreeHost(p); err != nil {
			errs = append(errs, wrapCUDA("free host words", err))
		}
	}
	w.blocks, w.free = nil, nil
	return errors.Join(errs...)
}
