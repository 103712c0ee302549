package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/distbuf/distbuf"
)

// Bounded collectives (doc.go, "Bounded collectives", says what they
// promise and what a peer in another language sends). Each is built from
// point-to-point messages on the communicator's control duplicate: every
// rank sends its part to each rank that needs it as soon as it enters, and
// waits, in Await's polling slices, until it has what it needs or the
// deadline passes. A rank's arrival is its message, so at the deadline the
// ranks not heard from are exactly those whose part has not arrived.

// collOp names a bounded collective in its messages' headers.
type collOp uint32

const (
	opBarrier collOp = iota + 1
	opBcast
	opAllgather
	opAllreduce
	opAlltoall
)

func (o collOp) String() string {
	switch o {
	case opBarrier:
		return "Barrier"
	case opBcast:
		return "Bcast"
	case opAllgather:
		return "Allgather"
	case opAllreduce:
		return "Allreduce"
	case opAlltoall:
		return "Alltoall"
	}
	return fmt.Sprintf("collective %d", uint32(o))
}

// within is the name of the function that runs o.
func (o collOp) within() string {
	switch o {
	case opBarrier:
		return "BarrierWithin"
	case opBcast:
		return "BcastWithin"
	case opAllgather:
		return "AllgatherWithin"
	case opAllreduce:
		return "AllreduceWithin"
	}
	return "AlltoallWithin"
}

// headerBytes is the header every message of a bounded collective starts
// with: the collective's number (uint64), its operation (uint32) and its
// argument (uint32: the root of a Bcast, the operator and type of an
// Allreduce, else 0), little-endian.
const headerBytes = 16

type header struct {
	seq uint64
	op  collOp
	arg uint32
}

func (h header) put(b []byte) {
	binary.LittleEndian.PutUint64(b[0:], h.seq)
	binary.LittleEndian.PutUint32(b[8:], uint32(h.op))
	binary.LittleEndian.PutUint32(b[12:], h.arg)
}

func readHeader(b []byte) header {
	return header{
		seq: binary.LittleEndian.Uint64(b[0:]),
		op:  collOp(binary.LittleEndian.Uint32(b[8:])),
		arg: binary.LittleEndian.Uint32(b[12:]),
	}
}

// enterBounded enters c for the bounded collective op and locks its
// numbering; the caller calls leaveBounded when done.
func (c *Comm) enterBounded(op collOp) error {
	if err := c.enter(op.within()); err != nil {
		return err
	}
	c.bounded.mu.Lock()
	return nil
}

func (c *Comm) leaveBounded() {
	c.bounded.mu.Unlock()
	exit()
}

// allPeers is every rank of c but this one (made once; not to be
// modified). Called with c's bounded state locked.
func (c *Comm) allPeers() []int {
	if c.bounded.peers == nil {
		peers := make([]int, 0, c.size-1)
		for p := range c.size {
			if p != c.rank {
				peers = append(peers, p)
			}
		}
		c.bounded.peers = peers
	}
	return c.bounded.peers
}

// broadcastSpans is one message of n bytes at the start of the send buffer
// for each of peers.
func broadcastSpans(peers []int, n int64) []span {
	spans := make([]span, len(peers))
	for i, p := range peers {
		spans[i] = span{peer: p, n: n}
	}
	return spans
}

// finish resolves an earlier timeout on c once a bounded collective has
// completed on it.
func (c *Comm) finish(err error) error {
	if err == nil {
		stalls.resolve(c)
	}
	return err
}

// BarrierWithin returns once every rank of c has entered it, or fails
// with a *TimeoutError (matching ErrTimeout) naming the ranks not heard
// from when timeout passes first; timeout <= 0 waits without limit. See
// doc.go, "Bounded collectives".
func (c *Comm) BarrierWithin(timeout time.Duration) error {
	if err := c.enterBounded(opBarrier); err != nil {
		return err
	}
	defer c.leaveBounded()
	peers := c.allPeers()
	_, err := c.runBounded(opBarrier, 0, timeout, make([]byte, headerBytes), broadcastSpans(peers, headerBytes), peers, 0)
	return c.finish(err)
}

// BcastWithin is Bcast under a deadline: root's buf is copied into buf on
// every other rank, or the call fails with a *TimeoutError when timeout
// passes first (on a non-root rank: the root was not heard from; on the
// root: the ranks that had not taken its message). timeout <= 0 waits
// without limit. Every rank passes the same length and root.
func BcastWithin[T byte | int64 | float64](c *Comm, buf []T, root int, timeout time.Duration) error {
	if err := c.enterBounded(opBcast); err != nil {
		return err
	}
	defer c.leaveBounded()
	if err := c.checkPeer("BcastWithin root", root, false); err != nil {
		return err
	}
	b := asBytes(buf)
	n := int64(len(b))
	if _, err := layoutFor(headerBytes + n); err != nil {
		return err
	}
	if c.rank == root {
		send := make([]byte, headerBytes+n)
		copy(send[headerBytes:], b)
		_, err := c.runBounded(opBcast, uint32(root), timeout, send, broadcastSpans(c.allPeers(), headerBytes+n), nil, n)
		return c.finish(err)
	}
	got, err := c.runBounded(opBcast, uint32(root), timeout, nil, nil, []int{root}, n)
	if err == nil {
		copy(b, got[headerBytes:])
	}
	return c.finish(err)
}

