package cluster

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/distbuf/distbuf"
)

type commKind int

const (
	kindWorld   commKind = iota // MPI_COMM_WORLD: never freed by this package
	kindDerived                 // from Dup or Split: freed by Free
	kindLocal                   // a communicator's shared-memory part: freed with its parent
	kindControl                 // the hidden duplicate that carries a communicator's bounded collectives
)

// Comm is a communicator. World, Dup and Split give one; each has a
// node-local (shared-memory) part, Local, built when it is created. A Comm
// is safe for concurrent use; collectives must still be called in the same
// order on every rank.
type Comm struct {
	impl  commImpl
	kind  commKind
	rank  int
	size  int
	local *Comm
	freed atomic.Bool

	// ctl is the duplicate of this communicator that only the bounded
	// collectives use (bounded.go), so that no receive of the caller's,
	// AnyTag included, can take their messages; nil for a control
	// communicator itself.
	ctl *Comm
	// worldRanks maps each rank of the communicator to its rank in World,
	// for messages that name ranks.
	worldRanks []int
	bounded    boundedState
}

// newComm wraps a communicator handle and builds what goes with it
// (collective, in this order on every rank): its control duplicate and,
// unless it is itself a local part, its shared-memory part and that
// part's control duplicate. Called inside enter. On error, what it made
// is freed; impl stays the caller's.
func newComm(impl commImpl, kind commKind) (*Comm, error) {
	c, err := wrapComm(impl, kind)
	if err != nil {
		return nil, err
	}
	if kind == kindLocal {
		c.local = c
		return c, nil
	}
	limpl, err := backendSplitShared(impl)
	if err != nil {
		_ = freeControl(c)
		return nil, err
	}
	if c.local, err = wrapComm(limpl, kindLocal); err != nil {
		_ = backendFree(limpl)
		_ = freeControl(c)
		return nil, err
	}
	c.local.local = c.local
	return c, nil
}

// wrapComm wraps impl and makes its control duplicate.
func wrapComm(impl commImpl, kind commKind) (*Comm, error) {
	rank, size, err := backendRankSize(impl)
	if err != nil {
		return nil, err
	}
	ranks, err := backendWorldRanks(impl, size)
	if err != nil {
		return nil, err
	}
	c := &Comm{impl: impl, kind: kind, rank: rank, size: size, worldRanks: ranks}
	cimpl, err := backendDup(impl)
	if err != nil {
		return nil, err
	}
	c.ctl = &Comm{impl: cimpl, kind: kindControl, rank: rank, size: size, worldRanks: ranks}
	c.ctl.local = c.ctl
	return c, nil
}

// freeControl frees c's control duplicate.
func freeControl(c *Comm) error {
	c.ctl.freed.Store(true)
	return backendFree(c.ctl.impl)
}

func (c *Comm) enter(op string) error {
	if c == nil {
		return fmt.Errorf("cluster: %s on a nil communicator: %w", op, distbuf.ErrInvalid)
	}
	if err := enter(); err != nil {
		return err
	}
	if c.freed.Load() {
		exit()
		return fmt.Errorf("cluster: %s: %w", op, distbuf.ErrClosed)
	}
	return nil
}

// Rank is this process's rank in c.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in c.
func (c *Comm) Size() int { return c.size }

// Local is the node-local part of c (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED, keyed by rank). It is freed with c.
func (c *Comm) Local() *Comm { return c.local }

// WorldRanks is, for each rank of c in order, its rank in World
// (MPI_Group_translate_ranks, made once when c was): what ties a rank of
// one communicator to the same process in another, such as a rank of
// Local to its rank in c. The slice is the caller's.
func (c *Comm) WorldRanks() []int { return append([]int(nil), c.worldRanks...) }

// Dup duplicates c (MPI_Comm_dup): same ranks, separate message space.
// Collective over c. Free it when done.
func (c *Comm) Dup() (*Comm, error) {
	if err := c.enter("Dup"); err != nil {
		return nil, err
	}
	defer exit()
	impl, err := backendDup(c.impl)
	if err != nil {
		return nil, err
	}
	d, err := newComm(impl, kindDerived)
	if err != nil {
		_ = backendFree(impl)
		return nil, err
	}
	return d, nil
}

