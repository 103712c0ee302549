package msg

import (
	"errors"

	"github.com/distbuf/distbuf/cluster"
)

// mpiRoute carries every message as MPI messages, one per chunk: sent
// from the send buffer itself when it is host memory or device memory MPI
// takes as it is (CUDA-aware), else staged through pinned memory
// (staged.go); received straight into the receive buffer, or, with
// staged, through pinned chunks copied into device memory.
type mpiRoute struct {
	staged bool
	chunk  int64   // the exchanger's chunk size
	stage  *stager // the staging rings, when staged and the chunks fit them
	x      *Exchanger
	noSteps
}

func (r *mpiRoute) kind() Route {
	if r.staged {
		return RouteStaged
	}
	return RouteMPI
}

func (r *mpiRoute) pieces(size int64) int { return chunkCount(size, r.chunk) }

func (r *mpiRoute) inPlace(e *exchange, m *outMsg) bool {
	return m.c.Buffer().Location().HostAccessible() || e.x.aware
}

func (r *mpiRoute) prepare(e *exchange, m *outMsg) error {
	if r.inPlace(e, m) {
		return e.prepareInPlace(m)
	}
	return r.prepareStaged(e, m)
}

func (r *mpiRoute) alloc(e *exchange, in *inMsg) error {
	x := e.x
	if r.staged {
		buf, err := x.a.Alloc(in.size, x.recvS)
		if err != nil {
			return err
		}
		in.buf = buf
	} else if err := e.allocHeld(in); err != nil {
		return err
	}
	in.chunks = resize(in.chunks, int(in.pieces))
	for i := range in.chunks {
		sp := chunkAt(in.size, x.lim.chunk, i)
		in.chunks[i].off, in.chunks[i].n = sp.off, sp.n
	}
	return nil
}

func (r *mpiRoute) recvMem(e *exchange, in *inMsg, i int, n int64) (cluster.Memory, cluster.Releaser, error) {
	if r.staged {
		return r.stagingChunk(e, in, i)
	}
	ch := &in.chunks[i]
	ch.region = bufRegion{in.buf, in.base + ch.off, ch.n}
	return &ch.region, nil, nil
}

// detach waits for the staging copies, so that close may free the rings.
func (r *mpiRoute) detach() error {
	if r.stage == nil {
		return nil
	}
	return errors.Join(r.x.sendS.Synchronize(), r.x.recvS.Synchronize())
}

func (r *mpiRoute) close() error {
	if r.stage == nil {
		return nil
	}
	return r.stage.close()
}

func (r *mpiRoute) done(e *exchange, in *inMsg, i int) {
	if r.staged {
		r.stagedDone(e, in)
		return
	}
	if in.finished++; in.finished == in.pieces {
		in.releaseHold()
		e.finishDirect(in, true)
	}
}
