//go:build !mpi

package cluster

import (
	"fmt"
	"math"
	"os"
	"reflect"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Without the mpi build tag the world is this process alone: rank 0 of 1.
// Messages to self are matched in process, in posting order per tag (MPI's
// non-overtaking rule), and copied straight from the send region to the
// receive region when both sides are posted. A send therefore completes
// only once a matching receive is posted, as a synchronous send would:
// code that relies on MPI buffering small messages fails here at once
// rather than later with larger messages.

const haveMPI = false

type commImpl struct{ lc *localComm }

type reqImpl struct{ lr *localReq }

// msgImpl is a matched message: the send it came from, taken out of the
// queue.
type msgImpl struct{ send *localReq }

type localComm struct {
	mu      sync.Mutex
	sends   []*localReq   // posted, unmatched sends, oldest first
	recvs   []*localReq   // posted, unmatched receives, oldest first
	arrived chan struct{} // closed (and replaced) whenever a send is queued
}

type localReq struct {
	send   bool
	addr   uintptr
	n      int64
	tag    int // the tag sent, or the tag (or AnyTag) accepted
	done   chan struct{}
	status Status
	trunc  string // why the receive was truncated, if it was
}

func newLocalComm() commImpl {
	return commImpl{&localComm{arrived: make(chan struct{})}}
}

func backendInit(ThreadMode) (initInfo, error) {
	return initInfo{
		attempted: true,
		world:     newLocalComm(),
		thread:    ThreadMultiple,
		provided:  "in-process world (built without the mpi tag)",
		maxTag:    math.MaxInt32,
	}, nil
}

func backendFinalize() error { return nil }

func backendRankSize(commImpl) (int, int, error) { return 0, 1, nil }

func backendDup(commImpl) (commImpl, error) { return newLocalComm(), nil }

func backendWorldRanks(commImpl, int) ([]int, error) { return []int{0}, nil }

func backendSplit(_ commImpl, color, _ int) (commImpl, bool, error) {
	if color == Undefined {
		return commImpl{}, true, nil
	}
	return newLocalComm(), false, nil
}

func backendSplitShared(commImpl) (commImpl, error) { return newLocalComm(), nil }

func backendFree(commImpl) error { return nil }

// hostBytes views memory that Memory.Region vouched for (mmap'd, C-owned or
// pinned). The address is reinterpreted, not converted, because it comes
// from outside Go's view of pointers.
func hostBytes(addr uintptr, n int64) []byte {
	if n == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

func tagMatches(want, got int) bool { return want == AnyTag || want == got }

func (lc *localComm) post(q *localReq) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if q.send {
		for i, r := range lc.recvs {
			if tagMatches(r.tag, q.tag) {
				lc.recvs = append(lc.recvs[:i], lc.recvs[i+1:]...)
				deliver(q, r)
				return
			}
		}
		lc.sends = append(lc.sends, q)
		close(lc.arrived)
		lc.arrived = make(chan struct{})
		return
	}
	for i, s := range lc.sends {
		if tagMatches(q.tag, s.tag) {
			lc.sends = append(lc.sends[:i], lc.sends[i+1:]...)
			deliver(s, q)
			return
		}
	}
	lc.recvs = append(lc.recvs, q)
}

func deliver(s, r *localReq) {
	n := s.n
	if n > r.n {
		r.trunc = fmt.Sprintf("message truncated: %d bytes from rank 0 (tag %d) into a %d-byte receive buffer", s.n, s.tag, r.n)
		n = r.n
	}
	copy(hostBytes(r.addr, n), hostBytes(s.addr, n))
	r.status = Status{Source: 0, Tag: s.tag, Bytes: n}
	close(s.done)
	close(r.done)
}

func (q *localReq) result(op string) (Status, error) {
	if q.trunc != "" {
		return q.status, &MPIError{Op: op, Code: -1, Class: classTruncate, Message: q.trunc}
	}
	return q.status, nil
}

func backendIsend(c commImpl, addr uintptr, lay byteLayout, _, tag int, r *Request) error {
	q := &localReq{send: true, addr: addr, n: lay.bytes(), tag: tag, done: make(chan struct{})}
	r.impl.lr = q
	c.lc.post(q)
	return nil
}

func backendIrecv(c commImpl, addr uintptr, lay byteLayout, _, tag int, r *Request) error {
	q := &localReq{addr: addr, n: lay.bytes(), tag: tag, done: make(chan struct{})}
	r.impl.lr = q
	c.lc.post(q)
	return nil
}

func backendWait(r *Request) (Status, error) {
	<-r.impl.lr.done
	return r.impl.lr.result("MPI_Wait")
}

func backendWaitall(rs []*Request, sts []Status, errs []error) {
	for i, r := range rs {
		<-r.impl.lr.done
		sts[i], errs[i] = r.impl.lr.result("MPI_Waitall")
	}
}

// match takes the oldest queued send with a matching tag out of the queue,
// as MPI_Improbe does, or returns the channel closed at the next arrival.
func (lc *localComm) match(tag int) (*localReq, chan struct{}) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for i, s := range lc.sends {
		if tagMatches(tag, s.tag) {
			lc.sends = append(lc.sends[:i], lc.sends[i+1:]...)
			return s, nil
		}
	}
	return nil, lc.arrived
}

