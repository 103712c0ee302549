package msg

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/wire"
	"github.com/distbuf/distbuf/packing"
)

// Stats counts what an Exchanger has done since New.
type Stats struct {
	Exchanges      int64 // exchanges run, failed ones included
	CountExchanges int64 // Alltoalls of message sizes (a learned Pattern skips them)
	Messages       int64 // logical messages sent through MPI: one per peer with something to send
	SelfCopies     int64 // messages to this rank delivered by one stream copy, without MPI
	MPISends       int64 // MPI sends: Messages plus the further chunks of large messages
	MPIRecvs       int64 // MPI receives
	BytesSent      int64 // bytes sent through MPI, manifests included
	BytesStaged    int64 // bytes copied through pinned staging memory, both directions
	MaxInFlight    int   // the most requests of one direction outstanding at once
	Aborts         int64 // abort notices sent in place of announced messages
	NCCLTransfers  int64 // NCCL sends posted (TransportNCCL: messages cut at 64 MiB)
	Agreements     int64 // Alltoalls ending an exchange, in which every rank says what it sent and whether it failed
	Drained        int64 // MPI messages received into scratch and dropped: too long, stray, unwanted or for a buffer this rank could not have
	Timeouts       int64 // data phases that ended because nothing moved for Options.Timeout
	ManifestsBuilt int64 // layouts described: send manifests, and received layouts of messages to self (a learned Pattern reuses its own)
	IPCMessages    int64 // messages to node-local peers sent through this rank's CUDA IPC window
	IPCBytes       int64 // their bytes, manifests included
	HostReads      int64 // messages this rank read from node-local peers' memory, one process_vm_readv each
	HostReadBytes  int64 // their bytes, manifests included
}

// Exchanger runs exchanges over one communicator: each rank passes one
// coalesced buffer per destination and gets one per source back. Every
// exchange is collective: all ranks of the communicator call Exchange (or
// Pattern.Exchange) the same number of times, in the same order. An
// Exchanger runs one exchange at a time.
type Exchanger struct {
	comm         *cluster.Comm // a duplicate of Options.Comm, the exchanger's own
	a            *devalloc.Allocator
	o            Options
	chunk        int64
	timeout      time.Duration // <= 0: none
	maxIn        int64         // the longest message this rank accepts an announcement of
	rank, size   int
	sendS, recvS *devalloc.Stream
	// tr moves the messages: NCCL under TransportNCCL when every rank can
	// use it, else MPI (device memory then travels as under TransportAuto).
	tr transport

	// ipc is the node-local transport, nil when this rank has no node-local
	// peer to use it with (ipcWhy says why).
	ipc    *ipcLink
	ipcWhy string
	// reads are the node-local reads of host messages, nil when this rank
	// has no peer to use them with (readsWhy says why).
	reads    *readLink
	readsWhy string

	mu      sync.Mutex
	closed  bool
	epoch   uint64
	stats   Stats
	layouts layoutCache
	// spare is the state of the last exchange, reused by the next one: an
	// exchange in a loop then allocates little of its own. Only an
	// exchange that ended without error leaves its state here, since only
	// then has every request that referenced it certainly completed.
	spare *exchange
	hooks testHooks
}

// testHooks let this package's tests act between the steps of an exchange,
// and play a faulty peer.
type testHooks struct {
	beforePost func(e *exchange)            // before the first request is posted
	afterPost  func(e *exchange)            // after the first requests are posted
	mangle     func(dest int, whole []byte) // alters a host message before it is sent
	// announce alters the lengths this rank announces, not the messages.
	announce func(sizes []int64)
	// pieces replaces the MPI messages a host message to dest travels as
	// (whole is the message): nil keeps them.
	pieces func(dest int, whole []byte) [][]byte
	// extra adds MPI messages to dest after this rank's own, if any.
	extra func(dest int) [][]byte
	// canary puts that many bytes on each side of every region MPI
	// receives into (a receive buffer, a pinned staging chunk), filled
	// with canaryByte and checked once the receives into it completed;
	// canaryHit hears of every one overwritten.
	canary    int64
	canaryHit func(what string)
	// windowCopies, when it returns an error, fails this rank's copies
	// into its window (into) or from its peers' windows with it.
	windowCopies func(into bool) error
	// beforeRead runs before this rank reads src's message from src's
	// memory.
	beforeRead func(src int)
}

