package msg

import (
	"errors"
	"fmt"
	"slices"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/packing"
)

// mpiTransport runs exchanges over MPI: one message per peer, cut into
// chunks above the chunk size, except between ranks of one node where a
// node-local route applies (route).
type mpiTransport struct {
	x *Exchanger
	// ncclWhy says why TransportNCCL, when asked for, was not honoured.
	ncclWhy string
}

func (t *mpiTransport) describe() (string, string) {
	aware, _ := cluster.CUDAAware()
	if aware && t.x.o.Transport != TransportStaged {
		return "cuda-aware mpi", t.ncclWhy
	}
	return "staged", t.ncclWhy
}

func (t *mpiTransport) close() error { return nil }

// exchange runs e, top to bottom: each peer's layout (collect), the count
// exchange or the pattern's counts, the receive buffers, each peer's
// message prepared on its route in schedule order, the data phase (run,
// sched.go), and the agreement.
func (t *mpiTransport) exchange(e *exchange, send []*packing.Coalesced) (*Received, error) {
	x, pat := t.x, e.pat
	aware, err := cluster.CUDAAware()
	e.aware = aware && (x.o.Transport == TransportAuto || x.o.Transport == TransportMPI)
	byDest, localErr := e.collect(send)
	localErr = errors.Join(err, localErr)

	n := x.size
	recvSize, abortTo := e.recvSize, e.abortTo
	if pat != nil && pat.learned {
		copy(recvSize, pat.recvSize)
		e.checkPattern(byDest, localErr != nil, abortTo)
	} else {
		e.announce(byDest, localErr != nil)
		if x.hooks.announce != nil {
			x.hooks.announce(e.sendSize)
		}
		if err := cluster.Alltoall(x.comm, e.sendSize, recvSize); err != nil {
			// The collective itself failed: nothing was posted, nothing can be.
			return nil, errors.Join(localErr, fmt.Errorf("msg: count exchange: %w", err))
		}
		x.stats.CountExchanges++
		if localErr != nil {
			// Every rank saw -1 from this one: nobody sends here or expects
			// anything from here. What arrives all the same is a stray.
			clear(recvSize)
			clear(byDest)
		}
		e.checkCounts(byDest)
	}
	e.fail(localErr)
	if x.ipc != nil {
		if err := e.ipcPlace(byDest); err != nil {
			// No message goes through the window: an abort notice replaces each.
			e.fail(err)
			for d := range byDest {
				if x.ipc.peers[d] && byDest[d] != nil {
					abortTo[d] = true
				}
			}
		}
	}

	// Receives: one pooled buffer per source (one for all that come
	// through windows), allocated before anything is enqueued on the
	// receive stream so that waiting for the allocation waits for nothing
	// else.
	e.allocJoint(recvSize)
	for k := range n {
		s := (x.rank - k + n) % n
		if recvSize[s] <= 0 || (s == x.rank && !x.o.SelfViaMPI) {
			continue
		}
		e.ins = append(e.ins, e.newRecv(s, k, recvSize[s]))
	}
	if x.hooks.beforePost != nil {
		x.hooks.beforePost(e)
	}
	e.writeManifests(byDest)
	// Sends, in schedule order; an abort notice replaces what cannot be sent.
	windowed := false
	for k := range n {
		d := (x.rank + k) % n
		m := byDest[d]
		switch {
		case d == x.rank && !x.o.SelfViaMPI:
			continue // a local copy, or nothing: no MPI message to wait for
		case abortTo[d]:
			e.outs = append(e.outs, e.newAbort(d, k, pat.sendSize[d]))
			continue
		case m == nil:
			continue
		}
		m.step = k
		prepare, replace := e.route(d)
		windowed = windowed || x.ipcPeer(d)
		if err := prepare(m); err != nil {
			e.fail(err)
			m = e.newAbort(d, k, m.size)
		} else if x.hooks.pieces != nil {
			if x.ipcPeer(d) {
				// The hook takes the notice's bytes: its copies go first.
				if failed, err := e.flushToWindow(); err != nil {
					e.fail(err)
					for _, f := range failed {
						m = e.abortWindowed(f) // f is m: each earlier one was flushed alone
					}
				}
			}
			if !m.abort {
				m = replace(m)
			}
		}
		e.outs = append(e.outs, m)
	}
	if windowed {
		// Before any notice goes out: a receiver's copy waits for this.
		if failed, err := e.flushToWindow(); err != nil {
			e.fail(err)
			for _, m := range failed {
				k := slices.Index(e.outs, m)
				e.outs[k] = e.abortWindowed(m)
			}
		}
		if err := e.ipcReady(); err != nil {
			e.fail(e.outErr(x.rank, "node-local window", err))
		}
	}
	if x.hooks.extra != nil {
		for d := range n {
			if ps := x.hooks.extra(d); ps != nil {
				e.outs = append(e.outs, e.newRaw(d, n+d, ps))
			}
		}
	}
	var self *outMsg // delivered by run once the MPI requests are posted
	if m := byDest[x.rank]; m != nil && !x.o.SelfViaMPI && !abortTo[x.rank] {
		self = m
	}

	e.run(self)
	if x.ipc != nil {
		if err := e.ipcConsumed(); err != nil {
			e.fail(fmt.Errorf("msg: node-local windows: %w", err))
		}
	}
	e.agree()
	e.releaseReads()
	x.layouts.endExchange(len(e.errs) > 0)

	return e.deliver(byDest, recvSize)
}

// route picks how the message to rank d travels: copied into this rank's
// window for a node-local peer on the device (ipc.go), read from this
// rank's memory by a node-local peer on the host (reads.go), or sent as MPI
// messages (out.go). It returns the step that prepares the message and the
// one that hands its bytes to the pieces test hook.
func (e *exchange) route(d int) (prepare func(m *outMsg) error, replace func(m *outMsg) *outMsg) {
	switch x := e.x; {
	case x.ipcPeer(d):
		return e.prepareIPC, e.replaceNotice
	case x.readPeer(d):
		return e.prepareRead, e.replaceReadNotice
	}
	return e.prepareOut, e.replacePieces
}
