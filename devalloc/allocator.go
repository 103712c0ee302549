package devalloc

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/bytesize"
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
	// OnOutOfMemory is step 3 of the out-of-memory ladder: it receives the
	// report so far (Retries counts the retries made, Cause is the last
	// failure), may free memory, and returns true to ask for another
	// attempt; it is called at most 8 times per Alloc. It is called without
	// any allocator lock held, so it may call any method, Free and Close
	// included.
	OnOutOfMemory func(report *OutOfMemoryError) (retry bool)
	// Warn receives warnings such as the reason for a fallback. Nil writes
	// them to standard error: a fallback is never silent.
	Warn func(msg string)
}

// Info describes an allocator: the backend it runs on and the
// configuration in effect. Reading it makes no driver call.
type Info struct {
	// Backend is the backend in use: BackendCUDA or BackendHost.
	Backend Backend
	// Pool is true when the CUDA backend allocates from its private
	// stream-ordered pool, and false on its cudaMalloc fallback and on the
	// host backend.
	Pool bool
	// Device is the CUDA device ordinal the allocator was opened on.
	Device int
	// Description names the backend and device in words, for logs.
	Description string
	// FallbackReason says why the allocator is not on the backend (or the
	// CUDA allocator) asked for; empty when it is.
	FallbackReason string
	// Config is the configuration in effect, its Policy the one now in
	// force (SetPolicy changes it).
	Config Config
	// Limit is the per-rank budget in bytes, Config's resolved at Open; 0
	// means none.
	Limit int64
	// TotalMemory is the device's (or the host's) memory in bytes, as
	// reported at Open; -1 when unknown.
	TotalMemory int64
}

// maxCallbackRetries bounds the callback step so a callback that always asks
// for a retry without freeing anything cannot spin forever.
const maxCallbackRetries = 8

// Allocator is one rank's memory manager on one device. It is safe for
// concurrent use.
type Allocator struct {
	be     backend
	kindV  backendKind
	total  int64    // the backend's total memory at Open; -1 if unknown
	loc    Location // of the buffers Alloc returns
	device int
	cfg    Config
	limit  int64
	reason string
	onOOM  func(*OutOfMemoryError) bool
	warn   func(string)
	policy atomic.Int32
	budget atomic.Int64 // with a limit: aligned bytes of live and held-for-free buffers
	// Auto's state: the headroom it keeps free, the largest request its
	// growth check has looked at, the largest reservation it has seen (an
	// allocation that takes the pool past it grew the pool), the last
	// phase's working set (ledgerCounts.phaseUsedPeak at its end), and how
	// many phases in a row have needed no more than the one before.
	headroom      int64
	autoLargest   atomic.Int64
	autoReserved  atomic.Int64
	lastPhaseUsed atomic.Int64
	steadyPhases  atomic.Int32
	lastLook      atomic.Int64 // when EndPhase last read the pool and the device (unix nanoseconds)
	defaultS      *Stream
	reclaim       *Stream
	pinned        pinnedPool

	// The close guard: every operation counts itself in inflight for its
	// duration; Close sets closed, then waits for the operations in flight
	// to drain (inFlight).
	inflight atomic.Int64 // entered less exited, but for n.exits
	closed   atomic.Bool
	drained  chan struct{} // a token when inFlight reaches 0 after closed is set

	mu      sync.Mutex
	streams map[*Stream]struct{}
	// live holds the buffers not yet released, each in its slot
	// (Buffer.slot); free lists the empty slots, the last freed on top, so
	// that an Alloc after a Free writes where the Free did.
	live []*Buffer
	free []uint32
	n    ledgerCounts

	c counters
}

// ledgerCounts are the counters kept with the live buffers, under the
// allocator's mu: one lock per Alloc and per Free for all of them.
type ledgerCounts struct {
	nextID                                      uint64
	exits                                       int64 // of Allocs, which end under mu (exitLocked)
	liveBuffers, allocCalls, backendCalls       int64
	frees                                       int64
	requestedCur, requestedPeak, requestedTotal int64
	used                                        int64 // aligned bytes of live and held-for-free device buffers
	phaseUsedPeak                               int64 // used's high-water mark since the last EndPhase, for Auto
}

// counters are the ones updated away from Alloc and Free.
type counters struct {
	backendCalls                 atomic.Int64 // failed attempts and priming
	trims, oomRetries, fallbacks atomic.Int64
	ledgerEvents                 atomic.Int64
	waitsSkipped                 atomic.Int64
	hostWaitsSkipped             atomic.Int64
	heldFrees                    atomic.Int64
}

