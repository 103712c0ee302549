package msg

import (
	"fmt"
	"slices"
	"strings"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/wire"
)

// Route is how messages between this rank and a peer travel, both ways.
type Route int

const (
	// RouteMPI: MPI messages from and into the buffers themselves (host
	// memory, or device memory with a CUDA-aware MPI).
	RouteMPI Route = iota
	// RouteStaged: MPI messages through pinned host memory, device memory
	// copied out and in on the exchanger's streams (device memory without
	// a CUDA-aware MPI, or TransportStaged).
	RouteStaged
	// RouteWindow: CUDA IPC windows between two ranks of one node on GPUs
	// (docs/WIRE.md, rule 9); MPI carries a notice.
	RouteWindow
	// RouteRead: reads of the sender's memory between two ranks of one
	// node on host memory (docs/WIRE.md, rule 10); MPI carries a notice.
	RouteRead
	// RouteNCCL: NCCL, GPU to GPU (TransportNCCL).
	RouteNCCL
	// RouteSelf: a rank's message to itself, one stream copy without MPI.
	RouteSelf
)

var routeNames = []string{"mpi", "staged", "window", "read", "nccl", "self"}

func (r Route) String() string { return enumName(r, "Route", routeNames) }

// Routes reports, by rank, the route of this rank's messages to that rank
// and of that rank's to this one, and why some peers take none of the
// routes that avoid MPI's copies (RouteNCCL under TransportNCCL; between
// ranks of one node under TransportAuto, RouteWindow for device memory
// and RouteRead for host memory): the options, the node, the system or
// another rank's choice; "" when nothing kept a peer off them.
func (x *Exchanger) Routes() (byPeer []Route, why string) {
	byPeer = make([]Route, x.size)
	_, nccl := x.tr.(*ncclTransport)
	for p := range byPeer {
		switch {
		case p == x.rank && !x.o.SelfViaMPI:
			byPeer[p] = RouteSelf
		case nccl:
			byPeer[p] = RouteNCCL
		default:
			byPeer[p] = x.routes[p].kind()
		}
	}
	return byPeer, x.routesWhy
}

// route moves the messages between this rank and its peers on one data
// path: each peer has one, chosen once by chooseRoutes, and every message
// to or from that peer carries it. A route takes part in every exchange
// through its steps (stepper), once, whatever its peers.
//
// A new route is one file: a type implementing route, and, for a route
// between ranks of one node, nodeRoute, listed in chooseRoutes.
type route interface {
	// kind is what Routes reports for the route's peers.
	kind() Route
	// pieces is how many MPI messages a message of size bytes travels as.
	pieces(size int64) int
	// inPlace reports whether the route sends m from its send buffer
	// itself, the manifest written in the room before the blocks
	// (writeManifests).
	inPlace(e *exchange, m *outMsg) bool
	// prepare readies m, this rank's message to one of the route's peers,
	// for posting: its manifest written and its chunks set. When it fails,
	// an abort notice replaces m.
	prepare(e *exchange, m *outMsg) error
	// alloc takes the receive memory of in, a message from one of the
	// route's peers, and sizes its piece records.
	alloc(e *exchange, in *inMsg) error
	// recvMem returns the memory that piece i of in, n bytes long as MPI
	// reports it (no longer than the piece), is received into, and what
	// its request releases when it completes.
	recvMem(e *exchange, in *inMsg, i int, n int64) (cluster.Memory, cluster.Releaser, error)
	// sent hears that the send of chunk i of m, a message of the route,
	// completed (or failed).
	sent(e *exchange, m *outMsg, i int)
	// done handles the completion of piece i of in (received, discarded or
	// failed: in.chunks[i] says), and ends the message once its pieces are
	// in (e.endIn or e.wrapResult).
	done(e *exchange, in *inMsg, i int)
	stepper
}

// stepper is a route's part in each exchange, in this order.
type stepper interface {
	// sized: the counts are known, before the receive buffers are taken
	// and the sends prepared.
	sized(e *exchange)
	// prepared: every message is prepared, before the first is posted.
	prepared(e *exchange)
	// waited: after each wait of the data phase.
	waited(e *exchange)
	// received: the data phase is over, before the agreement.
	received(e *exchange)
	// agreed: after the agreement.
	agreed(e *exchange)
	// detach lets go of what the route holds of its peers': Exchanger.Close
	// calls it on every route, then waits for every rank of the node
	// before it closes them.
	detach() error
	// close lets go of what the route holds.
	close() error
}

// noSteps is the stepper of a route that takes no part beyond its
// messages.
type noSteps struct{}

func (noSteps) sent(*exchange, *outMsg, int) {}
func (noSteps) sized(*exchange)              {}
func (noSteps) prepared(*exchange)           {}
func (noSteps) waited(*exchange)             {}
func (noSteps) received(*exchange)           {}
func (noSteps) agreed(*exchange)             {}
func (noSteps) detach() error                { return nil }
func (noSteps) close() error                 { return nil }

