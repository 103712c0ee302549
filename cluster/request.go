package cluster

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/distbuf/distbuf"
)

// pendingRequests lists every request MPI may still use. Being listed
// keeps a request reachable, and with it the memory it references, even if
// its owner drops it: a dropped request leaks instead of letting the
// garbage collector free a pinned slice MPI still writes into.
var pendingRequests struct {
	mu   sync.Mutex
	head *Request
	n    int
}

func track(r *Request) {
	p := &pendingRequests
	p.mu.Lock()
	r.next = p.head
	if p.head != nil {
		p.head.prev = r
	}
	p.head = r
	p.n++
	p.mu.Unlock()
}

func untrack(r *Request) {
	p := &pendingRequests
	p.mu.Lock()
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		p.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	}
	r.prev, r.next = nil, nil
	p.n--
	p.mu.Unlock()
}

// pendingError describes the requests not yet completed, if any.
func pendingError() error {
	if n := unreceived.Load(); n > 0 {
		return fmt.Errorf("cluster: %d matched messages neither received nor discarded (Message.Recv or Message.Discard them first): %w", n, distbuf.ErrConflict)
	}
	p := &pendingRequests
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		return nil
	}
	var some []string
	for r := p.head; r != nil && len(some) < 3; r = r.next {
		some = append(some, r.describe())
	}
	if p.n > len(some) {
		some = append(some, "...")
	}
	return fmt.Errorf("cluster: %d requests not completed (Wait, Waitall or Await them first): %s: %w",
		p.n, strings.Join(some, "; "), distbuf.ErrConflict)
}

// Request is a pending nonblocking send or receive. It completes when Wait,
// Waitall or Await observes it complete; then what was attached to it is
// released and its memory is no longer referenced. A request is used by one
// call at a time: a second concurrent call (or a request listed twice) gets
// distbuf.ErrConflict rather than a data race inside MPI.
type Request struct {
	impl   reqImpl
	posted bool // made by Isend or Irecv, not a zero Request
	send   bool
	peer   int
	tag    int
	size   int64
	mem    Memory // keeps pinned Go memory reachable until completion

	busy       atomic.Bool
	prev, next *Request // in the pending list while MPI may use the request
	done       bool
	status     Status
	err        error
	holds      []Releaser
	// holdBuf is the storage of holds for the usual one or two releasers
	// (a buffer's hold, a pinned slice), so that Attach allocates nothing
	// on the path every message takes.
	holdBuf [2]Releaser
}

func (r *Request) acquire() error {
	if r == nil {
		return fmt.Errorf("cluster: nil request: %w", distbuf.ErrInvalid)
	}
	if !r.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("cluster: request (%s): %w", r.describe(), distbuf.ErrConflict)
	}
	return nil
}

func (r *Request) unlock() { r.busy.Store(false) }

// checkPosted rejects a Request that no Isend or Irecv made.
func (r *Request) checkPosted() error {
	if !r.posted {
		return fmt.Errorf("cluster: a Request not made by Isend or Irecv: %w", distbuf.ErrInvalid)
	}
	return nil
}

func (r *Request) describe() string {
	if r.send {
		return fmt.Sprintf("send of %d bytes to rank %d, tag %d", r.size, r.peer, r.tag)
	}
	from, tag := fmt.Sprint("rank ", r.peer), fmt.Sprint("tag ", r.tag)
	if r.peer == AnySource {
		from = "any rank"
	}
	if r.tag == AnyTag {
		tag = "any tag"
	}
	return fmt.Sprintf("receive of up to %d bytes from %s, %s", r.size, from, tag)
}

// complete records the result the backend reported and releases what was
// attached. Called with the request acquired, once.
func (r *Request) complete(st Status, err error) {
	if r.send {
		st = Status{Source: -1, Tag: r.tag, Bytes: r.size}
	}
	r.done, r.status, r.mem, r.err = true, st, nil, err
	for _, h := range r.holds {
		if e := h.Release(); e != nil {
			r.err = errors.Join(r.err, fmt.Errorf("cluster: releasing what was attached to a %s: %w", r.describe(), e))
		}
	}
	r.holds = nil
	r.holdBuf = [2]Releaser{}
	untrack(r)
}