// Open creates an allocator on the backend chosen by Options and the
// environment. With BackendAuto it uses CUDA when a usable GPU is present and
// otherwise the host backend, reporting why through Warn and
// Info.FallbackReason. A bad configuration matches distbuf.ErrBadConfig, a
// CUDA backend asked for and not usable distbuf.ErrUnavailable.
func Open(opts Options) (*Allocator, error) {
	choice, err := resolveBackend(opts.Backend)
	if err != nil {
		return nil, err
	}
	cfg, cfgSource, err := resolveConfig(opts.Config)
	if err != nil {
		return nil, err
	}
	if opts.Device < 0 {
		return nil, &configError{source: "Options", key: "Device", value: fmt.Sprint(opts.Device), reason: "must not be negative"}
	}
	a := &Allocator{
		device:  opts.Device,
		cfg:     cfg,
		onOOM:   opts.OnOutOfMemory,
		warn:    opts.Warn,
		streams: make(map[*Stream]struct{}),
		drained: make(chan struct{}, 1),
	}
	if a.warn == nil {
		a.warn = func(msg string) { fmt.Fprintln(os.Stderr, "distbuf:", msg) }
	}
	switch choice {
	case BackendHost:
		if a.be, err = newHostBackend(); err != nil {
			return nil, err
		}
	case BackendCUDA, BackendAuto:
		cudaErr := fmt.Errorf("CUDA backend not compiled in (build with cgo): %w", distbuf.ErrUnavailable)
		if openCUDA != nil {
			a.be, cudaErr = openCUDA(opts.Device, cfg)
		}
		if cudaErr != nil {
			if choice == BackendCUDA {
				return nil, fmt.Errorf("devalloc: open cuda backend on device %d: %w", opts.Device, cudaErr)
			}
			if a.be, err = newHostBackend(); err != nil {
				return nil, err
			}
			a.reason = "auto: using host backend because CUDA is unavailable: " + cudaErr.Error()
		}
	}
	if a.be.kind() == kindCUDAMalloc {
		a.reason = "cuda: stream-ordered pool not used, falling back to cudaMalloc"
		if cfg.NoPool {
			a.reason += " (pool:off)"
		}
	}
	if a.reason != "" {
		a.c.fallbacks.Add(1)
		a.warn(a.reason)
	}
	if err := a.init(cfgSource); err != nil {
		_ = a.be.close()
		return nil, err
	}
	return a, nil
}

func (a *Allocator) init(cfgSource string) error {
	a.kindV = a.be.kind()
	a.loc = OnDevice
	if a.kindV == kindHost {
		a.loc = OnHost
	}
	_, total := a.be.memInfo()
	a.total = total
	a.limit = a.cfg.resolveLimit(total)
	if c := a.cfg; c.Limit == 0 && c.LimitFraction > 0 && a.limit < allocAlign {
		reason := fmt.Sprintf("resolves to %d bytes of %s, less than one allocation (%d B)", a.limit, bytesize.Format(total), allocAlign)
		if total <= 0 {
			reason = "a percentage needs the total memory, which the backend cannot report: give a size"
		}
		return &configError{source: cfgSource, key: "limit", value: c.limitString(), reason: reason}
	}
	a.headroom = a.cfg.resolveHeadroom(total)
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
	// Nothing is allocated on the reclamation stream: a backend that keeps
	// freed blocks for the next allocation on their stream keeps those freed
	// there for every stream, once their frees have run.
	if k, ok := r.(interface{ keepForAll() }); ok {
		k.keepForAll()
	}
	a.reclaim = &Stream{a: a, impl: r, id: -1}
	a.pinned.init(a)
	if n := a.cfg.resolvePrime(total, a.kindV == kindCUDAPool, a.cfg.Policy); n > 0 {
		if err := a.prime(n); err != nil {
			return err
		}
	}
	// What the prime reserved is no growth for Auto to react to.
	a.autoReserved.Store(a.be.reserved())
	return nil
}

// enter guards an operation against a concurrent Close: Close waits for
// every operation that entered before it to exit, and later ones fail.
// Unlike a lock, it never makes an operation wait, so an operation may
// enter again while in flight (an out-of-memory callback that frees).
func (a *Allocator) enter() error {
	a.inflight.Add(1)
	if a.closed.Load() {
		a.exit()
		return fmt.Errorf("devalloc: allocator: %w", distbuf.ErrClosed)
	}
	return nil
}

