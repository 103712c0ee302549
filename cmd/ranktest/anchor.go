package main

import (
	"errors"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
)

// anchorWorkload is the working set of shared/anchors' maxm.cu, allocated
// through distbuf: a two-site solve's environments, wavefunction, result and
// temporaries (m*m doubles times 5, 5, 4, 4, 10, 10 and 2), each its own
// pool allocation, and 2000 tiny blocks of 64 B to 16 KiB, the tail, packed
// into one. A solve allocates them, touches the first 4 KiB of each (the
// tail whole), frees them and waits for the stream, as maxm.cu's does, and
// ends the phase (the policy's work), so
// that the largest m and the time per solve of each retention policy can be
// set beside the plain C program's on the same machine.
type anchorWorkload struct {
	a     *devalloc.Allocator
	s     *devalloc.Stream
	m     int
	sizes []int64       // the large buffers at m
	tail  *packing.Plan // the tiny blocks at m
}

func newAnchorWorkload(a *devalloc.Allocator) *anchorWorkload {
	return &anchorWorkload{a: a, s: a.DefaultStream()}
}

// anchorTail is the number of tiny blocks, as in maxm.cu.
const anchorTail = 2000

// anchorSizes are maxm.cu's sizes at m: the large buffers and the tiny
// blocks' bytes, from the same generator.
func anchorSizes(m int) (large, tiny []int64) {
	m2 := int64(m) * int64(m) * 8
	large = []int64{5 * m2, 5 * m2, 4 * m2, 4 * m2, 10 * m2, 10 * m2, 2 * m2}
	s := uint32(12345) + uint32(m)
	tiny = make([]int64, anchorTail)
	for i := range tiny {
		s = s*1103515245 + 12345
		tiny[i] = 64 + int64(s>>8)%16384
	}
	return large, tiny
}

// structure lays out the tail at m (each tiny block as float32s, its bytes
// rounded up to 4): what a fresh structure costs.
func (w *anchorWorkload) structure(m int) error {
	if w.m == m && w.tail != nil {
		return nil
	}
	large, tiny := anchorSizes(m)
	descs := make([]packing.Desc, len(tiny))
	for i, n := range tiny {
		descs[i] = packing.Desc{ID: uint64(i), DType: packing.Float32, Rows: int((n + 3) / 4), Cols: 1}
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	if err != nil {
		return err
	}
	w.m, w.sizes, w.tail = m, large, p
	return nil
}

// workingSet is the bytes a solve at m asks for.
func (w *anchorWorkload) workingSet(m int) int64 {
	large, tiny := anchorSizes(m)
	var n int64
	for _, b := range append(large, tiny...) {
		n += b
	}
	return n
}

// touchBytes is how much of each large buffer a solve writes, as maxm.cu.
const touchBytes = 4096

func (w *anchorWorkload) solveAt(m, _ int) (st iterStats, err error) {
	st.deviceUS, st.deviceGemmUS = -1, -1
	t := time.Now()
	if err := w.structure(m); err != nil {
		return st, err
	}
	var bufs []*devalloc.Buffer
	var tail *packing.Coalesced
	defer func() {
		for _, b := range bufs {
			err = errors.Join(err, b.Free())
		}
		if tail != nil {
			err = errors.Join(err, tail.Free())
		}
	}()
	for _, n := range w.sizes {
		b, err := w.a.Alloc(n, w.s)
		if err != nil {
			return st, err
		}
		bufs = append(bufs, b)
		if err := w.s.Memset(b, 0, min(n, touchBytes), 1); err != nil {
			return st, err
		}
	}
	if tail, err = packing.Alloc(w.a, w.tail, w.s); err != nil {
		return st, err
	}
	if err := w.s.Memset(tail.Buffer(), 0, tail.Size(), 1); err != nil {
		return st, err
	}
	st.phase[phAlloc] = lap(&t)
	for _, b := range bufs {
		if err := b.Free(); err != nil {
			return st, err
		}
	}
	bufs = nil
	err, tail = tail.Free(), nil
	if err != nil {
		return st, err
	}
	if err := w.s.Synchronize(); err != nil {
		return st, err
	}
	if err := w.a.EndPhase(); err != nil {
		return st, err
	}
	st.phase[phFree] = lap(&t)
	st.solveUS = st.phase[phAlloc] + st.phase[phFree]
	st.workingSet = w.workingSet(m)
	return st, nil
}

func (w *anchorWorkload) dropStructures() error {
	w.m, w.sizes, w.tail = 0, nil, nil
	return nil
}