// Split partitions c by color, ordering each part by key then rank
// (MPI_Comm_split). Collective over c. A rank passing color Undefined
// joins no part and gets a nil *Comm with a nil error; other colors must
// be non-negative.
func (c *Comm) Split(color, key int) (*Comm, error) {
	if err := c.enter("Split"); err != nil {
		return nil, err
	}
	defer exit()
	if color < 0 && color != Undefined {
		return nil, fmt.Errorf("cluster: Split color %d (want >= 0 or Undefined): %w", color, distbuf.ErrInvalid)
	}
	impl, null, err := backendSplit(c.impl, color, key)
	if err != nil || null {
		return nil, err
	}
	d, err := newComm(impl, kindDerived)
	if err != nil {
		_ = backendFree(impl)
		return nil, err
	}
	return d, nil
}

// Free releases a communicator from Dup or Split and its local part
// (MPI_Comm_free, collective). World and local parts are not freed this
// way. Any later use returns distbuf.ErrClosed.
func (c *Comm) Free() error {
	if err := c.enter("Free"); err != nil {
		return err
	}
	defer exit()
	switch c.kind {
	case kindWorld:
		return fmt.Errorf("cluster: Free of World: %w", distbuf.ErrInvalid)
	case kindLocal:
		return fmt.Errorf("cluster: Free of a local communicator (it is freed with its parent): %w", distbuf.ErrInvalid)
	case kindControl:
		return fmt.Errorf("cluster: Free of a control communicator (it is freed with its parent): %w", distbuf.ErrInvalid)
	}
	if !c.freed.CompareAndSwap(false, true) {
		return fmt.Errorf("cluster: Free: %w", distbuf.ErrClosed)
	}
	c.local.freed.Store(true)
	errs := []error{freeControl(c.local), backendFree(c.local.impl), freeControl(c)}
	if err := backendFree(c.impl); err != nil {
		return err
	}
	return errors.Join(errs...)
}

func (c *Comm) checkPeer(op string, rank int, wildcard bool) error {
	if rank >= 0 && rank < c.size || wildcard && rank == AnySource {
		return nil
	}
	return fmt.Errorf("cluster: %s: rank %d outside a communicator of %d ranks: %w", op, rank, c.size, distbuf.ErrInvalid)
}

func (c *Comm) checkTag(op string, tag int, wildcard bool) error {
	if tag >= 0 && tag <= state.maxTag || wildcard && tag == AnyTag {
		return nil
	}
	return fmt.Errorf("cluster: %s: tag %d outside 0..%d: %w", op, tag, state.maxTag, distbuf.ErrInvalid)
}

// Isend starts sending the whole of m to rank dest with tag (MPI_Isend).
// m must stay valid until the request completes; attach the buffer's hold
// to the request (Request.Attach) so it does. Messages over 2^31 bytes are
// sent as one message of a derived datatype.
func (c *Comm) Isend(m Memory, dest, tag int) (*Request, error) {
	if err := c.enter("Isend"); err != nil {
		return nil, err
	}
	defer exit()
	reg, lay, err := c.checkP2P("Isend", m, dest, tag, false)
	if err != nil {
		return nil, err
	}
	r := &Request{posted: true, send: true, peer: dest, tag: tag, size: reg.size, mem: m}
	if err := backendIsend(c.impl, reg.addr, lay, dest, tag, r); err != nil {
		return nil, err
	}
	track(r)
	return r, nil
}

// checkP2P validates a point-to-point operation: the peer and tag (the
// wildcards only when receiving) and the memory, which it turns into the
// region and layout MPI is given.
func (c *Comm) checkP2P(op string, m Memory, peer, tag int, recv bool) (region, byteLayout, error) {
	if err := c.checkPeer(op, peer, recv); err != nil {
		return region{}, byteLayout{}, err
	}
	if err := c.checkTag(op, tag, recv); err != nil {
		return region{}, byteLayout{}, err
	}
	reg, err := checkMemory(m, op)
	if err != nil {
		return region{}, byteLayout{}, err
	}
	lay, err := layoutFor(reg.size)
	return reg, lay, err
}

// Irecv starts receiving into m a message from source (or AnySource) with
// tag (or AnyTag) (MPI_Irecv). The message may be shorter than m; a longer
// one fails with distbuf.ErrInvalid when the request completes.
func (c *Comm) Irecv(m Memory, source, tag int) (*Request, error) {
	if err := c.enter("Irecv"); err != nil {
		return nil, err
	}
	defer exit()
	reg, lay, err := c.checkP2P("Irecv", m, source, tag, true)
	if err != nil {
		return nil, err
	}
	r := &Request{posted: true, peer: source, tag: tag, size: reg.size, mem: m}
	if err := backendIrecv(c.impl, reg.addr, lay, source, tag, r); err != nil {
		return nil, err
	}
	track(r)
	return r, nil
}