// lockedEnter is the close guard of an operation that does all its work
// with the lock of a live buffer held (Free, Stream.Memset, Stream.Copy):
// it checks closed under that lock instead of counting itself in inflight,
// which spares the hot path two atomic read-modify-writes. Close, once
// closed is set and inflight has drained, locks every buffer in a.live
// (leaks), so it waits for such an operation already past its check, and
// one that takes the lock after Close did sees closed. A buffer leaves
// a.live only under its lock, once its free is enqueued: nothing of a Free
// reaches the backend after that.
func (a *Allocator) lockedEnter() error {
	if a.closed.Load() {
		return fmt.Errorf("devalloc: allocator: %w", distbuf.ErrClosed)
	}
	return nil
}

func (a *Allocator) exit() {
	a.inflight.Add(-1)
	if a.closed.Load() {
		a.mu.Lock()
		a.signalDrainedLocked()
		a.mu.Unlock()
	}
}

// exitLocked is exit for an operation that ends with a.mu held, as Alloc
// does when it counts the new buffer: a count under the lock in place of
// an atomic read-modify-write.
func (a *Allocator) exitLocked() {
	a.n.exits++
	if a.closed.Load() {
		a.signalDrainedLocked()
	}
}

// inFlight is the number of operations between enter and exit.
func (a *Allocator) inFlight() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inflight.Load() - a.n.exits
}

// signalDrainedLocked gives Close its token when nothing is in flight; an
// exit that races with Close's look either is seen by it or looks after.
func (a *Allocator) signalDrainedLocked() {
	if a.inflight.Load() == a.n.exits {
		select {
		case a.drained <- struct{}{}:
		default:
		}
	}
}

// Info describes the allocator. It works after Close too.
func (a *Allocator) Info() Info {
	backend := BackendCUDA
	if a.kindV == kindHost {
		backend = BackendHost
	}
	cfg := a.cfg
	cfg.Policy = a.policyNow()
	return Info{
		Backend: backend, Pool: a.kindV == kindCUDAPool, Device: a.device,
		Description: a.be.describe(), FallbackReason: a.reason,
		Config: cfg, Limit: a.limit, TotalMemory: a.total,
	}
}

