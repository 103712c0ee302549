package msg

import (
	"errors"
	"fmt"
	"slices"
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
	Agreements     int64 // Alltoalls ending an exchange, in which every rank says what it sent and whether it failed
	Timeouts       int64 // data phases that ended because nothing moved for Options.Timeout
	// Messages and Bytes count what this rank delivered to its peers: the
	// messages of the exchanges that succeeded, and their bytes, manifests
	// included, whatever their route but RouteSelf. Routes counts them by
	// route (Routes[RouteWindow], ...), and counts the messages to this
	// rank itself copied without MPI too (Routes[RouteSelf]).
	Messages int64
	Bytes    int64
	Routes   [routeCount]RouteStats
	// What went through MPI, failed exchanges included: MPI messages sent
	// (every chunk, notice, abort notice and empty piece) and received
	// (drained ones included), and the bytes sent.
	MPISends, MPIRecvs, MPIBytes int64
	BytesStaged                  int64 // bytes copied through pinned staging memory, both directions
	MaxInFlight                  int   // the most requests of one direction outstanding at once
	Aborts                       int64 // abort notices sent in place of announced messages
	NCCLTransfers                int64 // NCCL sends posted (TransportNCCL: messages cut at 64 MiB)
	Drained                      int64 // MPI messages received into scratch and dropped: too long, stray, unwanted or for a buffer this rank could not have
	ManifestsBuilt               int64 // layouts described: send manifests, and received layouts of messages to self (a learned Pattern reuses its own)
}

// RouteStats counts the messages delivered on one route, and their bytes.
type RouteStats struct{ Messages, Bytes int64 }

// routeCount is the number of routes, for Stats.Routes.
const routeCount = int(RouteSelf) + 1

// Exchanger runs exchanges over one communicator: each rank passes one
// coalesced buffer per destination and gets one per source back. Every
// exchange is collective: all ranks of the communicator call Exchange (or
// Pattern.Exchange) the same number of times, in the same order. An
// Exchanger runs one exchange at a time.
type Exchanger struct {
	comm         *cluster.Comm // a duplicate of Options.Comm, the exchanger's own
	a            *devalloc.Allocator
	o            Options
	lim          limits
	rank, size   int
	aware        bool // device memory goes to MPI as it is (cluster.CUDAAware, unless TransportStaged)
	sendS, recvS *devalloc.Stream
	// tr runs the exchanges: NCCL under TransportNCCL when every rank can
	// use it, else MPI on each peer's route.
	tr transport
	// routes is each peer's route (chooseRoutes), steps each route once,
	// routesWhy what Routes says.
	routes    []route
	steps     []route
	routesWhy string
	coll      collectives

	mu      sync.Mutex
	closed  bool
	stats   Stats // Exchanges is the epoch of the last exchange
	layouts layoutCache
	// spare is the state of the last exchange, reused by the next one: an
	// exchange in a loop then allocates little of its own. Only an
	// exchange that ended without error leaves its state here, since only
	// then has every request that referenced it certainly completed.
	spare *exchange
	// leftover are the MPI requests of failed exchanges that had not
	// completed when the exchange gave up on them (a peer not heard
	// from): each exchange completes those MPI has completed since, and
	// Close waits for the rest, so that what they hold is let go.
	leftover []*cluster.Request
}

// limits are the exchanger's bounds, resolved from the options.
type limits struct {
	chunk   int64         // the chunk size; maxChunk for none
	timeout time.Duration // <= 0: none
	maxIn   int64         // the longest message this rank accepts an announcement of
}

// transport runs an exchange to the Received it returns: MPI, on each
// peer's route (mpiTransport), or NCCL (ncclTransport). Both describe each
// message from the layout cache (layouts.go) and end with the same
// agreement.
type transport interface {
	exchange(e *exchange, send []*packing.Coalesced) (*Received, error)
	// close lets go of what the transport holds; Exchanger.Close calls it
	// first.
	close() error
}