// Attach makes the request release h when it completes, for instance the
// *devalloc.Hold (Read for a send, Write for a receive) that keeps the
// buffer from being freed or reused while MPI uses it, or the *PinnedBytes
// that must stay pinned. If the request has already completed, h is
// released now. A Release error is returned by the call that observes the
// completion.
func (r *Request) Attach(h Releaser) error {
	if err := r.acquire(); err != nil {
		return err
	}
	defer r.unlock()
	if h == nil {
		return fmt.Errorf("cluster: Attach(nil): %w", distbuf.ErrInvalid)
	}
	if err := r.checkPosted(); err != nil {
		return err
	}
	if r.done {
		return h.Release()
	}
	if r.holds == nil {
		r.holds = r.holdBuf[:0]
	}
	r.holds = append(r.holds, h)
	return nil
}

// Wait blocks until the request completes and returns its status. A
// receive longer than its buffer returns an error matching distbuf.ErrInvalid.
// Waiting again on a completed request returns the same result.
func (r *Request) Wait() (Status, error) {
	if err := r.acquire(); err != nil {
		return Status{}, err
	}
	defer r.unlock()
	if r.done {
		return r.status, r.err
	}
	if err := enter(); err != nil {
		return Status{}, err
	}
	if err := r.checkPosted(); err != nil {
		exit()
		return Status{}, err
	}
	st, err := backendWait(r)
	exit()
	r.complete(st, err)
	return r.status, r.err
}

// smallBatch is how many requests Waitall and Await handle
// without allocating.
const smallBatch = 16

// acquireAll acquires every non-nil request, or none.
func acquireAll(reqs []*Request) error {
	for i, r := range reqs {
		if r == nil {
			continue
		}
		if err := r.acquire(); err != nil {
			unlockAll(reqs[:i])
			return fmt.Errorf("cluster: request %d: %w", i, err)
		}
	}
	return nil
}

func unlockAll(reqs []*Request) {
	for _, r := range reqs {
		if r != nil {
			r.unlock()
		}
	}
}

// pendingOf appends the requests of reqs not yet complete to pending and,
// when where is not nil, their indices in reqs to where: the callers pass
// arrays on their stacks, so a small batch allocates nothing.
func pendingOf(reqs, pending []*Request, where []int) ([]*Request, []int) {
	for i, r := range reqs {
		if r != nil && !r.done {
			pending = append(pending, r)
			if where != nil {
				where = append(where, i)
			}
		}
	}
	return pending, where
}

// enterPosted enters MPI for a wait on pending, every one of which must
// have been posted; on error it has left MPI again.
func enterPosted(pending []*Request) error {
	if err := enter(); err != nil {
		return err
	}
	for _, r := range pending {
		if err := r.checkPosted(); err != nil {
			exit()
			return err
		}
	}
	return nil
}

// Waitall waits for every request (nil entries are skipped) and returns
// the errors of those that failed, each naming its index. Every request is
// complete when it returns, failed ones included; each one's status comes
// from its Wait, which then returns at once.
func Waitall(reqs []*Request) error {
	if err := acquireAll(reqs); err != nil {
		return err
	}
	defer unlockAll(reqs)
	var pendBuf [smallBatch]*Request
	pending, _ := pendingOf(reqs, pendBuf[:0], nil)
	if n := len(pending); n > 0 {
		if err := enterPosted(pending); err != nil {
			return err
		}
		var stBuf [smallBatch]Status
		var errBuf [smallBatch]error
		sts, errs := stBuf[:0], errBuf[:0]
		if n > smallBatch {
			sts, errs = make([]Status, 0, n), make([]error, 0, n)
		}
		sts, errs = sts[:n], errs[:n]
		backendWaitall(pending, sts, errs)
		exit()
		for i, r := range pending {
			r.complete(sts[i], errs[i])
		}
	}
	// Report the first few failures in full and count the rest: a failed
	// exchange of thousands of requests must stay readable.
	const shown = 4
	var errs []error
	failed := 0
	for i, r := range reqs {
		if r != nil && r.err != nil {
			if failed++; failed <= shown {
				errs = append(errs, fmt.Errorf("cluster: Waitall: request %d: %w", i, r.err))
			}
		}
	}
	if failed > shown {
		errs = append(errs, fmt.Errorf("cluster: Waitall: and %d more failed requests", failed-shown))
	}
	return errors.Join(errs...)
}

// completions holds, on its user's stack for a small batch, the statuses,
// errors and indices of the requests a wait completes.
type completions struct {
	stBuf  [smallBatch]Status
	errBuf [smallBatch]error
	idxBuf [smallBatch]int
}

// slices returns room for n completions: b's arrays when they hold them.
func (b *completions) slices(n int) ([]Status, []error, []int) {
	if n > smallBatch {
		return make([]Status, n), make([]error, n), make([]int, n)
	}
	return b.stBuf[:n], b.errBuf[:n], b.idxBuf[:n]
}