func (h *testHooks) windowCopyError(into bool) error {
	if h.windowCopies == nil {
		return nil
	}
	return h.windowCopies(into)
}

// New makes an Exchanger. It is collective over o.Comm: every rank
// duplicates it (the exchanger's messages then travel on a communicator of
// their own, apart from any other exchanger's or the caller's), and the
// ranks check that they agree on the tag, the chunk size and the
// transport, and that every rank could set up its part; a rank that
// cannot still takes part, so that all fail alike. The Exchanger owns its
// communicator and two streams of o.Alloc (one for staging copies out, one
// for copies into received buffers); Close frees them.
func New(o Options) (*Exchanger, error) {
	if o.Comm == nil {
		return nil, fmt.Errorf("msg: Options.Comm is required: %w", distbuf.ErrInvalid)
	}
	o, chunk, timeout, localErr := o.resolve()
	comm, err := o.Comm.Dup()
	if err != nil {
		return nil, errors.Join(localErr, fmt.Errorf("msg: new: %w", err))
	}
	x := &Exchanger{comm: comm, a: o.Alloc, o: o, chunk: chunk, timeout: timeout, rank: comm.Rank(), size: comm.Size(),
		layouts: newLayoutCache()}
	if localErr == nil {
		localErr = x.openStreams()
	}
	undo := func(err error) (*Exchanger, error) {
		return nil, errors.Join(err, x.closeStreams(), comm.Free())
	}
	// One collective (docs/WIRE.md, "Setup"): max of (v, -v) gives max
	// and min of every setting, and the last slot the lowest rank that
	// could not set up (-size when none).
	useNCCL := int64(0)
	if o.Transport == TransportNCCL {
		useNCCL = 1
	}
	failed := -int64(x.size)
	if localErr != nil {
		failed = -int64(x.rank)
	}
	all := []int64{int64(o.Tag), chunk, useNCCL, -int64(o.Tag), -chunk, -useNCCL, failed}
	if err := cluster.Allreduce(comm, all, all, cluster.Max); err != nil {
		return undo(errors.Join(localErr, fmt.Errorf("msg: new: %w", err)))
	}
	switch {
	case localErr != nil:
		return undo(localErr)
	case all[6] > -int64(x.size):
		return undo(fmt.Errorf("msg: new: rank %d could not set up its exchanger (its own error says why): %w", -all[6], ErrPeerAborted))
	case all[0] != -all[3] || all[1] != -all[4]:
		return undo(fmt.Errorf("msg: new: ranks disagree on the tag (%d..%d) or the chunk size (%d..%d); set them alike everywhere: %w",
			-all[3], all[0], -all[4], all[1], distbuf.ErrInvalid))
	case all[2] != -all[5]:
		return undo(fmt.Errorf("msg: new: some ranks ask for TransportNCCL and some do not; set it alike everywhere: %w", distbuf.ErrInvalid))
	}
	x.maxIn = maxMessageBytes
	if l := o.Alloc.Info().Limit; l > 0 {
		x.maxIn = min(x.maxIn, l)
	}
	if total := o.Alloc.Info().TotalMemory; total > 0 {
		x.maxIn = min(x.maxIn, total)
	}
	// Every rank joins the node-local setup, whatever its transport.
	if x.ipc, x.ipcWhy, err = setupIPC(x, o.Transport == TransportNCCL); err != nil {
		return undo(err)
	}
	x.tr = &mpiTransport{x: x}
	if o.Transport == TransportNCCL {
		link, why, err := openNCCL(comm, o.Alloc)
		if err != nil {
			if x.ipc != nil {
				// Nothing is opened or allocated before the first exchange:
				// its events go without a collective.
				x.ipc.destroyEvents()
			}
			return undo(err)
		}
		if link != nil {
			x.tr = &ncclTransport{x: x, link: link}
		} else {
			x.tr = &mpiTransport{x: x, ncclWhy: why}
		}
	}
	return x, nil
}

// maxMessageBytes bounds any announced length, whatever the memory: the
// largest single allocation devalloc makes.
const maxMessageBytes = 1 << 50

