package cluster

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distbuf/distbuf"
)

// boundedState is a communicator's record of its bounded collectives:
// their numbering, and what the ones that failed left in MPI. It is used
// under mu, one collective at a time.
type boundedState struct {
	mu  sync.Mutex
	seq uint64
	// leftover are requests of collectives that failed, still pending in
	// MPI (a send to a rank that stopped, a receive from a rank that
	// stopped mid-message, a discard): later collectives complete them
	// when MPI does, which lets go of their buffers.
	leftover []*Request
	// late are collectives that failed before every part arrived: a part
	// that arrives later is matched and dropped by a later collective, so
	// that its sender, whose own collective waits until its message is
	// taken, can finish.
	late []lateRound
	// spare is the last round whose buffers no request holds; peers is
	// every rank but this one.
	spare *boundedRound
	peers []int
	spans []span // AlltoallWithin's, reused: no round keeps them past its call
}

// lateRound is a failed collective whose parts from some ranks never
// arrived.
type lateRound struct {
	tag  int
	owed []int // the ranks whose part is still to be dropped
}

// latePoll bounds each wait while late parts may arrive, so that they are
// looked for between the waits of the collective in progress.
const latePoll = time.Millisecond

// tagFor is the MPI tag of collective seq's messages: seq modulo
// MPI_TAG_UB+1, so that a late part of an earlier collective is not
// matched by a later collective's probe.
func tagFor(seq uint64, maxTag int) int { return int(seq % (uint64(maxTag) + 1)) }

// span is one outgoing message: n bytes at off of the send buffer, to peer.
type span struct {
	peer   int
	off, n int64
}

// What each live request of a round is.
const (
	slotLeftover = -1 // a request of an earlier round, not this one's
	slotSend     = -2 // a send of this round
)

// boundedRound is the part of a bounded collective that moves messages.
type boundedRound struct {
	c       *Comm
	h       header
	tag     int
	timeout time.Duration
	stride  int64 // headerBytes + the payload of every received message
	from    []int // the ranks whose part this rank needs, increasing
	slotOf  []int // rank -> index in from, or -1
	matched []bool
	got     []bool
	sendBuf []byte
	recvBuf []byte
	pins    *roundPins // nil until a request outlives a call into MPI
	mem     [2]Memory  // the send and receive buffers as MPI takes them, once pinned

	live     []*Request // posted and not yet seen complete: this round's and leftovers
	liveSlot []int      // for each live request: its slot in from (a receive), slotSend or slotLeftover
	livePeer []int      // for each live request: its peer
	own      int        // how many of live are this round's

	fastRes fastResult // what the C loop left (bounded_fast.go)
}

// roundPins keeps a round's buffers pinned while MPI may use them: the
// round holds one reference and each request posted on them another,
// released when the request is seen complete, so the buffers are let go
// when the last of them is, however late.
type roundPins struct {
	send, recv *PinnedBytes
	refs       atomic.Int32
}

func (p *roundPins) Release() error {
	if p.refs.Add(-1) > 0 {
		return nil
	}
	return errors.Join(p.send.Release(), p.recv.Release())
}

// pin pins the round's buffers for requests that outlive a call into MPI
// (the C loop needs none for the rounds it completes: the buffers are
// referenced for the whole call).
func (r *boundedRound) pin() {
	if r.pins != nil {
		return
	}
	r.pins = &roundPins{send: PinBytes(r.sendBuf), recv: PinBytes(r.recvBuf)}
	r.pins.refs.Store(1)
	r.mem = [2]Memory{r.pins.send, r.pins.recv}
}

// attach makes req hold a reference to the pins.
func (p *roundPins) attach(req *Request) error {
	p.refs.Add(1)
	return req.Attach(p)
}

