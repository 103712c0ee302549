package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/gemm"
	"github.com/distbuf/distbuf/packing"
)

// perBlock is the baseline the packed solve is measured against: every block
// is its own allocation (A, B and C each), its own host-to-device copy, its
// own GEMM plan and launch and its own MPI message. Its phases are the same
// kinds of work as packed's, summed over the blocks.
func (sv *solver) perBlock(iter int, st *iterStats) (err error) {
	l, fresh, planUS, err := sv.layoutFor(iter)
	if err != nil {
		return err
	}
	st.fresh = fresh
	st.phase[phAlloc] = planUS
	specs, incoming := l.bond.specs, l.bond.incoming
	maxTag, err := cluster.MaxTag()
	if err != nil {
		return err
	}
	if len(specs) > maxTag {
		return fmt.Errorf("-mode perblock tags each message with its block id: %d blocks exceed the MPI tag limit %d", len(specs), maxTag)
	}
	var mem solveMemory
	if sv.cfg.fresh {
		mem.layout = l
		defer func() { err = errors.Join(err, sv.harness(l.freeStaging)) }()
	}
	defer func() {
		if !mem.freed {
			err = errors.Join(err, mem.free())
		}
	}()
	t := time.Now()
	if l.blockPlans == nil {
		if err := l.perBlockPlans(); err != nil {
			return err
		}
	}
	st.phase[phAlloc] += lap(&t)
	alloc := func(p *packing.Plan) (*packing.Coalesced, error) {
		c, err := packing.Alloc(sv.a, p, sv.s)
		if err == nil {
			mem.coalesced = append(mem.coalesced, c)
		}
		return c, err
	}
	alpha := alphaFor(iter)
	device := sv.a.Info().Backend == devalloc.BackendCUDA
	cudaAware, _ := cluster.CUDAAware()

	// Receives first: one message per incoming block, into host-accessible
	// memory (pinned on a GPU).
	recvs := make([]*devalloc.Buffer, len(incoming))
	var reqs []*cluster.Request
	for i, in := range incoming {
		b, err := sv.a.AllocPinned(int64(in.sp.m*in.sp.n*8), sv.s)
		if err != nil {
			return err
		}
		mem.buffers = append(mem.buffers, b)
		recvs[i] = b
		st.phase[phAlloc] += lap(&t)
		r, err := sv.post(b, devalloc.Write, func() (*cluster.Request, error) { return sv.world.Irecv(b, in.src, int(in.id)) })
		if err != nil {
			return err
		}
		reqs = append(reqs, r)
		st.phase[phExchange] += lap(&t)
	}

	offA, offB := l.stageA.Buffer(), l.stageB.Buffer()
	for k, bp := range l.blockPlans {
		A, err := alloc(bp[0])
		if err != nil {
			return err
		}
		B, err := alloc(bp[1])
		if err != nil {
			return err
		}
		C, err := alloc(bp[2])
		if err != nil {
			return err
		}
		st.phase[phAlloc] += lap(&t)
		va, _ := l.stageA.View(k)
		vb, _ := l.stageB.View(k)
		if err := sv.s.Copy(A.Buffer(), 0, offA, l.stageA.Start()+va.Offset(), va.Desc().Bytes()); err != nil {
			return err
		}
		if err := sv.s.Copy(B.Buffer(), 0, offB, l.stageB.Start()+vb.Offset(), vb.Desc().Bytes()); err != nil {
			return err
		}
		st.phase[phUpload] += lap(&t)
		gp, err := gemm.NewPlan(gemm.Problem{A: A, B: B, C: C, Alpha: complex(alpha, 0), Triples: []gemm.Triple{{}}}, gemm.Options{Strategy: gemm.Loop})
		if err != nil {
			return err
		}
		sv.plansBuilt++
		st.phase[phPlan] += lap(&t)
		err = sv.eng.Run(gp)
		st.gemmLaunches += int64(gp.Launches())
		if err = errors.Join(err, gp.Close()); err != nil {
			return err
		}
		st.phase[phGemm] += lap(&t)
		send := C.Buffer()
		if device && !cudaAware {
			// One staging copy per message when MPI cannot read the GPU.
			p, err := sv.a.AllocPinned(send.Size(), sv.s)
			if err != nil {
				return err
			}
			mem.buffers = append(mem.buffers, p)
			if err := sv.s.Copy(p, 0, send, 0, send.Size()); err != nil {
				return err
			}
			send = p
		}
		dest, n := specs[k].dest, int64(specs[k].m*specs[k].n*8)
		r, err := sv.post(send, devalloc.Read, func() (*cluster.Request, error) { return sv.world.Isend(cluster.Sub(send, 0, n), dest, k) })
		if err != nil {
			return err
		}
		reqs = append(reqs, r)
		st.messages++
		st.bytesMoved += n
		st.phase[phExchange] += lap(&t)
	}
	if err := cluster.Waitall(reqs); err != nil {
		return err
	}
	st.phase[phExchange] += lap(&t)

	vstart := time.Now()
	for i, in := range incoming {
		mem, err := recvs[i].Bytes()
		if err != nil {
			return err
		}
		sv.check(st, l.bond, in.src, in.id, float64s(mem), iter)
	}
	st.verifyUS = since(vstart)
	t = time.Now()
	err = mem.free()
	st.phase[phFree] = lap(&t)
	st.workingSet = mem.peakBytes
	return err
}

// post takes a hold of the given mode on b, waits for the stream work it
// must follow, starts the request and attaches the hold to it, so b cannot
// be released or reused before the request completes.
func (sv *solver) post(b *devalloc.Buffer, mode devalloc.Mode, start func() (*cluster.Request, error)) (*cluster.Request, error) {
	h, err := b.Hold(mode)
	if err != nil {
		return nil, err
	}
	if err := h.Wait(); err != nil {
		return nil, errors.Join(err, h.Release())
	}
	r, err := start()
	if err != nil {
		return nil, errors.Join(err, h.Release())
	}
	if err := r.Attach(h); err != nil {
		return nil, errors.Join(err, h.Release())
	}
	return r, nil
}

// perBlockPlans makes one single-block plan per operand and block.
func (l *layout) perBlockPlans() error {
	plans := make([][3]*packing.Plan, len(l.bond.specs))
	for k, sp := range l.bond.specs {
		dims := [3][2]int{{sp.m, sp.k}, {sp.k, sp.n}, {sp.m, sp.n}}
		for j, d := range dims {
			p, err := packing.NewPlan([]packing.Desc{{ID: uint64(k), DType: packing.Float64, Rows: d[0], Cols: d[1]}}, packing.Options{})
			if err != nil {
				return err
			}
			plans[k][j] = p
		}
	}
	l.blockPlans = plans
	return nil
}