func (x *Exchanger) openStreams() (err error) {
	if x.sendS, err = x.a.NewStream(); err != nil {
		return fmt.Errorf("msg: new: %w", err)
	}
	if x.recvS, err = x.a.NewStream(); err != nil {
		return fmt.Errorf("msg: new: %w", err)
	}
	return nil
}

func (x *Exchanger) closeStreams() error {
	var errs []error
	for _, s := range []*devalloc.Stream{x.sendS, x.recvS} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

// Transport says how device memory travels between ranks in this
// exchanger's exchanges, and why when TransportNCCL could not be honoured:
// "nccl", "cuda-aware mpi" or "staged".
func (x *Exchanger) Transport() (string, string) { return x.tr.describe() }

// Close waits for the exchanger's copies, lets go of the node-local windows
// (collective over the node: every rank first closes what it opened of its
// peers', then frees its own), destroys its streams and frees its
// communicator (MPI_Comm_free, collective: every rank closes its
// exchanger). Buffers received earlier stay valid and the caller's. After a
// failure that ends the job, abort it (cluster.Abort) rather than Close:
// the other ranks may never reach their Close.
func (x *Exchanger) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("msg: close: %w", distbuf.ErrClosed)
	}
	x.closed = true
	return errors.Join(x.tr.close(), x.closeIPC(), x.closeStreams(), x.comm.Free())
}

// Stats returns the counters.
func (x *Exchanger) Stats() Stats {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.stats
}

// Epoch is the number of exchanges run so far; the next one carries
// Epoch()+1 in its headers.
func (x *Exchanger) Epoch() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.epoch
}

// Tag is the MPI tag of the exchanger's messages.
func (x *Exchanger) Tag() int { return x.o.Tag }

// ChunkBytes is the chunk size; 0 means messages are never cut.
func (x *Exchanger) ChunkBytes() int64 {
	if x.chunk == maxChunk {
		return 0
	}
	return x.chunk
}

// Received is what one exchange delivered: at most one coalesced buffer per
// source rank, whose views are the blocks that rank sent, in the sender's
// offset order, inside the pooled buffer the message was received into.
// The buffers are the caller's: free them (Free frees all) once done.
//
// When Exchange returns, some of the data may still be on its way into
// these buffers: the copy of the message to self and the moves of staged
// device messages are enqueued on the exchanger's stream, not waited for.
// The ledger records them as the buffers' writers, so read the blocks
// through it: Coalesced.OnHost (typed slices on every backend, after those
// copies), or work declared on a stream, or a Hold after its Wait. A read
// of the memory straight after Exchange, outside the ledger, may see it
// before those copies land.
type Received struct {
	bySource []*packing.Coalesced
	epoch    uint64
}

// From is the buffer received from rank src, or nil when src sent nothing.
// A received layout has no destination: its Dest and its views'
// Desc().Dest are packing.NoDest, and Exchange refuses it as a send buffer.
// To forward blocks, copy them into a send buffer (AllocSend) of a plan
// for the new destination.
func (r *Received) From(src int) *packing.Coalesced {
	if r == nil || src < 0 || src >= len(r.bySource) {
		return nil
	}
	return r.bySource[src]
}

// Sources lists, in increasing order, the ranks that sent something.
func (r *Received) Sources() []int {
	var out []int
	for s, c := range r.bySource {
		if c != nil {
			out = append(out, s)
		}
	}
	return out
}

// Epoch is the exchange's epoch, as carried in its headers.
func (r *Received) Epoch() uint64 { return r.epoch }

// Free frees every received buffer.
func (r *Received) Free() error {
	var errs []error
	for s, c := range r.bySource {
		if c != nil {
			if err := c.Free(); err != nil {
				errs = append(errs, err)
			}
			r.bySource[s] = nil
		}
	}
	return errors.Join(errs...)
}