// runBounded runs one bounded collective: it stamps the header into each
// message of sendBuf (each span starts with headerBytes for it), sends
// them, and receives from each rank of from a message of headerBytes+payload
// bytes. It returns the received messages, one stride apart in the order
// of from. c is entered and its bounded state locked by the caller.
func (c *Comm) runBounded(op collOp, arg uint32, timeout time.Duration, sendBuf []byte, sends []span, from []int, payload int64) ([]byte, error) {
	c.bounded.seq++
	r := c.bounded.takeRound()
	*r = boundedRound{
		c:        c,
		h:        header{seq: c.bounded.seq, op: op, arg: arg},
		tag:      tagFor(c.bounded.seq, state.maxTag),
		timeout:  timeout,
		stride:   headerBytes + payload,
		from:     from,
		slotOf:   resize(r.slotOf, c.size),
		matched:  resize(r.matched, len(from)),
		got:      resize(r.got, len(from)),
		recvBuf:  resize(r.recvBuf, int(int64(len(from))*(headerBytes+payload))),
		live:     r.live[:0],
		liveSlot: r.liveSlot[:0],
		livePeer: r.livePeer[:0],
	}
	for i := range r.slotOf {
		r.slotOf[i] = -1
	}
	for i, p := range from {
		r.slotOf[p] = i
	}
	for _, s := range sends {
		r.h.put(sendBuf[s.off:])
	}
	r.sendBuf = sendBuf
	for _, req := range c.bounded.leftover {
		r.add(req, slotLeftover, -1)
	}
	c.bounded.leftover = nil

	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	err := r.exchange(sends, deadline)
	if err != nil && !errors.Is(err, ErrTimeout) {
		r.drain(deadline)
	}
	if err != nil {
		var owed []int
		for i, p := range r.from {
			if !r.matched[i] {
				owed = append(owed, p)
			}
		}
		if len(owed) > 0 {
			c.bounded.late = append(c.bounded.late, lateRound{tag: r.tag, owed: owed})
		}
	}
	c.bounded.leftover = r.live
	if r.pins != nil {
		_ = r.pins.Release()
	} else if len(r.live) == 0 {
		// Nothing of MPI refers to its buffers: the next round may use
		// them once the caller, holding the lock, has read this one's.
		defer func() { c.bounded.spare = r }()
	}
	if err != nil {
		return nil, err
	}
	return r.recvBuf, nil
}

// takeRound is the spare round of the last collective whose buffers no
// request holds, to be reused, or a new one.
func (s *boundedState) takeRound() *boundedRound {
	r := s.spare
	s.spare = nil
	if r == nil {
		r = new(boundedRound)
	}
	return r
}

// sendScratch is n zeroed bytes for a collective's send buffer: the spare
// round's, when it has room, which that round then sends from.
func (s *boundedState) sendScratch(n int64) []byte {
	if s.spare != nil && int64(cap(s.spare.sendBuf)) >= n {
		b := s.spare.sendBuf[:n]
		clear(b)
		return b
	}
	return make([]byte, n)
}

// resize is s with n zeroed elements, reusing its storage when it has room.
func resize[T any](s []T, n int) []T {
	s = slices.Grow(s[:0], n)[:n]
	clear(s)
	return s
}

func (r *boundedRound) name() string { return fmt.Sprintf("%v #%d", r.h.op, r.h.seq) }

func (r *boundedRound) add(req *Request, slot, peer int) {
	r.live, r.liveSlot, r.livePeer = append(r.live, req), append(r.liveSlot, slot), append(r.livePeer, peer)
	if slot != slotLeftover {
		r.own++
	}
}

// exchange posts the sends and waits for every part until the deadline
// (none when zero).
func (r *boundedRound) exchange(sends []span, deadline time.Time) error {
	ctl := r.c.ctl
	expect := len(r.from)
	if r.fastEligible(sends) {
		matched, m, err := r.fast(sends, deadline)
		if m != nil {
			// Every part it could take was taken: this one is not the
			// round's, and is dropped and reported.
			err = errors.Join(err, r.matchedMessage(m))
		}
		if err != nil {
			return err
		}
		expect -= matched
	} else {
		r.pin()
		for _, s := range sends {
			req, err := ctl.Isend(Sub(r.mem[0], s.off, s.n), s.peer, r.tag)
			if err == nil {
				err = r.pins.attach(req)
			}
			if err != nil {
				return fmt.Errorf("cluster: %s: sending to rank %d: %w", r.name(), s.peer, err)
			}
			r.add(req, slotSend, s.peer)
		}
	}
	probe := &Probe{Comm: ctl, Source: AnySource, Tag: r.tag}
	var done []int
	for expect > 0 || r.own > 0 {
		p := probe
		if expect == 0 {
			p = nil
		}
		wait := until(deadline)
		if len(r.c.bounded.late) > 0 && (wait < 0 || wait > latePoll) {
			wait = latePoll
		}
		var m *Message
		var err error
		done, m, err = Await(r.live, done[:0], p, wait)
		if err != nil {
			return fmt.Errorf("cluster: %s: %w", r.name(), err)
		}
		stale, err := r.completed(done)
		expect += stale
		if err != nil {
			return err
		}
		if m != nil {
			if err := r.matchedMessage(m); err != nil {
				return err
			}
			expect--
		}
		if err := r.dropLate(); err != nil {
			return err
		}
		if len(done) == 0 && m == nil && !deadline.IsZero() && !time.Now().Before(deadline) {
			return r.timedOut()
		}
	}
	return nil
}