// New makes an Exchanger. It is collective over o.Comm: every rank
// duplicates it (the exchanger's messages then travel on a communicator of
// their own, apart from any other exchanger's or the caller's), the ranks
// check that they agree on the tag, the chunk size and the transport, and
// that every rank could set up its part (a rank that cannot still takes
// part, so that all fail alike), and they choose every peer's route
// (Routes). Each of its collectives waits at most the timeout
// (Options.Timeout) for every rank, and then fails naming the ranks not
// heard from (an error matching ErrTimeout), since MPI_Comm_dup itself
// cannot be bounded, a bounded barrier on o.Comm comes first. The
// Exchanger owns its communicator and two streams of o.Alloc (one for
// staging copies out, one for copies into received buffers); Close frees
// them.
func New(o Options) (*Exchanger, error) { return open(o, setupEdits{}) }

// setupEdits alter what this rank contributes to New's collectives; only
// tests set them, to play a peer whose rows lie.
type setupEdits struct {
	settings func(row []int64)        // the settings row (docs/WIRE.md, "Setup", step 2.3)
	node     func(row *wire.SetupRow) // the node-local setup row
}

// The words of a rank's settings row in New's Allgather.
const (
	settingTag = iota
	settingChunk
	settingNCCL   // 1 when the rank asks for TransportNCCL
	settingFailed // 1 when the rank could not set up its part, else 0
	settingWords
)

func open(o Options, edits setupEdits) (*Exchanger, error) {
	if o.Comm == nil {
		return nil, fmt.Errorf("msg: Options.Comm is required: %w", distbuf.ErrInvalid)
	}
	o, lim, localErr := o.resolve()
	// MPI_Comm_dup (and the node-local split that goes with it) waits for
	// every rank without limit: a rank that never reaches New is named here
	// instead.
	if err := o.Comm.BarrierWithin(lim.timeout); err != nil {
		return nil, errors.Join(localErr, stepError("new: the barrier before duplicating the communicator", err))
	}
	comm, err := o.Comm.Dup()
	if err != nil {
		return nil, errors.Join(localErr, fmt.Errorf("msg: new: %w", err))
	}
	x := &Exchanger{comm: comm, a: o.Alloc, o: o, lim: lim, rank: comm.Rank(), size: comm.Size(),
		layouts: newLayoutCache(), coll: boundedCollectives{comm}}
	if localErr == nil {
		localErr = x.openStreams()
	}
	if localErr == nil {
		aware, err := cluster.CUDAAware()
		x.aware, localErr = aware && o.Transport != TransportStaged, err
	}
	undo := func(err error) (*Exchanger, error) {
		return nil, errors.Join(err, x.closeStreams(), comm.Free())
	}
	wantNCCL := o.Transport == TransportNCCL
	if err := x.agreeSettings(localErr, wantNCCL, edits.settings); err != nil {
		return undo(err)
	}
	x.lim.maxIn = maxMessageBytes
	if l := o.Alloc.Info().Limit; l > 0 {
		x.lim.maxIn = min(x.lim.maxIn, l)
	}
	if total := o.Alloc.Info().TotalMemory; total > 0 {
		x.lim.maxIn = min(x.lim.maxIn, total)
	}
	if err := x.chooseRoutes(wantNCCL, edits.node); err != nil {
		return undo(err)
	}
	x.tr = &mpiTransport{x: x}
	if wantNCCL {
		link, why, err := openNCCL(comm, o.Alloc, lim.timeout)
		if err != nil {
			// Nothing is opened or allocated by a route before the first
			// exchange: each lets go of what it holds without a collective.
			for _, r := range x.steps {
				err = errors.Join(err, r.close())
			}
			return undo(err)
		}
		if link != nil {
			x.tr = &ncclTransport{x: x, link: link}
		}
		x.routesWhy = why
	}
	return x, nil
}

