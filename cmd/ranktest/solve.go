package main

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/msg"
	"github.com/distbuf/distbuf/packing"
)

// solver runs one rank's synthetic solves. The block structure (the plans)
// is fixed for the run, as the sparsity of a DMRG sweep repeats; each solve
// allocates, stages, multiplies, exchanges, verifies and frees anew.
type solver struct {
	cfg        config
	world      *cluster.Comm
	rank, size int
	a          *devalloc.Allocator
	s          *devalloc.Stream
	eng        *gemm.Engine
	shape      workloadShape

	specs               []blockSpec
	planA, planB, planC *packing.Plan
	// stageA and stageB hold the operands in pinned host memory, filled
	// once: each solve moves them to the device with one copy each.
	stageA, stageB *packing.Coalesced

	peerSpecs map[int][]blockSpec
	refs      map[refKey][]float64
	incoming  []incomingBlock // blocks other ranks send here, in a fixed order

	blockPlans [][3]*packing.Plan // -mode perblock: one plan per operand and block

	ex      *msg.Exchanger // -mode packed
	pattern *msg.Pattern
}

type refKey struct {
	src int
	id  uint64
}

// incomingBlock is a block this rank receives: from rank src, its id there.
type incomingBlock struct {
	src int
	id  uint64
	sp  blockSpec
}

// iterStats is one solve on one rank.
type iterStats struct {
	solveUS, verifyUS float64
	allocCalls        int64
	gemmLaunches      int64
	messages          int64
	bytesMoved        int64
	verifyFailures    int64
	firstFailure      string
}

func newSolver(cfg config, world *cluster.Comm, a *devalloc.Allocator) (*solver, error) {
	sv := &solver{cfg: cfg, world: world, rank: world.Rank(), size: world.Size(), a: a, s: a.DefaultStream(),
		shape: defaultShape, peerSpecs: map[int][]blockSpec{}, refs: map[refKey][]float64{}}
	if cfg.blocks > 0 {
		sv.shape.blocks = cfg.blocks
	}
	for src := range sv.size {
		sv.peerSpecs[src] = specsFor(cfg.seed, src, sv.size, sv.shape)
		for id, sp := range sv.peerSpecs[src] {
			if sp.dest == sv.rank {
				sv.incoming = append(sv.incoming, incomingBlock{src: src, id: uint64(id), sp: sp})
			}
		}
	}
	sv.specs = sv.peerSpecs[sv.rank]
	var err error
	if sv.planA, sv.planB, sv.planC, err = plans(sv.specs); err != nil {
		return nil, err
	}
	if sv.eng, err = gemm.NewEngine(sv.s, gemm.EngineOptions{}); err != nil {
		return nil, err
	}
	if sv.stageA, err = sv.stage(sv.planA, 0); err == nil {
		sv.stageB, err = sv.stage(sv.planB, 1)
	}
	if err != nil {
		return nil, errors.Join(err, sv.close())
	}
	return sv, nil
}

// stage fills a pinned buffer with operand which of every block.
func (sv *solver) stage(p *packing.Plan, which int) (*packing.Coalesced, error) {
	c, err := packing.AllocPinned(sv.a, p, 0, sv.s)
	if err != nil {
		return nil, err
	}
	w, err := c.Write(sv.s)
	if err != nil {
		return nil, errors.Join(err, c.Free())
	}
	err = sv.s.Enqueue(func() error {
		for k, v := range c.All() {
			f, err := v.Float64s()
			if err != nil {
				return err
			}
			operand(f, sv.cfg.seed, sv.rank, uint64(k), which)
		}
		return nil
	})
	return c, errors.Join(err, w.Done(), sv.s.Synchronize())
}

func (sv *solver) close() error {
	var errs []error
	for _, c := range []*packing.Coalesced{sv.stageA, sv.stageB} {
		if c != nil {
			errs = append(errs, c.Free())
		}
	}
	if sv.eng != nil {
		errs = append(errs, sv.eng.Close())
	}
	if sv.ex != nil {
		errs = append(errs, sv.ex.Close())
	}
	return errors.Join(errs...)
}