// AllgatherWithin is Allgather under a deadline: every rank's in, in rank
// order, in out on every rank (len(out) == c.Size()*len(in)), or a
// *TimeoutError when timeout passes first; timeout <= 0 waits without
// limit. Every rank passes the same len(in).
func AllgatherWithin[T byte | int64 | float64](c *Comm, in, out []T, timeout time.Duration) error {
	if err := c.enterBounded(opAllgather); err != nil {
		return err
	}
	defer c.leaveBounded()
	if int64(len(out)) != int64(c.size)*int64(len(in)) {
		return fmt.Errorf("cluster: AllgatherWithin: out has %d entries, want %d ranks x %d: %w", len(out), c.size, len(in), distbuf.ErrInvalid)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: AllgatherWithin: in and out overlap: %w", distbuf.ErrInvalid)
	}
	bin, bout := asBytes(in), asBytes(out)
	got, err := c.gather(opAllgather, 0, timeout, bin)
	if err != nil {
		return c.finish(err)
	}
	n := len(bin)
	for i, p := range c.allPeers() {
		copy(bout[p*n:(p+1)*n], got[i])
	}
	copy(bout[c.rank*n:], bin)
	return c.finish(nil)
}

// gather sends b to every other rank and returns each other rank's b, in
// rank order (this rank left out).
func (c *Comm) gather(op collOp, arg uint32, timeout time.Duration, b []byte) ([][]byte, error) {
	n := int64(len(b))
	if _, err := layoutFor(headerBytes + n); err != nil {
		return nil, err
	}
	send := make([]byte, headerBytes+n)
	copy(send[headerBytes:], b)
	peers := c.allPeers()
	got, err := c.runBounded(op, arg, timeout, send, broadcastSpans(peers, headerBytes+n), peers, n)
	if err != nil {
		return nil, err
	}
	parts := make([][]byte, len(peers))
	stride := headerBytes + n
	for i := range parts {
		parts[i] = got[int64(i)*stride+headerBytes : int64(i+1)*stride]
	}
	return parts, nil
}

// The type half of an Allreduce header's argument.
const (
	allreduceInt64   = 1
	allreduceFloat64 = 2
)

// AllreduceWithin is Allreduce under a deadline, or a *TimeoutError when
// timeout passes first; timeout <= 0 waits without limit. Every rank
// gathers every rank's in and combines them in rank order, so every rank
// gets the same bits, float sums included; the cost grows with the
// number of ranks times len(in), so it is for the short vectors of
// agreements and counts. in and out may be the same slice.
func AllreduceWithin[T int64 | float64](c *Comm, in, out []T, op Op, timeout time.Duration) error {
	if err := c.enterBounded(opAllreduce); err != nil {
		return err
	}
	defer c.leaveBounded()
	if _, err := checkReduce("AllreduceWithin", in, out, op); err != nil {
		return err
	}
	var kind uint32 = allreduceInt64
	if _, ok := any(in).([]float64); ok {
		kind = allreduceFloat64
	}
	got, err := c.gather(opAllreduce, uint32(op)<<8|kind, timeout, asBytes(in))
	if err != nil {
		return c.finish(err)
	}
	// In rank order: this rank's own part goes at its place.
	parts := make([][]T, 0, c.size)
	for i, p := range c.allPeers() {
		if p > c.rank && len(parts) == c.rank {
			parts = append(parts, in)
		}
		parts = append(parts, fromBytes[T](got[i]))
	}
	if len(parts) == c.rank {
		parts = append(parts, in)
	}
	acc := slices.Clone(parts[0])
	for _, part := range parts[1:] {
		combine(acc, part, op)
	}
	copy(out, acc)
	return c.finish(nil)
}

// fromBytes copies b into a new slice of T (b, from a receive buffer, may
// not be aligned for T).
func fromBytes[T int64 | float64](b []byte) []T {
	out := make([]T, len(b)/8)
	copy(asBytes(out), b)
	return out
}

// combine folds x into acc with op. For float64 Min and Max, a NaN in
// either operand gives NaN.
func combine[T int64 | float64](acc, x []T, op Op) {
	for i, v := range x {
		switch op {
		case Sum:
			acc[i] += v
		case Min:
			if v < acc[i] || math.IsNaN(float64(v)) {
				acc[i] = v
			}
		case Max:
			if v > acc[i] || math.IsNaN(float64(v)) {
				acc[i] = v
			}
		}
	}
}

// AlltoallWithin is Alltoall under a deadline: in[j] goes to rank j and
// rank j's value for this rank arrives in out[j], or a *TimeoutError when
// timeout passes first; timeout <= 0 waits without limit.
func AlltoallWithin[T int64 | float64](c *Comm, in, out []T, timeout time.Duration) error {
	if err := c.enterBounded(opAlltoall); err != nil {
		return err
	}
	defer c.leaveBounded()
	if len(in) != c.size || len(out) != c.size {
		return fmt.Errorf("cluster: AlltoallWithin: in has %d and out %d entries, want %d (one per rank): %w", len(in), len(out), c.size, distbuf.ErrInvalid)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: AlltoallWithin: in and out overlap: %w", distbuf.ErrInvalid)
	}
	const part = headerBytes + 8
	peers := c.allPeers()
	send := c.bounded.sendScratch(int64(len(peers)) * part)
	spans := resize(c.bounded.spans, len(peers))
	c.bounded.spans = spans
	bin := asBytes(in)
	for i, p := range peers {
		off := int64(i) * part
		copy(send[off+headerBytes:off+part], bin[p*8:(p+1)*8])
		spans[i] = span{peer: p, off: off, n: part}
	}
	got, err := c.runBounded(opAlltoall, 0, timeout, send, spans, peers, 8)
	if err != nil {
		return c.finish(err)
	}
	bout := asBytes(out)
	for i, p := range peers {
		copy(bout[p*8:(p+1)*8], got[int64(i)*part+headerBytes:int64(i+1)*part])
	}
	copy(bout[c.rank*8:(c.rank+1)*8], bin[c.rank*8:(c.rank+1)*8])
	return c.finish(nil)
}