// until is Await's timeout for a wait that ends at deadline: negative
// (no limit) for a zero deadline.
func until(deadline time.Time) time.Duration {
	if deadline.IsZero() {
		return -1
	}
	return max(time.Until(deadline), 0)
}

// drainGrace bounds how long a collective that failed for a reason other
// than its deadline waits for its requests already posted.
const drainGrace = time.Second

// drain waits, for a short while, for the requests this round posted
// before it failed (its ranks disagree): what does not complete in time
// is left to later collectives.
func (r *boundedRound) drain(deadline time.Time) {
	end := time.Now().Add(drainGrace)
	if !deadline.IsZero() && deadline.Before(end) {
		end = deadline
	}
	var done []int
	for r.own > 0 {
		wait := time.Until(end)
		if wait <= 0 {
			return
		}
		var err error
		if done, _, err = Await(r.live, done[:0], nil, wait); err != nil {
			return
		}
		_, _ = r.completed(done)
	}
}

// completed handles the requests Await saw complete (indices into live)
// and drops them from live. It returns how many received parts were
// stale: left over from an earlier collective whose tag this one reuses
// (after MPI_TAG_UB+1 collectives), so that their senders' parts are still
// to come.
func (r *boundedRound) completed(done []int) (stale int, err error) {
	if len(done) == 0 {
		return 0, nil
	}
	for _, i := range done {
		req, slot, peer := r.live[i], r.liveSlot[i], r.livePeer[i]
		st, werr := req.Wait()
		if slot != slotLeftover {
			r.own--
		}
		switch {
		case slot == slotLeftover:
		case werr != nil:
			if err == nil {
				err = fmt.Errorf("cluster: %s: rank %d: %w", r.name(), peer, werr)
			}
		case slot == slotSend:
		default:
			h := readHeader(r.recvBuf[int64(slot)*r.stride:])
			if h.seq != r.h.seq {
				r.matched[slot] = false
				stale++
				continue
			}
			if e := r.checkHeader(st.Source, h); e != nil && err == nil {
				err = e
			}
			r.got[slot] = true
		}
	}
	keep := 0
	for i := range r.live {
		if _, found := slices.BinarySearch(done, i); found {
			continue
		}
		r.live[keep], r.liveSlot[keep], r.livePeer[keep] = r.live[i], r.liveSlot[i], r.livePeer[i]
		keep++
	}
	clear(r.live[keep:])
	r.live, r.liveSlot, r.livePeer = r.live[:keep], r.liveSlot[:keep], r.livePeer[:keep]
	return stale, err
}

// checkHeader compares a part's header with this rank's collective.
func (r *boundedRound) checkHeader(source int, h header) error {
	switch {
	case h.op != r.h.op:
		return fmt.Errorf("cluster: %s: rank %d is in %v #%d: the ranks called different collectives: %w",
			r.name(), source, h.op, h.seq, distbuf.ErrInvalid)
	case h.arg != r.h.arg:
		return fmt.Errorf("cluster: %s: rank %d called it with %s, this rank with %s: %w",
			r.name(), source, describeArg(h.op, h.arg), describeArg(r.h.op, r.h.arg), distbuf.ErrInvalid)
	}
	return nil
}

// describeArg shows a header's argument as the call's arguments.
func describeArg(op collOp, arg uint32) string {
	switch op {
	case opBcast:
		return fmt.Sprintf("root %d", arg)
	case opAllreduce:
		kind := "int64"
		if arg&0xff == allreduceFloat64 {
			kind = "float64"
		}
		return fmt.Sprintf("operator %v on %s", Op(arg>>8), kind)
	}
	return fmt.Sprintf("argument %d", arg)
}