// ref returns A*B of block id of rank src, computed once.
func (sv *solver) ref(src int, id uint64, sp blockSpec) []float64 {
	k := refKey{src, id}
	if r, ok := sv.refs[k]; ok {
		return r
	}
	r := reference(sv.cfg.seed, src, id, sp)
	sv.refs[k] = r
	return r
}

// check verifies one received block and records the first failure.
func (sv *solver) check(st *iterStats, src int, id uint64, got []float64, iter int) {
	specs := sv.peerSpecs[src]
	if id >= uint64(len(specs)) || specs[id].dest != sv.rank {
		st.verifyFailures++
		if st.firstFailure == "" {
			st.firstFailure = fmt.Sprintf("rank %d: block %d from rank %d was not meant for this rank", sv.rank, id, src)
		}
		return
	}
	sp := specs[id]
	if corruptHook != nil {
		corruptHook(src, id, got)
	}
	if err := verifyBlock(got, sv.ref(src, id, sp), alphaFor(iter)); err != nil {
		st.verifyFailures++
		if st.firstFailure == "" {
			st.firstFailure = fmt.Sprintf("rank %d: block %d from rank %d (%dx%d): %v", sv.rank, id, src, sp.m, sp.n, err)
		}
	}
}

// hostView returns a host-accessible copy of buf's bytes [off, off+n): the
// buffer itself when Go can read it, else a pinned copy made on the stream.
// release frees the copy.
func (sv *solver) hostView(buf *devalloc.Buffer, off, n int64) (mem []byte, release func() error, err error) {
	if buf.Location().HostAccessible() {
		h, err := buf.Hold(devalloc.Read)
		if err != nil {
			return nil, nil, err
		}
		if err := h.Wait(); err != nil {
			return nil, nil, errors.Join(err, h.Release())
		}
		all, err := buf.Bytes()
		if err != nil {
			return nil, nil, errors.Join(err, h.Release())
		}
		return all[off : off+n], h.Release, nil
	}
	p, err := sv.a.AllocPinned(n, sv.s)
	if err != nil {
		return nil, nil, err
	}
	if err := sv.s.Copy(p, 0, buf, off, n); err != nil {
		return nil, nil, errors.Join(err, p.Free())
	}
	if err := sv.s.Synchronize(); err != nil {
		return nil, nil, errors.Join(err, p.Free())
	}
	mem, err = p.Bytes()
	if err != nil {
		return nil, nil, errors.Join(err, p.Free())
	}
	return mem, p.Free, nil
}

func float64s(b []byte) []float64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// multiply runs C[g] = alpha*A*B for every destination group.
func (sv *solver) multiply(A, B *packing.Coalesced, Cs []*packing.Coalesced, alpha float64, strategy gemm.Strategy) (launches int64, err error) {
	for g, C := range Cs {
		members, err := sv.planC.Members(g)
		if err != nil {
			return launches, err
		}
		triples := make([]gemm.Triple, len(members))
		for pos, idx := range members {
			triples[pos] = gemm.Triple{A: int(idx), B: int(idx), C: pos}
		}
		if len(triples) == 0 {
			continue
		}
		gp, err := gemm.NewPlan(gemm.Problem{A: A, B: B, C: C, Alpha: complex(alpha, 0), Triples: triples}, gemm.Options{Strategy: strategy})
		if err != nil {
			return launches, err
		}
		err = sv.eng.Run(gp)
		launches += int64(gp.Launches())
		if err = errors.Join(err, gp.Close()); err != nil {
			return launches, err
		}
	}
	return launches, nil
}

// iterate runs solve number iter in the configured mode.
func (sv *solver) iterate(iter int) (iterStats, error) {
	before := sv.a.Stats()
	var st iterStats
	var err error
	if sv.cfg.mode == "perblock" {
		err = sv.perBlock(iter, &st)
	} else {
		err = sv.packed(iter, &st)
	}
	if err != nil {
		return st, err
	}
	if err := sv.a.EndPhase(); err != nil {
		return st, err
	}
	st.allocCalls = sv.a.Stats().AllocCalls - before.AllocCalls
	return st, nil
}

// corruptHook lets tests damage a received block just before it is checked.
var corruptHook func(src int, id uint64, vals []float64)

func since(t time.Time) float64 { return float64(time.Since(t).Nanoseconds()) / 1e3 }