// agreeSettings is New's first collective (docs/WIRE.md, "Setup"): one
// AllgatherWithin of every rank's settings row (its tag, chunk size,
// whether it asks for NCCL, and whether it failed to set up its part:
// localErr). Each row sits at its sender's place, so a rank speaks only
// for itself: every rank reads the same rows and fails alike, with its
// own error when it failed, else naming the lowest rank that failed, a
// row that breaks the format or the first rank that disagrees with rank
// 0.
func (x *Exchanger) agreeSettings(localErr error, wantNCCL bool, edit func([]int64)) error {
	row := make([]int64, settingWords)
	row[settingTag], row[settingChunk] = int64(x.o.Tag), x.lim.chunk
	if wantNCCL {
		row[settingNCCL] = 1
	}
	if localErr != nil {
		row[settingFailed] = 1
	}
	if edit != nil {
		edit(row)
	}
	all := make([]int64, settingWords*x.size)
	if err := cluster.AllgatherWithin(x.comm, row, all, x.lim.timeout); err != nil {
		return errors.Join(localErr, stepError("new: settings", err))
	}
	if localErr != nil {
		return localErr
	}
	rows := make([][]int64, x.size)
	for r := range rows {
		rows[r] = all[r*settingWords : (r+1)*settingWords]
	}
	for r, v := range rows {
		if f := v[settingFailed]; f != 0 && f != 1 || v[settingNCCL] != 0 && v[settingNCCL] != 1 {
			return fmt.Errorf("msg: new: rank %d's settings row %v breaks the format (its failure and NCCL words are 0 or 1): %w", r, v, ErrMalformed)
		}
	}
	for r, v := range rows {
		if v[settingFailed] == 1 {
			return fmt.Errorf("msg: new: rank %d could not set up its exchanger (its own error says why): %w", r, ErrPeerAborted)
		}
	}
	first := rows[0]
	for r, v := range rows {
		switch {
		case v[settingTag] != first[settingTag]:
			return fmt.Errorf("msg: new: ranks disagree on the tag: rank 0 has %d, rank %d has %d; set it alike everywhere: %w",
				first[settingTag], r, v[settingTag], distbuf.ErrInvalid)
		case v[settingChunk] != first[settingChunk]:
			return fmt.Errorf("msg: new: ranks disagree on the chunk size: rank 0 has %s, rank %d has %s; set it alike everywhere: %w",
				chunkName(first[settingChunk]), r, chunkName(v[settingChunk]), distbuf.ErrInvalid)
		case v[settingNCCL] != first[settingNCCL]:
			return fmt.Errorf("msg: new: some ranks ask for TransportNCCL and some do not (rank 0: %v, rank %d: %v); set it alike everywhere: %w",
				first[settingNCCL] == 1, r, v[settingNCCL] == 1, distbuf.ErrInvalid)
		}
	}
	return nil
}

// chunkName shows a chunk size as a settings row carries it.
func chunkName(c int64) string {
	if c == maxChunk {
		return "none (messages never cut)"
	}
	return fmt.Sprintf("%d bytes", c)
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

// Close waits for the exchanger's copies, lets go of its routes
// (collective over the node, a bounded barrier: every rank first lets go
// of what it opened of its peers' windows, then frees its own; after a
// timeout the windows stay allocated), drains and completes what failed
// exchanges left (waiting up to the timeout), destroys its streams and
// frees its communicator (MPI_Comm_free, collective: every rank closes its
// exchanger). Buffers received earlier stay valid and the caller's. After a
// failure that ends the job, abort it (cluster.Abort) rather than Close:
// the other ranks may never reach their Close.
func (x *Exchanger) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.closedErr("close"); err != nil {
		return err
	}
	x.closed = true
	errs := []error{x.tr.close()}
	for _, r := range x.steps {
		errs = append(errs, r.detach())
	}
	// Every rank of the node, also one without node-local routes: no
	// window is freed before every peer has let go of it. A rank not heard
	// from may still hold this rank's windows open: they stay allocated.
	if err := x.comm.Local().BarrierWithin(x.lim.timeout); err != nil {
		errs = append(errs, stepError("close: the node's barrier (this rank's node-local windows stay allocated)", err))
	} else {
		for _, r := range x.steps {
			errs = append(errs, r.close())
		}
	}
	errs = append(errs, x.drainLeft(), x.completeLeftover(x.lim.timeout), x.closeStreams(), x.comm.Free())
	return errors.Join(errs...)
}