func sendStatus(s *localReq) Status { return Status{Source: 0, Tag: s.tag, Bytes: s.n} }

func backendImrecv(m msgImpl, addr uintptr, lay byteLayout, r *Request) error {
	q := &localReq{addr: addr, n: lay.bytes(), tag: m.send.tag, done: make(chan struct{})}
	r.impl.lr = q
	deliver(m.send, q)
	return nil
}

// backendDiscard completes the send and the receive without copying.
func backendDiscard(m msgImpl, _ byteLayout, r *Request) error {
	q := &localReq{tag: m.send.tag, done: make(chan struct{}), status: sendStatus(m.send)}
	r.impl.lr = q
	close(m.send.done)
	close(q.done)
	return nil
}

func backendAwait(rs []*Request, sts []Status, errs []error, idx []int, p *awaitProbe, timeout time.Duration) awaitResult {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	for {
		var res awaitResult
		for i, r := range rs {
			select {
			case <-r.impl.lr.done:
				sts[i], errs[i] = r.impl.lr.result("MPI_Testsome")
				idx[res.done] = i
				res.done++
			default:
			}
		}
		var arrived chan struct{}
		if p != nil {
			var s *localReq
			if s, arrived = p.c.lc.match(p.tag); s != nil {
				res.matched, res.msg, res.status = true, msgImpl{s}, sendStatus(s)
			}
		}
		if res.done > 0 || res.matched || timeout == 0 {
			return res
		}
		// Nothing yet: sleep until a request completes, a message arrives
		// or the time is up.
		cases := make([]reflect.SelectCase, 0, len(rs)+2)
		for _, r := range rs {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r.impl.lr.done)})
		}
		if arrived != nil {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(arrived)})
		}
		if expired != nil {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(expired)})
		}
		if chosen, _, _ := reflect.Select(cases); expired != nil && chosen == len(cases)-1 {
			return awaitResult{}
		}
	}
}

// backendAbort ends the process: it is the whole world.
func backendAbort(code int) { os.Exit(code) }

// Collectives over one rank: the data is already where it belongs, or
// needs one copy.

func backendBarrier(commImpl) error { return nil }

func backendBcast(commImpl, []byte, byteLayout, int) error { return nil }

func backendAllreduceInt64(_ commImpl, in, out []int64, _ Op, _ bool) error {
	copy(out, in)
	return nil
}

func backendAllreduceFloat64(_ commImpl, in, out []float64, _ Op, _ bool) error {
	copy(out, in)
	return nil
}

func backendAlltoallInt64(_ commImpl, in, out []int64) error {
	copy(out, in)
	return nil
}

func backendAllgather(_ commImpl, in, out []byte, _ byteLayout) error {
	copy(out, in)
	return nil
}

// boundedFastAvailable: a world of one rank has no parts to move.
func boundedFastAvailable() bool { return false }

func backendBoundedFast(commImpl, int, uintptr, []span, uintptr, []int, []int, int64, time.Duration, *fastResult) error {
	return fmt.Errorf("cluster: no MPI: %w", ErrMPI)
}

// backendNodeCPUs: the node is this process.
func backendNodeCPUs() int { return runtime.NumCPU() }
