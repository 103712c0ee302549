package devalloc

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Options configures Open. The zero Options opens the backend named by
// DISTBUF_BACKEND (auto when unset) with the configuration in
// DISTBUF_ALLOC_CONF (defaults when unset).
type Options struct {
	// Backend overrides DISTBUF_BACKEND when not empty.
	Backend Backend
	// Device is the CUDA device ordinal (see cluster's placement helper).
	Device int
	// Config overrides DISTBUF_ALLOC_CONF when not nil.
	Config *Config
	// OnOutOfMemory is step 3 of the out-of-memory ladder: it may free memory
	// and return true to ask for another attempt. It is called without any
	// allocator lock held, so it may call Free.
	OnOutOfMemory func(OOMEvent) (retry bool)
	// Warn receives warnings such as the reason for a fallback. Nil writes
	// them to standard error: a fallback is never silent.
	Warn func(msg string)
}

// OOMEvent is passed to Options.OnOutOfMemory.
type OOMEvent struct {
	Requested int64
	Attempt   int // 1 for the first callback
	Used      int64
	Reserved  int64
	Limit     int64
}

// maxCallbackRetries bounds the callback step so a callback that always asks
// for a retry without freeing anything cannot spin forever.
const maxCallbackRetries = 8

// Allocator is one rank's memory manager on one device. It is safe for
// concurrent use.
type Allocator struct {
	be       backend
	device   int
	cfg      Config
	limit    int64
	reason   string
	onOOM    func(OOMEvent) bool
	warn     func(string)
	policy   atomic.Int32
	nextID   atomic.Uint64
	budget   atomic.Int64 // aligned bytes of live and held-for-free buffers
	closed   atomic.Bool
	closeMu  sync.RWMutex // held for reading by operations, for writing by Close
	defaultS *Stream
	reclaim  *Stream
	pinned   pinnedPool

	mu      sync.Mutex
	streams map[*Stream]struct{}
	live    map[*Buffer]struct{}

	c counters
}

type counters struct {
	requestedCur, requestedPeak, requestedTotal atomic.Int64
	allocCalls, backendCalls, frees             atomic.Int64
	trims, oomRetries, fallbacks                atomic.Int64
	ledgerEvents                                atomic.Int64
	liveBuffers, heldFrees                      atomic.Int64
}

// Open creates an allocator on the backend chosen by Options and the
// environment. With BackendAuto it uses CUDA when a usable GPU is present and
// otherwise the host backend, reporting why through Warn and FallbackReason.
func Open(opts Options) (*Allocator, error) {
	choice, err := resolveBackend(opts.Backend)
	if err != nil {
		return nil, err
	}
	cfg, err := resolveConfig(opts.Config)
	if err != nil {
		return nil, err
	}
	if opts.Device < 0 {
		return nil, &ConfigError{Source: "Options", Key: "Device", Value: fmt.Sprint(opts.Device), Reason: "must not be negative"}
	}
	a := &Allocator{
		device:  opts.Device,
		cfg:     cfg,
		onOOM:   opts.OnOutOfMemory,
		warn:    opts.Warn,
		streams: make(map[*Stream]struct{}),
		live:    make(map[*Buffer]struct{}),
	}
	if a.warn == nil {
		a.warn = func(msg string) { fmt.Fprintln(os.Stderr, "distbuf:", msg) }
	}
	switch choice {
	case BackendHost:
		a.be = newHostBackend()
	case BackendCUDA, BackendAuto:
		cudaErr := fmt.Errorf("CUDA backend not compiled in (build with cgo): %w", ErrUnavailable)
		if openCUDA != nil {
			a.be, cudaErr = openCUDA(opts.Device, cfg)
		}
		if cudaErr != nil {
			if choice == BackendCUDA {
				return nil, fmt.Errorf("devalloc: open cuda backend on device %d: %w", opts.Device, cudaErr)
			}
			a.be = newHostBackend()
			a.reason = "auto: using host backend because CUDA is unavailable: " + cudaErr.Error()
		}
	}
	if a.be.kind() == KindCUDAMalloc {
		a.reason = "cuda: stream-ordered pool not used, falling back to cudaMalloc"
		if cfg.Pool == PoolOff {
			a.reason += " (pool:off)"
		}
	}
	if a.reason != "" {
		a.c.fallbacks.Add(1)
		a.warn(a.reason)
	}
	if err := a.init(); err != nil {
		_ = a.be.close()
		return nil, err
	}
	return a, nil
}