// Pattern is a persistent exchange plan for a sparsity pattern that
// repeats, as in DMRG sweeps. Its first Exchange runs like
// Exchanger.Exchange and learns every message size and every received
// manifest; later ones skip the count exchange, reuse the learned receive
// layouts (no manifest decoding, no plan building) and check that the
// exchange still matches: a departure is an error matching
// ErrPatternMismatch (on the rank that departs) or ErrPeerAborted (on the
// ranks expecting its messages), never a hang. All ranks must use a
// pattern alike: learn it in the same exchange, then use it together.
type Pattern struct {
	x        *Exchanger
	learned  bool
	sendSize []int64 // by destination
	// sendOut is the manifest sent to each destination when learning:
	// reused while the send buffers keep their layouts, so a solver that
	// sweeps over several patterns describes each layout once.
	sendOut  []*outManifest
	recvSize []int64 // by source
	recv     []*learnedIn
}

// NewPattern returns an unlearned pattern of this exchanger.
func (x *Exchanger) NewPattern() *Pattern { return &Pattern{x: x} }

// Learned reports whether the pattern has learned its exchange.
func (p *Pattern) Learned() bool { return p.learned }

// Exchange runs one exchange with the pattern: see Pattern.
func (p *Pattern) Exchange(send []*packing.Coalesced) (*Received, error) {
	return p.x.exchange(send, p)
}

// Exchange sends every buffer in send to its destination (Coalesced.Dest,
// a rank of the communicator; at most one buffer per destination; empty
// groups send nothing) and receives what the other ranks send to this one.
// Sizes are exchanged first (one Alltoall of int64s) and checked; then
// every receive buffer is allocated from the pool and the sends issued,
// each message as one MPI message (cut into chunks only above the chunk
// size), while what arrives is matched by probe and received once its
// length is known, with at most Window requests of each direction
// outstanding. An agreement (one more Alltoall) ends the exchange on every
// rank: see the package documentation, "Failures".
//
// The send buffers must not be written until Exchange returns; then they
// are the caller's again. Allocate them with AllocSend (or JoinSend's
// layout): each has room for its manifest before the blocks, and works on
// every backend. A message is sent from its buffer itself, without a copy,
// when the buffer is host memory, or device memory handed to a CUDA-aware
// MPI; such a buffer needs room for its manifest before its Start (64
// bytes, 32 per block, rounded up to 256: docs/WIRE.md), and one without
// that room (packing.Alloc) is refused with distbuf.ErrInvalid, naming
// AllocSend. Device memory without a CUDA-aware MPI is staged through
// pinned memory, room or not, and the message to this rank itself is a
// copy that needs no room.
//
// On error nothing is returned: every received buffer is freed, and the
// error joins what went wrong per peer (WireError values naming peer, tag
// and field, matching the sentinels of this package). When another rank's
// part failed, this rank's error matches ErrPeerAborted and names it.
func (x *Exchanger) Exchange(send []*packing.Coalesced) (*Received, error) {
	return x.exchange(send, nil)
}

func (x *Exchanger) exchange(send []*packing.Coalesced, pat *Pattern) (*Received, error) {
	if !x.mu.TryLock() {
		return nil, fmt.Errorf("msg: exchange while another exchange of this exchanger runs (exchanges are collective and ordered): %w", distbuf.ErrInvalid)
	}
	defer x.mu.Unlock()
	if x.closed {
		return nil, fmt.Errorf("msg: exchange: %w", distbuf.ErrClosed)
	}
	if pat != nil && pat.x != x {
		return nil, fmt.Errorf("msg: exchange: pattern of another exchanger: %w", distbuf.ErrInvalid)
	}
	// Every exchange, failed ones included, advances the epoch on every
	// rank alike.
	x.epoch++
	x.stats.Exchanges++
	return x.tr.exchange(x.begin(pat), send)
}

// announce sets the lengths this rank announces in the count exchange (see
// docs/WIRE.md): each message's, 0 where there is none, or -1 to every rank
// when it failed before the exchange.
func (e *exchange) announce(byDest []*outMsg, failed bool) {
	for d, m := range byDest {
		switch {
		case failed:
			e.sendSize[d] = -1
		case m != nil:
			e.sendSize[d] = m.size
		default:
			e.sendSize[d] = 0
		}
	}
}

