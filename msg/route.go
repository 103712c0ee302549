package msg

import (
	"fmt"
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
// Allgather over the node (docs/WIRE.md, "Setup"), then every route reads
// every row and says which peers it serves.
type nodeRoute interface {
	route
	// offer puts what this rank offers into its row; a route that cannot
	// be used here leaves the row alone.
	offer(row *wire.SetupRow)
	// join decides, from every rank's row of the node, the peers this
	// rank reaches on the route, or why none. It is collective over local:
	// every rank calls it for every route, whatever it offered.
	join(x *Exchanger, local *cluster.Comm, rows []wire.SetupRow) (peers []int, why string, err error)
}

// chooseRoutes gives every peer its route, once, collectively over the
// node (the setup of docs/WIRE.md, "Setup"): the first node-local route
// that serves the peer, in order of preference, else MPI, direct or
// staged. Every rank joins the setup, whatever its options.
func (x *Exchanger) chooseRoutes(wantNCCL bool) error {
	mpi := &mpiRoute{staged: x.a.Info().Backend == devalloc.BackendCUDA && !x.aware, chunk: x.lim.chunk, x: x}
	if mpi.staged {
		mpi.stage = newStager(x.a, x.lim.chunk)
	}
	auto := x.o.Transport == TransportAuto && !wantNCCL
	candidates := []nodeRoute{
		newWindowRoute(x, auto),
		newReadRoute(x, auto),
	}
	local := x.comm.Local()
	row := wire.SetupRow{Rank: x.rank}
	for _, c := range candidates {
		c.offer(&row)
	}
	mine := make([]int64, wire.SetupRowWords)
	row.Encode(mine)
	all := make([]int64, wire.SetupRowWords*local.Size())
	err := cluster.Allgather(local, mine, all)
	rows := make([]wire.SetupRow, local.Size())
	for i := range rows {
		if err == nil {
			rows[i], err = wire.DecodeSetupRow(all[i*wire.SetupRowWords:], x.size)
		}
	}
	routes := make([]route, x.size)
	var whys []string
	for _, c := range candidates {
		var peers []int
		var why string
		if err == nil {
			peers, why, err = c.join(x, local, rows)
		}
		for _, p := range peers {
			if routes[p] == nil {
				routes[p] = c
			}
		}
		if why != "" {
			whys = append(whys, why)
		}
	}
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