func (a *Allocator) init() error {
	_, total := a.be.memInfo()
	a.limit = a.cfg.Limit.resolve(total)
	a.policy.Store(int32(a.cfg.Policy))
	if err := a.applyPolicy(a.cfg.Policy); err != nil {
		return err
	}
	var err error
	if a.defaultS, err = a.NewStream(); err != nil {
		return err
	}
	r, err := a.be.newStream()
	if err != nil {
		return fmt.Errorf("devalloc: reclamation stream: %w", err)
	}
	a.reclaim = &Stream{a: a, impl: r, id: -1}
	a.pinned.init(a)
	if a.cfg.Prime > 0 {
		if err := a.Prime(a.cfg.Prime); err != nil {
			return err
		}
	}
	return nil
}

// enter guards an operation against a concurrent Close.
func (a *Allocator) enter() error {
	a.closeMu.RLock()
	if a.closed.Load() {
		a.closeMu.RUnlock()
		return fmt.Errorf("devalloc: allocator: %w", ErrClosed)
	}
	return nil
}

func (a *Allocator) exit() { a.closeMu.RUnlock() }

// Kind reports the backend in use.
func (a *Allocator) Kind() Kind { return a.be.kind() }

// Describe names the backend and device in words.
func (a *Allocator) Describe() string { return a.be.describe() }

// FallbackReason says why the allocator is not on the backend asked for, or
// is empty when it is.
func (a *Allocator) FallbackReason() string { return a.reason }

// Device is the CUDA ordinal the allocator was opened on.
func (a *Allocator) Device() int { return a.device }

// Config is the configuration in effect (Policy as set at Open).
func (a *Allocator) Config() Config { return a.cfg }

// Limit is the per-rank budget in bytes, 0 when there is none.
func (a *Allocator) Limit() int64 { return a.limit }

// DefaultStream is a stream owned by the allocator, never the CUDA legacy
// default stream.
func (a *Allocator) DefaultStream() *Stream { return a.defaultS }

// NewStream creates a stream owned by the allocator; Close destroys it.
func (a *Allocator) NewStream() (*Stream, error) {
	if err := a.enter(); err != nil {
		return nil, err
	}
	defer a.exit()
	impl, err := a.be.newStream()
	if err != nil {
		return nil, fmt.Errorf("devalloc: new stream: %w", err)
	}
	s := &Stream{a: a, impl: impl}
	a.mu.Lock()
	a.streams[s] = struct{}{}
	s.id = len(a.streams)
	a.mu.Unlock()
	return s, nil
}

func (a *Allocator) checkStream(s *Stream) error {
	if s == nil {
		return fmt.Errorf("devalloc: nil stream: %w", ErrInvalid)
	}
	if s.a != a {
		return fmt.Errorf("devalloc: stream %d belongs to another allocator: %w", s.id, ErrInvalid)
	}
	if s.closed.Load() {
		return fmt.Errorf("devalloc: stream %d: %w", s.id, ErrClosed)
	}
	return nil
}

// maxAlloc bounds a single request well below overflow of any size arithmetic.
const maxAlloc = 1 << 50

// Alloc returns a buffer of size bytes usable in the order of stream s. The
// allocation is the buffer's first writer: work on another stream declared
// with Read or Write is ordered after it.
//
// When memory runs out it climbs the ladder: synchronise and retry, trim the
// pool and retry, call Options.OnOutOfMemory, and finally return an
// *OutOfMemoryError matching ErrOutOfMemory.
func (a *Allocator) Alloc(size int64, s *Stream) (*Buffer, error) {
	if err := a.enter(); err != nil {
		return nil, err
	}
	defer a.exit()
	if size <= 0 || size > maxAlloc {
		return nil, fmt.Errorf("devalloc: alloc of %d bytes: size must be in [1, 2^50]: %w", size, ErrInvalid)
	}
	if err := a.checkStream(s); err != nil {
		return nil, err
	}
	aligned := alignUp(size, allocAlign)
	addr, hostPtr, err := a.allocWithLadder(size, aligned, s)
	if err != nil {
		return nil, err
	}
	loc := OnDevice
	if a.be.kind() == KindHost {
		loc = OnHost
	}
	b := a.newBuffer(size, aligned, addr, hostPtr, loc, s)
	a.c.allocCalls.Add(1)
	cur := a.c.requestedCur.Add(size)
	a.c.requestedTotal.Add(size)
	for {
		peak := a.c.requestedPeak.Load()
		if cur <= peak || a.c.requestedPeak.CompareAndSwap(peak, cur) {
			break
		}
	}
	return b, nil
}