// MemInfo reports the device's free and total memory now
// (cudaMemGetInfo; on the host backend the memory DISTBUF_HOST_MEMORY gives
// it, else the machine's), -1 for what the backend cannot say. Free memory
// is what no pool holds: memory this allocator's pool keeps unused is not
// free, though its allocations can use it.
func (a *Allocator) MemInfo() (free, total int64) { return a.be.memInfo() }

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
		return fmt.Errorf("devalloc: nil stream: %w", distbuf.ErrInvalid)
	}
	if s.a != a {
		return fmt.Errorf("devalloc: stream %d belongs to another allocator: %w", s.id, distbuf.ErrInvalid)
	}
	if s.closed.Load() {
		return fmt.Errorf("devalloc: stream %d: %w", s.id, distbuf.ErrClosed)
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
// *OutOfMemoryError matching distbuf.ErrOutOfMemory.
func (a *Allocator) Alloc(size int64, s *Stream) (*Buffer, error) {
	if err := a.enter(); err != nil {
		return nil, err
	}
	if size <= 0 || size > maxAlloc {
		a.exit()
		return nil, fmt.Errorf("devalloc: alloc of %d bytes: size must be in [1, 2^50]: %w", size, distbuf.ErrInvalid)
	}
	if err := a.checkStream(s); err != nil {
		a.exit()
		return nil, err
	}
	aligned := alignUp(size, allocAlign)
	addr, hostPtr, err := a.tryAlloc(aligned, s)
	if err != nil {
		// The ladder may leave the guard for the callback; it returns
		// having entered again, or with an error.
		if addr, hostPtr, err = a.allocWithLadder(size, aligned, s, err); err != nil {
			return nil, err
		}
	}
	if aligned >= autoCheckMin && aligned > a.autoLargest.Load() && a.policyNow() == Auto {
		a.autoLargest.Store(aligned)
		a.autoAfterLarge(aligned)
	}
	return a.newBuffer(size, addr, hostPtr, a.loc, 0, s), nil
}

// Auto looks at the pool after an allocation of at least autoCheckMin
// bytes that is larger than any it has looked at: where a working set grows
// (each step's largest buffer is a new one), never the tail's small
// allocations nor the same sizes again, so a run at a fixed size pays
// nothing once its largest buffer has been seen.
const autoCheckMin = 1 << 20

// autoAfterLarge is Auto's growth check. A new largest allocation that took
// the reservation past the largest seen grew the pool although it may hold
// unused memory, which then did not fit the request: memory kept for an
// earlier, smaller working set. When the device is tight that memory is
// given back at once, so that another rank on the device, whose own pool
// cannot reclaim it, finds it free, as it would under AggressiveFree; when
// the device has room it stays, as under Retain.
//
// The new buffer (aligned bytes) is not yet among the used bytes.
func (a *Allocator) autoAfterLarge(aligned int64) {
	r := a.be.reserved()
	if r <= a.autoReserved.Load() {
		return
	}
	a.autoReserved.Store(r)
	if !a.tight(r - aligned) {
		return
	}
	a.c.trims.Add(1)
	if a.be.releaseUnused() == nil {
		a.autoReserved.Store(a.be.reserved())
	}
}

// tight reports whether less device memory is free than the larger of the
// headroom and the pool's unused reservation (reserved bytes r less those
// of live buffers): keeping the unused memory would then leave the rest of
// the device, another rank's pool included, less room than this pool sits on.
func (a *Allocator) tight(r int64) bool {
	free, _ := a.be.memInfo()
	if free < 0 {
		return false
	}
	return free < max(a.headroom, 2*(r-a.used()))
}

// newBuffer makes the Buffer of a successful allocation and puts it among
// the live buffers; Alloc's counts are taken under the same lock, and the
// allocation exits the close guard there.
func (a *Allocator) newBuffer(size int64, addr uintptr, hostPtr unsafe.Pointer, loc Location, pinnedClass int, s *Stream) *Buffer {
	b := &Buffer{
		allocStream: s, size: size, addr: addr, hostPtr: hostPtr, loc: uint8(loc), pinnedClass: uint8(pinnedClass),
	}
	n := &a.n
	a.mu.Lock()
	// A device allocation is ordered on s: its first writer is s's mark,
	// an event only if another stream or a hold must wait for it. Pinned
	// memory is handed out only once its last use has completed (the
	// pool's guard), so it has no first writer to wait for.
	if loc != Pinned {
		b.writer = s.takeMarkLocked()
	}
	n.nextID++
	b.id = n.nextID
	if k := len(a.free); k > 0 {
		b.slot = a.free[k-1]
		a.free = a.free[:k-1]
		a.live[b.slot] = b
	} else {
		b.slot = uint32(len(a.live))
		a.live = append(a.live, b)
	}
	n.liveBuffers++
	if loc != Pinned {
		n.allocCalls++
		n.backendCalls++
		n.used += b.aligned()
		n.phaseUsedPeak = max(n.phaseUsedPeak, n.used)
		n.requestedCur += size
		n.requestedTotal += size
		n.requestedPeak = max(n.requestedPeak, n.requestedCur)
	}
	a.exitLocked()
	a.mu.Unlock()
	return b
}

// noteFree takes Free's counts for a buffer whose release waits for a hold.
func (a *Allocator) noteFree(b *Buffer) {
	if Location(b.loc) == Pinned {
		return
	}
	a.mu.Lock()
	a.n.frees++
	a.n.requestedCur -= b.size
	a.mu.Unlock()
}

// noteReleased takes b out of the live buffers once its free is
// enqueued, with Free's counts when freeing, and drops its writer: under
// the same lock when the writer stands on its stream's current mark (the
// usual case), else just before: the writer's release may reach the
// backend, which must not happen once b is out (lockedEnter).
func (a *Allocator) noteReleased(b *Buffer, freeing bool) {
	pinned := Location(b.loc) == Pinned
	if !pinned && a.limit > 0 {
		a.budget.Add(-b.aligned())
	}
	n := &a.n
	a.mu.Lock()
	if w := b.writer; w.s != nil && w.s.a == a && w.s.dropCurrentLocked(w.epoch) {
		b.writer = entry{}
	} else if w.s != nil || w.c != nil {
		a.mu.Unlock()
		w.release()
		b.writer = entry{}
		a.mu.Lock()
	}
	a.live[b.slot] = nil
	a.free = append(a.free, b.slot)
	n.liveBuffers--
	if !pinned {
		n.used -= b.aligned()
		if freeing {
			n.frees++
			n.requestedCur -= b.size
		}
	}
	a.mu.Unlock()
}

// used is the aligned bytes of live and held-for-free buffers.
func (a *Allocator) used() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n.used
}