// drainLeft drains what failed exchanges left unmatched on the exchanger's
// communicator (a message a rank sent after the others gave up on it),
// before the communicator is freed: an MPI may give a later communicator
// the freed one's context, where such a message would be taken for one of
// its own.
func (x *Exchanger) drainLeft() error {
	probe := &cluster.Probe{Comm: x.comm, Source: cluster.AnySource, Tag: cluster.AnyTag}
	for {
		_, m, err := cluster.Await(nil, nil, probe, 0)
		if err != nil || m == nil {
			return err
		}
		r, err := m.Discard()
		if err != nil {
			return fmt.Errorf("msg: close: a message left by a failed exchange: %w", err)
		}
		x.stats.Drained++
		x.leftover = append(x.leftover, r)
	}
}

// completeLeftover completes the requests failed exchanges left behind
// that MPI has completed, waiting up to timeout (none: 0; no limit:
// negative) for the rest; an error names those still pending then.
func (x *Exchanger) completeLeftover(timeout time.Duration) error {
	start := time.Now()
	for len(x.leftover) > 0 {
		wait := timeout
		if timeout > 0 {
			wait = max(timeout-time.Since(start), 0)
		}
		done, _, err := cluster.Await(x.leftover, nil, nil, wait)
		if err != nil {
			return fmt.Errorf("msg: the requests of a failed exchange: %w", err)
		}
		for i := len(done) - 1; i >= 0; i-- {
			k := done[i]
			_, _ = x.leftover[k].Wait() // completed: its outcome was the failed exchange's
			x.leftover = slices.Delete(x.leftover, k, k+1)
		}
		if len(done) == 0 {
			break
		}
	}
	if n := len(x.leftover); n > 0 && timeout != 0 {
		return fmt.Errorf("msg: %d MPI requests of a failed exchange did not complete within %v (their memory stays held): %w", n, timeout, ErrTimeout)
	}
	return nil
}

// closedErr is the error of op on a closed exchanger, nil on an open one.
func (x *Exchanger) closedErr(op string) error {
	if x.closed {
		return fmt.Errorf("msg: %s: %w", op, distbuf.ErrClosed)
	}
	return nil
}

// Stats returns the counters.
func (x *Exchanger) Stats() Stats {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.stats
}

// Epoch is the number of exchanges run so far; the next one carries
// Epoch()+1 in its headers.
func (x *Exchanger) Epoch() uint64 { return uint64(x.Stats().Exchanges) }

// Tag is the MPI tag of the exchanger's messages.
func (x *Exchanger) Tag() int { return x.o.Tag }

// ChunkBytes is the chunk size; 0 means messages are never cut.
func (x *Exchanger) ChunkBytes() int64 {
	if x.lim.chunk == maxChunk {
		return 0
	}
	return x.lim.chunk
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
// each message on its peer's route (Routes): as one MPI message (cut into
// chunks only above the chunk size), or through a node-local window or
// read and an MPI notice, while what arrives is matched by probe and
// received once its length is known, with at most Window requests of each
// direction outstanding. An agreement (one more Alltoall) ends the
// exchange on every rank: see the package documentation, "Failures".
//
// The send buffers must not be written until Exchange returns; then they
// are the caller's again. Allocate them with AllocSend (or JoinSend's
// layout): each has room for its manifest before the blocks, and works on
// every backend and route. A message is sent from its buffer itself,
// without a copy, when the buffer is host memory, or device memory handed
// to a CUDA-aware MPI; such a buffer needs room for its manifest before
// its Start (64 bytes, 32 per block, rounded up to 256: docs/WIRE.md), and
// one without that room (packing.Alloc) is refused with distbuf.ErrInvalid,
// naming AllocSend. Device memory without a CUDA-aware MPI is staged
// through pinned memory, room or not, and the message to this rank itself
// is a copy that needs no room.
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
	if err := x.closedErr("exchange"); err != nil {
		return nil, err
	}
	if pat != nil && pat.x != x {
		return nil, fmt.Errorf("msg: exchange: pattern of another exchanger: %w", distbuf.ErrInvalid)
	}
	// Every exchange, failed ones included, advances the epoch on every
	// rank alike.
	x.stats.Exchanges++
	return x.tr.exchange(x.begin(pat), send)
}