func (a *Allocator) newBuffer(size, aligned int64, addr uintptr, hostPtr unsafe.Pointer, loc Location, s *Stream) *Buffer {
	b := &Buffer{
		a: a, id: a.nextID.Add(1), size: size, aligned: aligned,
		addr: addr, hostPtr: hostPtr, loc: loc, allocStream: s,
	}
	// The allocation is ordered on s: its first writer is s's mark, an
	// event only if another stream or a hold must wait for it.
	b.writer = markCompletion(s)
	a.mu.Lock()
	a.live[b] = struct{}{}
	a.mu.Unlock()
	a.c.liveBuffers.Add(1)
	return b
}

func (a *Allocator) tryAlloc(aligned int64, s *Stream) (uintptr, unsafe.Pointer, error) {
	if a.limit > 0 {
		if a.budget.Add(aligned) > a.limit {
			a.budget.Add(-aligned)
			return 0, nil, errBudget
		}
	} else {
		a.budget.Add(aligned)
	}
	a.c.backendCalls.Add(1)
	addr, ptr, err := a.be.alloc(aligned, s.impl)
	if err != nil {
		a.budget.Add(-aligned)
	}
	return addr, ptr, err
}

func (a *Allocator) allocWithLadder(size, aligned int64, s *Stream) (uintptr, unsafe.Pointer, error) {
	retries := 0
	addr, ptr, err := a.tryAlloc(aligned, s)
	retry := func() bool {
		retries++
		a.c.oomRetries.Add(1)
		addr, ptr, err = a.tryAlloc(aligned, s)
		return err == nil
	}
	oom := func() bool { return err != nil && (err == errBudget || errors.Is(err, ErrOutOfMemory)) }
	if err == nil {
		return addr, ptr, nil
	}
	if !oom() {
		return 0, nil, fmt.Errorf("devalloc: alloc of %s: %w", FormatBytes(size), err)
	}
	// 1. Synchronise: pending frees complete and return memory to the pool.
	if a.drainFrees() == nil && retry() {
		return addr, ptr, nil
	}
	// 2. Trim: give cached memory back so the driver can satisfy the request
	// from a fresh, unfragmented reservation.
	if oom() {
		if a.trimNow(0) == nil && retry() {
			return addr, ptr, nil
		}
	}
	// 3. The user's callback may free memory.
	for attempt := 1; oom() && a.onOOM != nil && attempt <= maxCallbackRetries; attempt++ {
		u := a.be.usage()
		if !a.onOOM(OOMEvent{Requested: size, Attempt: attempt, Used: a.budget.Load(), Reserved: u.reservedCur, Limit: a.limit}) {
			break
		}
		_ = a.drainFrees()
		if retry() {
			return addr, ptr, nil
		}
	}
	if !oom() {
		return 0, nil, fmt.Errorf("devalloc: alloc of %s: %w", FormatBytes(size), err)
	}
	free, total := a.be.memInfo()
	return 0, nil, &OutOfMemoryError{
		Requested: size, Limit: a.limit, Used: a.budget.Load(), Reserved: a.be.usage().reservedCur,
		Free: free, Total: total, Retries: retries, Cause: err,
	}
}

// syncStreams waits for all work on the allocator's streams, including pending
// frees, then lets the backend apply its release threshold.
func (a *Allocator) syncStreams() error {
	a.mu.Lock()
	streams := make([]*Stream, 0, len(a.streams)+1)
	for s := range a.streams {
		streams = append(streams, s)
	}
	a.mu.Unlock()
	var first error
	for _, s := range append(streams, a.reclaim) {
		if s.closed.Load() {
			continue
		}
		if err := s.impl.synchronize(); err != nil && first == nil {
			first = fmt.Errorf("devalloc: synchronize stream %d: %w", s.id, err)
		}
	}
	a.be.syncPoint()
	return first
}

// Sync waits for all work on the allocator's streams, including pending frees.
func (a *Allocator) Sync() error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	return a.syncStreams()
}

// Policy reports the retention policy in effect.
func (a *Allocator) Policy() Policy { return Policy(a.policy.Load()) }

// SetPolicy switches the retention policy while running. Switching to
// AggressiveFree releases unused pool memory above the free threshold now.
func (a *Allocator) SetPolicy(p Policy) error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	if p != Retain && p != AggressiveFree {
		return fmt.Errorf("devalloc: set policy %v: %w", p, ErrInvalid)
	}
	if err := a.applyPolicy(p); err != nil {
		return err
	}
	a.policy.Store(int32(p))
	if p == AggressiveFree {
		return a.trimNow(a.cfg.FreeThreshold)
	}
	return nil
}

func (a *Allocator) applyPolicy(p Policy) error {
	threshold := uint64(math.MaxUint64)
	if p == AggressiveFree {
		threshold = uint64(a.cfg.FreeThreshold)
	}
	if err := a.be.setReleaseThreshold(threshold); err != nil {
		return fmt.Errorf("devalloc: set release threshold for policy %v: %w", p, err)
	}
	return nil
}