// checkCounts validates what every rank announced for this one, before
// anything is sized from it (docs/WIRE.md, "Exchange protocol"). A rank
// that failed (-1) is neither sent to nor expected; one that announced
// another negative length is not expected. A length this rank refuses (shorter than any message, or more
// than it can take) is expected all the same, as pieces that are drained
// as they come, so that the sender completes: nothing is allocated for it.
// A length beyond the protocol's limit cannot come from a sender that has
// the message, so nothing is expected from that sender; whatever it sends
// is drained once the agreement says how much it was.
func (e *exchange) checkCounts(byDest []*outMsg) {
	x, tag := e.x, e.x.o.Tag
	for s, v := range e.recvSize {
		var w *WireError
		switch {
		case v == 0:
			continue
		case v == -1:
			w = wireErr(ErrPeerAborted, s, tag, "count", "rank %d failed before the exchange and sends nothing (its own error says why)", s)
			byDest[s] = nil // it expects nothing either
		case v < 0:
			// Not the -1 of a rank that failed: it may well expect this
			// rank's message, which is sent.
			w = wireErr(ErrMalformed, s, tag, "count", "rank %d announced %d bytes: a length is -1, 0 or at least %d", s, v, wire.AbortSize)
		case v > maxMessageBytes:
			w = wireErr(ErrTooLarge, s, tag, "count", "rank %d announced %d bytes, beyond the protocol's limit of %d; nothing was allocated", s, v, int64(maxMessageBytes))
		case v < wire.AbortSize:
			w = wireErr(ErrMalformed, s, tag, "count", "rank %d announced %d bytes: a message has at least %d; it is drained", s, v, wire.AbortSize)
			e.refuse[s] = true
		case v > x.maxIn:
			w = wireErr(ErrTooLarge, s, tag, "count", "rank %d announced %d bytes, more than this rank takes in one message (%d: %s); nothing was allocated, it is drained",
				s, v, x.maxIn, x.maxInWhy())
			e.refuse[s] = true
		default:
			continue
		}
		e.fail(w)
		e.silent[s] = true
		if !e.refuse[s] {
			e.recvSize[s] = 0
		}
	}
}

// maxInWhy says what bounds the announced lengths this rank accepts.
func (x *Exchanger) maxInWhy() string {
	switch l := x.a.Info().Limit; {
	case l > 0 && l == x.maxIn:
		return "its allocator's budget"
	case x.maxIn == maxMessageBytes:
		return "the protocol's limit"
	}
	return "its memory"
}

// agree ends the data phase with the agreement (docs/WIRE.md): one
// Alltoall in which every rank tells every other how many MPI messages it
// posted to it in this exchange and whether its part failed. Then each
// rank drains what its peers sent that it did not match, and waits for
// its own requests: every rank returns an error if any rank's part failed,
// and no message of this exchange is left for the next.
func (e *exchange) agree() {
	x, tag := e.x, e.x.o.Tag
	e.agreeing = true
	failed := len(e.errs) > 0
	for d, c := range e.sentTo {
		if failed {
			e.agreeOut[d] = -1 - c
		} else {
			e.agreeOut[d] = c
		}
	}
	if err := cluster.Alltoall(x.comm, e.agreeOut, e.agreeIn); err != nil {
		e.fail(fmt.Errorf("msg: agreement: %w", err))
		e.settle()
		return
	}
	x.stats.Agreements++
	var aborted []int
	for s, v := range e.agreeIn {
		if v < 0 {
			v = -1 - v
			if s != x.rank {
				aborted = append(aborted, s)
			}
		}
		e.agreeIn[s] = v // what s sent here
		if v < e.matchedFrom[s] {
			e.fail(wireErr(ErrUnexpectedPeer, s, tag, "agreement", "rank %d says it sent %d MPI messages to this rank in this exchange, %d arrived", s, v, e.matchedFrom[s]))
		}
	}
	e.reportAborted(aborted)
	e.settle()
}

// reportAborted names the ranks whose part of the exchange failed, unless
// an error already does (their abort notice, their -1): a few in full,
// then how many more.
func (e *exchange) reportAborted(ranks []int) {
	const shown = 4
	named := 0
	for _, s := range ranks {
		if e.namesAbort(s) {
			continue
		}
		if named++; named > shown {
			continue
		}
		e.fail(wireErr(ErrPeerAborted, s, e.x.o.Tag, "agreement", "rank %d failed its part of this exchange (its own error says why)", s))
	}
	if named > shown {
		e.fail(fmt.Errorf("msg: and %d more ranks failed their part of this exchange: %w", named-shown, ErrPeerAborted))
	}
}

