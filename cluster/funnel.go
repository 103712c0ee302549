package cluster

import (
	"runtime"
	"sync"
)

// funnel runs closures on one goroutine locked to one OS thread: the thread
// that called MPI_Init_thread, where MPI_THREAD_FUNNELED lets MPI be
// called and where MPI_Finalize must be called.
//
// Blocking MPI calls would stall every other goroutine's calls behind them
// (and can deadlock two ranks that each wait for the other's next send), so
// the funnel never blocks in MPI: until() registers a poll (MPI_Test,
// MPI_Testsome) that the thread runs between the other calls it is handed,
// until the poll reports completion.
type funnel struct {
	ops  chan *funnelOp
	idle func() // called when a round of polls made no progress
	exit chan struct{}
}

type funnelOp struct {
	fn   func()      // run once
	poll func() bool // or run until it returns true
	done chan struct{}
	last bool // stop the thread after fn
}

var funnelOps = sync.Pool{New: func() any { return &funnelOp{done: make(chan struct{}, 1)} }}

// idleSpins is how many fruitless poll rounds pass before idle is called:
// enough to catch a reply a few microseconds away without a yield.
const idleSpins = 64

func startFunnel(idle func()) *funnel {
	if idle == nil {
		idle = runtime.Gosched
	}
	f := &funnel{ops: make(chan *funnelOp), idle: idle, exit: make(chan struct{})}
	go f.loop()
	return f
}

func (f *funnel) loop() {
	// Never unlocked: the thread exits with the goroutine, so nothing else
	// ever runs on MPI's main thread.
	runtime.LockOSThread()
	defer close(f.exit)
	var polls []*funnelOp
	spins := 0
	for {
		var op *funnelOp
		if len(polls) == 0 {
			op = <-f.ops
		} else {
			select {
			case op = <-f.ops:
			default:
			}
		}
		if op != nil {
			if op.poll != nil {
				if op.poll() {
					op.done <- struct{}{}
				} else {
					polls = append(polls, op)
				}
				continue
			}
			last := op.last // op belongs to the submitter again once done is sent
			op.fn()
			op.done <- struct{}{}
			if last {
				return
			}
			continue
		}
		progress := false
		kept := polls[:0]
		for _, p := range polls {
			if p.poll() {
				p.done <- struct{}{}
				progress = true
			} else {
				kept = append(kept, p)
			}
		}
		for i := len(kept); i < len(polls); i++ {
			polls[i] = nil
		}
		polls = kept
		if progress {
			spins = 0
		} else if spins++; spins >= idleSpins {
			spins = 0
			f.idle()
		}
	}
}

func (f *funnel) submit(op *funnelOp) {
	f.ops <- op
	<-op.done
	op.fn, op.poll, op.last = nil, nil, false
	funnelOps.Put(op)
}

// run runs fn on the funnel thread and returns when it has.
func (f *funnel) run(fn func()) {
	op := funnelOps.Get().(*funnelOp)
	op.fn = fn
	f.submit(op)
}

// until runs poll on the funnel thread, between other calls, until it
// returns true.
func (f *funnel) until(poll func() bool) {
	op := funnelOps.Get().(*funnelOp)
	op.poll = poll
	f.submit(op)
}

// stop runs last on the funnel thread and ends the thread. Polls still
// registered are abandoned; callers stop only when none can be.
func (f *funnel) stop(last func()) {
	op := funnelOps.Get().(*funnelOp)
	op.fn, op.last = last, true
	f.ops <- op
	<-op.done
	<-f.exit
}