// tryAlloc asks the backend once, within the budget.
func (a *Allocator) tryAlloc(aligned int64, s *Stream) (uintptr, unsafe.Pointer, error) {
	if a.limit > 0 {
		if a.budget.Add(aligned) > a.limit {
			a.budget.Add(-aligned)
			return 0, nil, errBudget
		}
	}
	addr, ptr, err := a.be.alloc(aligned, s.impl)
	if err != nil {
		a.c.backendCalls.Add(1)
		if a.limit > 0 {
			a.budget.Add(-aligned)
		}
	}
	return addr, ptr, err
}

// allocWithLadder climbs the out-of-memory ladder after the first attempt
// failed with err. Called inside the guard; it returns inside it on
// success, and outside it on failure.
func (a *Allocator) allocWithLadder(size, aligned int64, s *Stream, err error) (uintptr, unsafe.Pointer, error) {
	oom := func(err error) bool { return err == errBudget || errors.Is(err, distbuf.ErrOutOfMemory) }
	if !oom(err) {
		a.exit()
		return 0, nil, fmt.Errorf("devalloc: alloc of %s: %w", bytesize.Format(size), err)
	}
	retries := 0
	retry := func() (uintptr, unsafe.Pointer, error) {
		retries++
		a.c.oomRetries.Add(1)
		return a.tryAlloc(aligned, s)
	}
	// 1. Synchronise: pending frees complete and return memory to the pool.
	if a.drainFrees() == nil {
		addr, ptr, rerr := retry()
		if rerr == nil {
			return addr, ptr, nil
		}
		err = rerr
	}
	// 2. Trim: give cached memory back so the driver can satisfy the request
	// from a fresh, unfragmented reservation.
	if oom(err) && a.trimNow(0) == nil {
		addr, ptr, rerr := retry()
		if rerr == nil {
			return addr, ptr, nil
		}
		err = rerr
	}
	// 3. The user's callback may free memory. It runs outside the guard, so
	// that it may call anything, Close included.
	for attempt := 1; oom(err) && a.onOOM != nil && attempt <= maxCallbackRetries; attempt++ {
		report := a.oomReport(size, retries, err)
		a.exit()
		again := a.onOOM(report)
		if eerr := a.enter(); eerr != nil {
			return 0, nil, fmt.Errorf("devalloc: alloc of %s: closed during the out-of-memory callback: %w", bytesize.Format(size), eerr)
		}
		if !again {
			break
		}
		_ = a.drainFrees()
		addr, ptr, rerr := retry()
		if rerr == nil {
			return addr, ptr, nil
		}
		err = rerr
	}
	defer a.exit()
	if !oom(err) {
		return 0, nil, fmt.Errorf("devalloc: alloc of %s: %w", bytesize.Format(size), err)
	}
	return 0, nil, a.oomReport(size, retries, err)
}