func (e *exchange) namesAbort(s int) bool {
	for _, err := range e.errs {
		var w *WireError
		if errors.As(err, &w) && w.Peer == s && errors.Is(w, ErrPeerAborted) {
			return true
		}
	}
	return false
}

// settle drains, source by source, the MPI messages the agreement says
// were sent here and not yet matched (strays, or pieces of a message given
// up), then completes every request still active; each wait is bounded by
// the timeout. Messages from other sources are not touched: they may
// already belong to the next exchange.
func (e *exchange) settle() {
	x := e.x
	last := time.Now()
	expired := func() bool { return x.timeout > 0 && time.Since(last) >= x.timeout }
	wait := func() time.Duration {
		if x.timeout <= 0 {
			return -1
		}
		return max(x.timeout-time.Since(last), 0)
	}
	for s, sent := range e.agreeIn {
		probe := cluster.Probe{Comm: x.comm, Source: s, Tag: cluster.AnyTag}
		for e.matchedFrom[s] < sent {
			if expired() {
				e.fail(wireErr(ErrTimeout, s, x.o.Tag, "agreement", "rank %d says it sent %d MPI messages to this rank in this exchange, %d arrived within %v",
					s, sent, e.matchedFrom[s], x.timeout))
				break
			}
			moved, ok := e.await(&probe, wait())
			if !ok {
				return
			}
			if moved {
				last = time.Now()
			}
		}
	}
	for len(e.q.active) > 0 {
		if expired() {
			e.fail(fmt.Errorf("msg: exchange with tag %d: %d MPI requests did not complete within %v of the agreement (their memory stays held): %w",
				x.o.Tag, len(e.q.active), x.timeout, ErrTimeout))
			break
		}
		moved, ok := e.await(nil, wait())
		if !ok {
			break
		}
		if moved {
			last = time.Now()
		}
	}
	// Messages the exchange stopped waiting for give back what they hold.
	for _, in := range e.ins {
		if !in.ended {
			if in.failed == nil {
				in.failed = e.inErr(in, "receive", fmt.Errorf("%d of %d MPI messages arrived: %w", in.matched, in.pieces, ErrTimeout))
			}
			e.endIn(in)
		}
	}
}

// deliver ends an exchange whose transfers are over: the received buffers
// by source, or, after any failure, the errors with every buffer freed. A
// pattern learns from its first successful exchange.
func (e *exchange) deliver(byDest []*outMsg, recvSize []int64) (*Received, error) {
	x := e.x
	if e.joint != nil {
		// The results hold their own references: the buffer goes with
		// the last of them, or now when there is none.
		if err := e.joint.Release(); err != nil {
			e.fail(fmt.Errorf("msg: the receive buffer of the window messages: %w", err))
		}
	}
	res := make([]*packing.Coalesced, x.size)
	for _, in := range e.ins {
		if in.result != nil {
			res[in.src] = in.result
		}
	}
	if e.selfIn != nil && e.selfIn.result != nil {
		res[x.rank] = e.selfIn.result
	}
	if len(e.errs) > 0 {
		for _, c := range res {
			if c != nil {
				_ = c.Free()
			}
		}
		return nil, errors.Join(e.errs...)
	}
	if e.pat != nil && !e.pat.learned {
		e.learn(byDest, recvSize)
	}
	x.end(e)
	return &Received{bySource: res, epoch: x.epoch}, nil
}