// EndPhase marks a phase boundary (the end of a solve, a sweep). Under
// AggressiveFree it waits for the work on the allocator's streams (so pending
// frees have run) and returns unused pool memory above the free threshold to
// the driver; under Retain it does nothing.
func (a *Allocator) EndPhase() error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	if a.Policy() != AggressiveFree {
		return nil
	}
	return a.trimNow(a.cfg.FreeThreshold)
}

// Prime reserves bytes in the pool once, so that later allocations up to that
// size need no driver call. It has lasting effect under Retain only:
// AggressiveFree gives the memory back at the next phase boundary.
func (a *Allocator) Prime(bytes int64) error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	if bytes <= 0 || bytes > maxAlloc {
		return fmt.Errorf("devalloc: prime %d bytes: size must be in [1, 2^50]: %w", bytes, ErrInvalid)
	}
	a.c.backendCalls.Add(1)
	if err := a.be.prime(alignUp(bytes, allocAlign), a.defaultS.impl); err != nil {
		return fmt.Errorf("devalloc: prime %s: %w", FormatBytes(bytes), err)
	}
	return nil
}

// Trim waits for the work on the allocator's streams, so that pending frees
// have run, and releases unused pool memory until at most keepBytes stay
// reserved (memory in use is never released).
func (a *Allocator) Trim(keepBytes int64) error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	if keepBytes < 0 {
		return fmt.Errorf("devalloc: trim to %d bytes: %w", keepBytes, ErrInvalid)
	}
	return a.trimNow(keepBytes)
}

// drainFrees waits until every enqueued free has run, so its memory is back
// in the pool. Frees are ordered on the streams that used the buffers (or on
// the reclamation stream), so this waits for the work on all of them.
func (a *Allocator) drainFrees() error { return a.syncStreams() }

func (a *Allocator) trimNow(keep int64) error {
	if err := a.drainFrees(); err != nil {
		return err
	}
	a.c.trims.Add(1)
	if err := a.be.trim(keep); err != nil {
		return fmt.Errorf("devalloc: trim to %s: %w", FormatBytes(keep), err)
	}
	return nil
}

// MemInfo reports the free and total memory of the device (or host) as the
// driver sees it; -1 when unknown.
func (a *Allocator) MemInfo() (free, total int64) { return a.be.memInfo() }

// Close waits for pending frees, destroys the allocator's streams and
// releases its pools. If buffers are still live (or freed but still held by
// an outside agent) it returns a *LeakError listing them; their memory is not
// released. Every later call on the allocator returns ErrClosed.
func (a *Allocator) Close() error {
	a.closeMu.Lock()
	if a.closed.Load() {
		a.closeMu.Unlock()
		return fmt.Errorf("devalloc: close: %w", ErrClosed)
	}
	a.closed.Store(true)
	a.closeMu.Unlock()

	leak := a.leaks()
	var errs []error
	a.mu.Lock()
	streams := make([]*Stream, 0, len(a.streams))
	for s := range a.streams {
		streams = append(streams, s)
	}
	a.mu.Unlock()
	for _, s := range streams {
		if !s.closed.Swap(true) {
			if err := s.impl.destroy(); err != nil {
				errs = append(errs, fmt.Errorf("devalloc: close stream %d: %w", s.id, err))
			}
		}
	}
	// Frees are ordered after work on the user streams, so drain them last.
	if err := a.reclaim.impl.destroy(); err != nil {
		errs = append(errs, fmt.Errorf("devalloc: close reclamation stream: %w", err))
	}
	if err := a.pinned.close(); err != nil {
		errs = append(errs, err)
	}
	if err := a.be.close(); err != nil {
		errs = append(errs, fmt.Errorf("devalloc: close backend: %w", err))
	}
	if leak != nil {
		errs = append([]error{leak}, errs...)
	}
	return errors.Join(errs...)
}

func (a *Allocator) leaks() *LeakError {
	a.mu.Lock()
	bufs := make([]*Buffer, 0, len(a.live))
	for b := range a.live {
		bufs = append(bufs, b)
	}
	a.mu.Unlock()
	if len(bufs) == 0 {
		return nil
	}
	sort.Slice(bufs, func(i, j int) bool { return bufs[i].id < bufs[j].id })
	e := &LeakError{Count: len(bufs)}
	for _, b := range bufs {
		b.mu.Lock()
		l := LeakedBuffer{ID: b.id, Bytes: b.size, Location: b.loc, Label: b.label, Held: b.state == stateFreeing}
		b.mu.Unlock()
		e.Bytes += l.Bytes
		if len(e.Buffers) < 16 {
			e.Buffers = append(e.Buffers, l)
		}
	}
	return e
}