// matchedMessage takes a message the probe matched: the part of a rank
// this rank waits for is received into its slot; anything else is
// dropped and reported, since a rank that sends this rank a part it does
// not expect in this collective disagrees about the call.
func (r *boundedRound) matchedMessage(m *Message) error {
	st := m.Status()
	slot := -1
	if st.Source >= 0 && st.Source < len(r.slotOf) {
		slot = r.slotOf[st.Source]
	}
	if slot < 0 || r.matched[slot] || st.Bytes != r.stride {
		why := fmt.Sprintf("sent %d bytes, want %d: every rank must pass the same length", st.Bytes, r.stride)
		if slot < 0 || r.matched[slot] {
			why = fmt.Sprintf("sent a part this rank does not expect (%d bytes): the ranks passed different roots or called different collectives", st.Bytes)
		}
		if req, err := m.Discard(); err == nil {
			r.add(req, slotLeftover, st.Source)
		}
		return fmt.Errorf("cluster: %s: rank %d %s: %w", r.name(), st.Source, why, distbuf.ErrInvalid)
	}
	r.pin()
	req, err := m.Recv(Sub(r.mem[1], int64(slot)*r.stride, r.stride))
	if err == nil {
		err = r.pins.attach(req)
	}
	if err != nil {
		return fmt.Errorf("cluster: %s: receiving from rank %d: %w", r.name(), st.Source, err)
	}
	r.matched[slot] = true
	r.add(req, slot, st.Source)
	return nil
}

// dropLate matches and drops one late part of each failed collective, if
// one has arrived.
func (r *boundedRound) dropLate() error {
	late := r.c.bounded.late
	kept := late[:0]
	for _, lr := range late {
		_, m, err := Await(nil, nil, &Probe{Comm: r.c.ctl, Source: AnySource, Tag: lr.tag}, 0)
		if err != nil {
			return fmt.Errorf("cluster: %s: looking for late parts of an earlier collective: %w", r.name(), err)
		}
		if m != nil {
			src := m.Status().Source
			if req, err := m.Discard(); err == nil {
				r.add(req, slotLeftover, src)
			}
			lr.owed = slices.DeleteFunc(lr.owed, func(p int) bool { return p == src })
		}
		if len(lr.owed) > 0 {
			kept = append(kept, lr)
		}
	}
	clear(late[len(kept):])
	r.c.bounded.late = kept
	return nil
}

// timedOut records and returns the timeout: the ranks whose part has not
// arrived whole and those that have not taken this rank's.
func (r *boundedRound) timedOut() error {
	var missing []int
	for i, p := range r.from {
		if !r.got[i] {
			missing = append(missing, p)
		}
	}
	for i, slot := range r.liveSlot {
		if p := r.livePeer[i]; slot == slotSend && !slices.Contains(missing, p) {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	world := make([]int, len(missing))
	for i, p := range missing {
		world[i] = r.c.worldRanks[p]
	}
	e := &TimeoutError{Op: r.h.op.String(), Seq: r.h.seq, Timeout: r.timeout, Rank: r.c.rank, Size: r.c.size,
		Missing: missing, WorldMissing: world}
	stalls.record(r.c, e)
	return e
}

// stalls are the communicators whose last bounded collective timed out:
// until a later one completes on the same communicator (every rank
// having taken part), a rank it did not hear from may be stopped, and
// Finalize, which waits for every rank, would wait for ever.
var stalls stallSet

type stallSet struct {
	mu   sync.Mutex
	open map[*Comm]*TimeoutError
	// any is whether open may have an entry: every completed collective
	// resolves, and it need not take the lock when nothing timed out.
	any atomic.Bool
}

func (s *stallSet) record(c *Comm, e *TimeoutError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open == nil {
		s.open = map[*Comm]*TimeoutError{}
	}
	s.open[c] = e
	s.any.Store(true)
}

func (s *stallSet) resolve(c *Comm) {
	if !s.any.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, c)
	s.any.Store(len(s.open) > 0)
}

// stallError is the unresolved timeout Finalize reports, if any.
func stallError() error {
	stalls.mu.Lock()
	defer stalls.mu.Unlock()
	for _, e := range stalls.open {
		return fmt.Errorf("cluster: Finalize waits for every rank, and a bounded collective did not hear from some: %w", e)
	}
	return nil
}