// nodeRoute is a route between ranks of one node, which the ranks set up
// together in New: every rank offers what it can in its row of one
// Allgather over the node (docs/WIRE.md, "Setup"), every route checks
// what it needs of the rows offered to it, the ranks learn together
// whether every check passed, and every route then says which peers it
// serves.
type nodeRoute interface {
	route
	// bit is the setup row's flag of the route.
	bit() uint64
	// offer puts what this rank offers into its row; a route that cannot
	// be used here leaves the row alone.
	offer(row *wire.SetupRow)
	// check tries, from every rank's row of the node, what this rank needs
	// of the peers that offer the route (opening their events, reading
	// their probe words): false and why when something fails. A rank that
	// did not offer the route passes. No collective.
	check(x *Exchanger, rows []wire.SetupRow) (ok bool, why string)
	// join decides the peers this rank reaches on the route, or why none,
	// once it is known whether every rank of the node passed its check
	// (all).
	join(x *Exchanger, rows []wire.SetupRow, all bool) (peers []int, why string)
}

// chooseRoutes gives every peer its route, once, collectively over the
// node (the setup of docs/WIRE.md, "Setup"): the first node-local route
// that serves the peer, in order of preference, else MPI, direct or
// staged. Every rank joins the setup, whatever its options. edit, a test's,
// alters this rank's row before it is sent.
func (x *Exchanger) chooseRoutes(wantNCCL bool, edit func(*wire.SetupRow)) error {
	mpi := &mpiRoute{staged: x.a.Info().Backend == devalloc.BackendCUDA && !x.aware, chunk: x.lim.chunk, x: x}
	if mpi.staged {
		mpi.stage = newStager(x.a, x.lim.chunk)
	}
	auto := x.o.Transport == TransportAuto && !wantNCCL
	candidates := []nodeRoute{
		newWindowRoute(x, auto),
		newReadRoute(x, auto),
	}
	routes, whys, err := x.setUpNode(candidates, edit)
	if err != nil {
		for _, c := range candidates {
			_ = c.close()
		}
		return fmt.Errorf("msg: new: node-local setup: %w", err)
	}
	for p := range routes {
		if routes[p] == nil {
			routes[p] = mpi
		}
	}
	x.setRoutes(routes)
	// Routes a rank cannot use take part in no exchange: closed now.
	for _, c := range candidates {
		if !x.uses(c) {
			_ = c.close()
		}
	}
	x.routesWhy = strings.Join(whys, "; ")
	return nil
}

// setUpNode runs the node-local setup: the Allgather of the rows, checked
// against their senders, then, when some route is offered by two rows or
// more, one AllreduceWithin(MIN) of every route's check over the node.
// It returns the route of each peer a node-local route serves.
func (x *Exchanger) setUpNode(candidates []nodeRoute, edit func(*wire.SetupRow)) ([]route, []string, error) {
	local := x.comm.Local()
	row := wire.SetupRow{Rank: x.rank}
	for _, c := range candidates {
		c.offer(&row)
	}
	if edit != nil {
		edit(&row)
	}
	mine := make([]int64, wire.SetupRowWords)
	row.Encode(mine)
	all := make([]int64, wire.SetupRowWords*local.Size())
	if err := cluster.AllgatherWithin(local, mine, all, x.lim.timeout); err != nil {
		return nil, nil, stepError("node-local setup", err)
	}
	rows, err := wire.DecodeSetupRows(all, x.localRanks(), x.size)
	if err != nil {
		return nil, nil, err
	}
	checks := make([]int64, len(candidates))
	checked := false
	var whys []string
	for i, c := range candidates {
		ok, why := c.check(x, rows)
		if ok {
			checks[i] = 1
		}
		if why != "" {
			whys = append(whys, why)
		}
		checked = checked || offeredBy(rows, c.bit()) >= 2
	}
	if checked {
		if err := cluster.AllreduceWithin(local, checks, checks, cluster.Min, x.lim.timeout); err != nil {
			return nil, nil, stepError("node-local setup: the checks", err)
		}
	}
	routes := make([]route, x.size)
	for i, c := range candidates {
		// Anything but 1 (a peer's word outside 0 and 1 included) is a
		// failed check.
		peers, why := c.join(x, rows, checks[i] == 1)
		for _, p := range peers {
			if routes[p] == nil {
				routes[p] = c
			}
		}
		if why != "" && !slices.Contains(whys, why) {
			whys = append(whys, why)
		}
	}
	return routes, whys, nil
}

// offeredBy counts the rows with the flag bit set.
func offeredBy(rows []wire.SetupRow, bit uint64) int {
	n := 0
	for _, row := range rows {
		if row.Flags&bit != 0 {
			n++
		}
	}
	return n
}

// localRanks is, for each rank of the node-local communicator, its rank
// in the exchanger's: whom each row of the node-local setup comes from.
func (x *Exchanger) localRanks() []int {
	world := x.comm.WorldRanks()
	inComm := make(map[int]int, len(world))
	for r, w := range world {
		inComm[w] = r
	}
	local := x.comm.Local().WorldRanks()
	out := make([]int, len(local))
	for i, w := range local {
		out[i] = inComm[w]
	}
	return out
}

// setRoutes makes routes the peers' routes, and lists each route once for
// its steps.
func (x *Exchanger) setRoutes(routes []route) {
	x.routes, x.steps = routes, x.steps[:0]
	for _, r := range routes {
		if !x.uses(r) {
			x.steps = append(x.steps, r)
		}
	}
}

// uses reports whether r is listed for its steps.
func (x *Exchanger) uses(r route) bool {
	for _, s := range x.steps {
		if s == r {
			return true
		}
	}
	return false
}

// pieceCount is how many MPI messages a message of size bytes to or from
// peer travels as.
func (x *Exchanger) pieceCount(peer int, size int64) int { return x.routes[peer].pieces(size) }
