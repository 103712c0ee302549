package cluster

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/distbuf/distbuf"
)

// Message is a message matched by Await: MPI has taken it out
// of the queue of messages waiting to be received (MPI_Improbe), so no
// other receive can take it, and its length is known before any memory is
// offered for it. Exactly one of Recv or Discard must then be called: until
// then the sender's request may not complete, and Finalize refuses
// (distbuf.ErrConflict).
//
// Receiving by matched probe is how a receiver that does not trust the
// sender's length avoids posting a receive smaller than the message: some
// MPI libraries (Open MPI 4.1 above its eager limit) write the whole of a
// longer message past a posted receive buffer instead of truncating it.
type Message struct {
	impl   msgImpl
	status Status
	used   atomic.Bool
}

// unreceived counts matched messages on which neither Recv nor Discard has
// been called.
var unreceived atomic.Int64

// Status describes the message: its source, tag and exact length in bytes.
func (m *Message) Status() Status { return m.status }

// begin claims the message for op and enters MPI; the caller exits.
func (m *Message) begin(op string) error {
	if err := m.claim(op); err != nil {
		return err
	}
	if err := enter(); err != nil {
		m.used.Store(false)
		return err
	}
	return nil
}

// claim marks the message as being received, once.
func (m *Message) claim(op string) error {
	if m == nil {
		return fmt.Errorf("cluster: %s of a nil Message: %w", op, distbuf.ErrInvalid)
	}
	if !m.used.CompareAndSwap(false, true) {
		return fmt.Errorf("cluster: %s: the message from rank %d (tag %d, %d bytes) was already received or discarded: %w",
			op, m.status.Source, m.status.Tag, m.status.Bytes, distbuf.ErrInvalid)
	}
	return nil
}

// Recv starts receiving the message into the first Status().Bytes bytes of mem
// (MPI_Imrecv). mem must hold the whole message: a smaller region is refused
// with an error matching distbuf.ErrInvalid and nothing is posted, so the
// message can still be received elsewhere or discarded. As for Irecv, mem must
// stay valid until the request completes.
func (m *Message) Recv(mem Memory) (*Request, error) {
	if err := m.begin("Message.Recv"); err != nil {
		return nil, err
	}
	defer exit()
	reg, err := checkMemory(mem, "Message.Recv")
	if err == nil && reg.size < m.status.Bytes {
		err = fmt.Errorf("cluster: Message.Recv: the message from rank %d (tag %d) has %d bytes, the memory %d; nothing was posted: %w",
			m.status.Source, m.status.Tag, m.status.Bytes, reg.size, distbuf.ErrInvalid)
	}
	var lay byteLayout
	if err == nil {
		lay, err = layoutFor(m.status.Bytes)
	}
	if err != nil {
		m.used.Store(false)
		return nil, err
	}
	r := &Request{posted: true, peer: m.status.Source, tag: m.status.Tag, size: m.status.Bytes, mem: mem}
	if err := backendImrecv(m.impl, reg.addr, lay, r); err != nil {
		// MPI_Imrecv failed: the message cannot be offered again.
		unreceived.Add(-1)
		return nil, err
	}
	unreceived.Add(-1)
	track(r)
	return r, nil
}

// Discard starts receiving the message into scratch memory of its length,
// owned by the request and freed when it completes: the message is taken off
// the wire and dropped. It fails (distbuf.ErrOutOfMemory) when no scratch
// memory of that length can be had, leaving the message to a later Recv or
// Discard.
func (m *Message) Discard() (*Request, error) {
	if err := m.begin("Message.Discard"); err != nil {
		return nil, err
	}
	defer exit()
	lay, err := layoutFor(m.status.Bytes)
	if err != nil {
		m.used.Store(false)
		return nil, err
	}
	r := &Request{posted: true, peer: m.status.Source, tag: m.status.Tag, size: m.status.Bytes}
	if err := backendDiscard(m.impl, lay, r); err != nil {
		m.used.Store(false)
		return nil, err
	}
	unreceived.Add(-1)
	track(r)
	return r, nil
}

// Probe names the messages Await matches: from Source (or AnySource) with
// Tag (or AnyTag) on Comm.
type Probe struct {
	Comm        *Comm
	Source, Tag int
}

// Await waits until at least one of reqs has completed or, when p is not
// nil, a message p names has arrived, or until timeout has passed:
// whichever comes first. Every request that has completed is completed
// (what was attached to it released) and its index appended to done, in
// increasing order; nil entries and requests already complete are skipped,
// and each one's status and error then come from Request.Wait, which
// returns at once. A message that arrived is matched (MPI_Improbe) and
// returned; the caller must Recv or Discard it. Both may happen in one
// call. On timeout neither happens and the error is nil: what a timeout
// means is the caller's to say. A negative timeout waits without limit,
// zero tests once. The error Await returns is about the call itself (MPI
// unusable, a request in use, a failed probe); a request's own failure is
// returned by its Wait.
//
// Await never blocks inside MPI: it tests the requests and
// probes in C for short slices (yielding to other goroutines between them),
// so that the deadline holds, and so that a receiver can learn each
// message's length before giving memory for it while its own sends
// progress. Open MPI's blocking waits poll the same way.
func Await(reqs []*Request, done []int, p *Probe, timeout time.Duration) ([]int, *Message, error) {
	if err := acquireAll(reqs); err != nil {
		return done, nil, err
	}
	defer unlockAll(reqs)
	var pendBuf [smallBatch]*Request
	var whereBuf [smallBatch]int
	pending, where := pendingOf(reqs, pendBuf[:0], whereBuf[:0])
	n := len(pending)
	if n == 0 && p == nil {
		return done, nil, nil
	}
	var probe *awaitProbe
	if p != nil {
		if err := p.Comm.enter("Await"); err != nil {
			return done, nil, err
		}
		err := p.Comm.checkPeer("Await", p.Source, true)
		if err == nil {
			err = p.Comm.checkTag("Await", p.Tag, true)
		}
		exit()
		if err != nil {
			return done, nil, err
		}
		probe = &awaitProbe{c: p.Comm.impl, source: p.Source, tag: p.Tag}
	}
	if err := enterPosted(pending); err != nil {
		return done, nil, err
	}
	var b completions
	sts, errs, idx := b.slices(n)
	res := backendAwait(pending, sts, errs, idx, probe, timeout)
	exit()
	slices.Sort(idx[:res.done])
	for _, j := range idx[:res.done] {
		pending[j].complete(sts[j], errs[j])
		done = append(done, where[j])
	}
	var m *Message
	if res.matched {
		unreceived.Add(1)
		m = &Message{impl: res.msg, status: res.status}
	}
	return done, m, res.err
}

// awaitProbe is a Probe as the backend takes it.
type awaitProbe struct {
	c           commImpl
	source, tag int
}

// awaitResult is what a backend's Await reports: how many of the pending
// requests completed (listed in idx), and the message it matched, if any.
type awaitResult struct {
	done    int
	matched bool
	msg     msgImpl
	status  Status
	err     error
}