// collect validates the send list and describes each message.
func (e *exchange) collect(send []*packing.Coalesced) ([]*outMsg, error) {
	x := e.x
	byDest := e.byDest
	var errs []error
	for i, c := range send {
		if c == nil {
			errs = append(errs, fmt.Errorf("msg: send buffer %d is nil: %w", i, distbuf.ErrInvalid))
			continue
		}
		if _, _, _, err := c.Buffer().Region(); err != nil {
			errs = append(errs, fmt.Errorf("msg: send buffer %d: %w", i, err))
			continue
		}
		d := c.Dest()
		if d == packing.NoDest {
			errs = append(errs, fmt.Errorf("msg: send buffer %d has no destination rank: a received or joined layout is not a send buffer; copy its blocks into one of a plan for the destination (AllocSend): %w", i, distbuf.ErrInvalid))
			continue
		}
		if d < 0 || d >= x.size {
			errs = append(errs, fmt.Errorf("msg: send buffer %d is for rank %d, outside a communicator of %d ranks: %w", i, d, x.size, distbuf.ErrInvalid))
			continue
		}
		if byDest[d] != nil {
			errs = append(errs, fmt.Errorf("msg: two send buffers for rank %d: %w", d, distbuf.ErrInvalid))
			continue
		}
		if c.Len() == 0 {
			continue // nothing to send: no message
		}
		if d == x.rank && !x.o.SelfViaMPI {
			// Delivered by a copy (copyToSelf): nothing to describe on the
			// wire, so no manifest; the size is the message's all the same.
			m := e.newOut()
			m.dest, m.c, m.size = d, c, int64(wire.PayloadOffset(c.Len()))+c.Size()
			byDest[d] = m
			continue
		}
		man, built, err := x.layouts.forSend(d, c, e.pat)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if built {
			x.stats.ManifestsBuilt++
		}
		m := e.newOut()
		m.dest, m.c, m.man, m.size = d, c, man, int64(man.PayloadOffset())+c.Size()
		byDest[d] = m
	}
	return byDest, errors.Join(errs...)
}

// checkPattern compares this rank's messages with a learned pattern. A
// destination the pattern expects a message for gets one in any case: the
// message, or an abort notice when the message cannot be sent as expected.
func (e *exchange) checkPattern(byDest []*outMsg, failed bool, abortTo []bool) {
	p := e.pat
	for d, m := range byDest {
		if failed {
			abortTo[d] = p.sendSize[d] > 0
			byDest[d] = nil
			continue
		}
		w := p.departure(d, m, e.x.o.Tag)
		if w == nil {
			continue
		}
		e.fail(w)
		switch w.Field {
		case "message_size": // the receiver expects a message of the learned size
			abortTo[d] = true
			byDest[d] = nil
		case "dest": // the receiver expects nothing
			byDest[d] = nil
		}
		// A different manifest of the right size is sent: the receiver
		// rejects it too.
	}
}

// departure says how m, this exchange's message for rank d (nil for none),
// departs from the pattern, or nil when it does not.
func (p *Pattern) departure(d int, m *outMsg, tag int) *WireError {
	want := p.sendSize[d]
	var w *WireError
	switch {
	case m == nil && want > 0:
		w = wireErr(ErrPatternMismatch, d, tag, "message_size", "the pattern expects %d bytes, this exchange has nothing for rank %d", want, d)
	case m == nil:
	case want == 0:
		w = wireErr(ErrPatternMismatch, d, tag, "dest", "rank %d expects no message in this pattern; nothing was sent", d)
	case m.size != want:
		w = wireErr(ErrPatternMismatch, d, tag, "message_size", "%d bytes, the pattern expects %d", m.size, want)
	case m.man != nil && (p.sendOut[d] == nil || !m.man.SameEntries(p.sendOut[d].Layout)):
		// (A message to self copied without a manifest is checked where it
		// is copied: copyToSelf.)
		w = wireErr(ErrPatternMismatch, d, tag, "manifest", "the blocks differ from the pattern's (same size)")
	}
	if w != nil {
		w.Outgoing = true
	}
	return w
}

// learn records the exchange that just succeeded in its pattern.
func (e *exchange) learn(byDest []*outMsg, recvSize []int64) {
	p := e.pat
	n := e.x.size
	p.sendSize, p.sendOut = make([]int64, n), make([]*outManifest, n)
	for d, m := range byDest {
		if m != nil {
			p.sendSize[d] = m.size
			if m.man != nil {
				p.sendOut[d] = m.man
			}
		}
	}
	p.recvSize = append([]int64(nil), recvSize...)
	p.recv = make([]*learnedIn, n)
	for _, in := range e.ins {
		p.recv[in.src] = in.learned
	}
	if e.selfIn != nil {
		p.recv[e.x.rank] = e.selfIn.learned
	}
	p.learned = true
}