// oomReport is the out-of-memory report of a request of size bytes after
// retries attempts, the last of which failed with cause.
func (a *Allocator) oomReport(size int64, retries int, cause error) *OutOfMemoryError {
	free, total := a.be.memInfo()
	return &OutOfMemoryError{
		Requested: size, Limit: a.limit, Used: a.used(), Reserved: a.be.usage().reservedCur,
		Free: free, Total: total, Retries: retries, Cause: cause,
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

// policyNow is the retention policy in effect.
func (a *Allocator) policyNow() Policy { return Policy(a.policy.Load()) }

// SetPolicy switches the retention policy while running. Switching to
// AggressiveFree releases unused pool memory above the free threshold now.
func (a *Allocator) SetPolicy(p Policy) error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	if p != Auto && p != Retain && p != AggressiveFree {
		return fmt.Errorf("devalloc: set policy %v: %w", p, distbuf.ErrInvalid)
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
	if !p.retains() {
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
// the driver; under Retain it does nothing. Under Auto it reads the pool's
// reservation and the device's free memory (no wait) and does what
// AggressiveFree does when less than the headroom is free, or when the
// device is tight and the working set has not yet held still for
// autoSteadyPhases phases (the peak bytes of live buffers no larger than
// the phase before's: while it grows, what the pool keeps is the wrong size
// for the next); otherwise nothing, so a run whose phases need the same
// memory keeps it once they have shown they do.
func (a *Allocator) EndPhase() error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	switch a.policyNow() {
	case AggressiveFree:
		return a.trimNow(a.cfg.FreeThreshold)
	case Auto:
		return a.autoEndPhase()
	}
	return nil
}

// autoSteadyPhases is how many phases in a row must need no more of the
// pool than the one before for Auto to keep its memory on a tight device:
// two, so that the common growing run, two solves at each size, counts as
// growing, and a run at one size keeps its memory from its third phase on.
const autoSteadyPhases = 2

// autoLookEvery is how often Auto reads the pool and the device at phase
// ends once the phases hold still.
const autoLookEvery = 100 * time.Millisecond

func (a *Allocator) autoEndPhase() error {
	a.mu.Lock()
	peak := a.n.phaseUsedPeak
	a.n.phaseUsedPeak = a.n.used
	a.mu.Unlock()
	last := a.lastPhaseUsed.Swap(peak)
	steady := a.steadyPhases.Add(1)
	if peak > last+max(largestStep, last/64) {
		steady = 0
		a.steadyPhases.Store(0)
	}
	// Once the phases hold still only the headroom can ask for memory back:
	// look at the device now and then, not at every phase, so that a run at
	// one size pays no driver call for its phase ends.
	now := time.Now().UnixNano()
	if steady >= autoSteadyPhases && now-a.lastLook.Load() < int64(autoLookEvery) {
		return nil
	}
	a.lastLook.Store(now)
	r := a.be.reserved()
	free, _ := a.be.memInfo()
	if free >= 0 && (free < a.headroom || steady < autoSteadyPhases && a.tight(r)) {
		if err := a.trimNow(0); err != nil {
			return err
		}
		r = a.be.reserved()
	}
	a.autoReserved.Store(r)
	return nil
}

// prime reserves bytes in the pool once (Config.Prime).
func (a *Allocator) prime(bytes int64) error {
	if err := a.enter(); err != nil {
		return err
	}
	defer a.exit()
	if bytes <= 0 || bytes > maxAlloc {
		return fmt.Errorf("devalloc: prime %d bytes: size must be in [1, 2^50]: %w", bytes, distbuf.ErrInvalid)
	}
	a.c.backendCalls.Add(1)
	if err := a.be.prime(alignUp(bytes, allocAlign), a.defaultS.impl); err != nil {
		return fmt.Errorf("devalloc: prime %s: %w", bytesize.Format(bytes), err)
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
		return fmt.Errorf("devalloc: trim to %d bytes: %w", keepBytes, distbuf.ErrInvalid)
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
		return fmt.Errorf("devalloc: trim to %s: %w", bytesize.Format(keep), err)
	}
	return nil
}

// Close waits for pending frees, destroys the allocator's streams and
// releases its pools. If buffers are still live (or freed but still held by
// an outside agent) it returns a *LeakError listing them; their memory is not
// released; it matches distbuf.ErrLeak. Every later call on the allocator
// returns an error matching distbuf.ErrClosed.
//
// Operations already in flight finish first. Streams waiting for an outside
// agent's hold stop waiting at once, so that Close cannot wait for ever on a
// hold that is never released: the work behind such a wait runs, and the
// stream's next synchronisation (one in flight included) returns an error
// matching distbuf.ErrClosed that says so.
func (a *Allocator) Close() error {
	if a.closed.Swap(true) {
		return fmt.Errorf("devalloc: close: %w", distbuf.ErrClosed)
	}
	a.mu.Lock()
	streams := make([]*Stream, 0, len(a.streams)+1)
	for s := range a.streams {
		streams = append(streams, s)
	}
	a.mu.Unlock()
	streams = append(streams, a.reclaim)
	for _, s := range streams {
		s.impl.abandonHostWaits()
	}
	for a.inFlight() != 0 {
		<-a.drained
	}

	leak := a.leaks()
	var errs []error
	for _, s := range streams[:len(streams)-1] {
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
	var bufs []*Buffer
	for _, b := range a.live {
		if b != nil {
			bufs = append(bufs, b)
		}
	}
	a.mu.Unlock()
	sort.Slice(bufs, func(i, j int) bool { return bufs[i].id < bufs[j].id })
	e := &LeakError{}
	for _, b := range bufs {
		// The lock waits for a Free or a Memset in flight (lockedEnter).
		b.mu.Lock()
		freed := b.state == stateFreed
		l := LeakedBuffer{ID: b.id, Bytes: b.size, Location: Location(b.loc), Held: b.state == stateFreeing}
		b.mu.Unlock()
		if freed {
			continue // freed while Close began
		}
		e.Count++
		e.Bytes += l.Bytes
		if len(e.Buffers) < 16 {
			e.Buffers = append(e.Buffers, l)
		}
	}
	if e.Count == 0 {
		return nil
	}
	return e
}
