package cluster

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distbuf/distbuf"
)

const (
	phaseUninit int32 = iota
	phaseReady
	phaseFinalizing
	phaseFinalized
	phaseFailed
)

// The process-wide state. Every call that reaches the backend is bracketed
// by enter and exit: inflight counts those calls so Finalize can wait for
// them.
var state struct {
	mu       sync.Mutex // serialises Init and Finalize
	phase    atomic.Int32
	inflight atomic.Int64
	initErr  error

	world     *Comm
	thread    ThreadMode // the design in use: ThreadMultiple or ThreadFunneled
	provided  string     // the level MPI reported, e.g. "MPI_THREAD_MULTIPLE"
	cudaQuery bool       // what the library's CUDA-awareness query said
	maxTag    int
	// crowded: this node runs more ranks than it has CPUs online, so a
	// rank that spins takes the core of a rank it may be waiting for.
	// (Not this process's CPUs: mpirun binds each rank to cores of its own
	// where there are enough.)
	crowded bool
}

func phaseError() error {
	switch state.phase.Load() {
	case phaseUninit:
		return ErrNotInitialized
	case phaseFailed:
		return fmt.Errorf("cluster: MPI initialization failed: %w: %w", ErrNotInitialized, state.initErr)
	}
	return fmt.Errorf("cluster: MPI already finalized: %w", distbuf.ErrClosed)
}

func enter() error {
	state.inflight.Add(1)
	if state.phase.Load() == phaseReady {
		return nil
	}
	state.inflight.Add(-1)
	return phaseError()
}

func exit() { state.inflight.Add(-1) }

// Init initialises MPI with the default Options. See InitWith.
func Init() error { return InitWith(Options{}) }

// InitWith initialises MPI (MPI_Init_thread) on a dedicated OS thread that
// stays locked until Finalize, so it may be called from any goroutine. It
// installs MPI_ERRORS_RETURN on the world and self communicators and builds
// World and its node-local communicator. It may be called once per
// process; a second call returns an error matching distbuf.ErrInvalid.
func InitWith(o Options) error {
	state.mu.Lock()
	defer state.mu.Unlock()
	switch state.phase.Load() {
	case phaseReady, phaseFinalizing:
		return fmt.Errorf("cluster: Init already called: %w", distbuf.ErrInvalid)
	case phaseFinalized:
		return fmt.Errorf("cluster: Init after Finalize (MPI cannot be restarted): %w", distbuf.ErrClosed)
	case phaseFailed:
		return phaseError()
	}
	mode, err := o.threadMode()
	if err != nil {
		return err
	}
	info, err := backendInit(mode)
	if err != nil {
		if info.attempted {
			state.initErr = err
			state.phase.Store(phaseFailed)
		}
		return err
	}
	state.thread, state.provided = info.thread, info.provided
	state.cudaQuery, state.maxTag = info.cudaAware, info.maxTag
	world, err := newComm(info.world, kindWorld)
	if err != nil {
		state.initErr = err
		state.phase.Store(phaseFailed)
		return err
	}
	state.world = world
	state.crowded = world.Local().Size() > backendNodeCPUs()
	state.phase.Store(phaseReady)
	return nil
}

// Finalize shuts MPI down (MPI_Finalize, on the thread that initialised it).
// It returns distbuf.ErrConflict, and leaves MPI running, while any request
// has not been completed by Wait, Waitall or Await; and an error matching
// ErrTimeout while a bounded collective's timeout is unresolved (no later
// bounded collective on that communicator has completed): MPI_Finalize
// waits for every rank, and the rank not heard from may never come, so
// such a job ends with Abort. It waits for calls still running on other
// goroutines; a wait or collective that never completes keeps it waiting,
// as it would keep MPI_Finalize waiting. After Finalize every call returns
// an error matching distbuf.ErrClosed.
func Finalize() error {
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.phase.Load() != phaseReady {
		return phaseError()
	}
	if err := stallError(); err != nil {
		return err
	}
	if err := pendingError(); err != nil {
		return err
	}
	state.phase.Store(phaseFinalizing)
	for state.inflight.Load() > 0 {
		time.Sleep(20 * time.Microsecond)
	}
	if err := pendingError(); err != nil {
		// A request was posted while Finalize was starting.
		state.phase.Store(phaseReady)
		return err
	}
	err := backendFinalize()
	state.phase.Store(phaseFinalized)
	return err
}

// FinalizeWithin is Finalize after a BarrierWithin(timeout) on World,
// which every rank calls: MPI_Finalize waits for every rank (Open MPI's
// runtime fences them), so a rank that has stopped would hold the others
// there for ever, where the barrier fails instead with a *TimeoutError
// naming it and leaves MPI running for Abort. A rank that stops between
// the barrier and MPI_Finalize still holds the others; the window is the
// barrier's last message. timeout <= 0 waits without limit.
func FinalizeWithin(timeout time.Duration) error {
	w, err := World()
	if err != nil {
		return err
	}
	if err := w.BarrierWithin(timeout); err != nil {
		return err
	}
	return Finalize()
}

// Abort ends every process of the job at once, with exit status code
// (MPI_Abort on MPI_COMM_WORLD; mpirun then ends the job and exits with
// it). It does not return. code must be 1 to 255; other values become 1.
// Before Init, after Finalize and in the one-rank build it exits this
// process alone, which is then the whole job.
//
// Call it when this rank cannot go on and its peers cannot learn that
// from a collective they are waiting in: print the error first, naming
// the rank (Abort prints nothing itself), then call Abort, so that the job
// ends within seconds with that message instead of leaving the other ranks
// waiting for ever. An error every rank sees alike (an agreed setting that
// is invalid, a collective that failed everywhere) can be returned
// normally instead. Do not call Finalize first: Finalize waits for the
// other ranks.
func Abort(code int) {
	if code < 1 || code > 255 {
		code = 1
	}
	if ph := state.phase.Load(); ph == phaseReady || ph == phaseFinalizing {
		backendAbort(code)
	}
	os.Exit(code)
}

// World is the communicator of every rank (MPI_COMM_WORLD).
func World() (*Comm, error) {
	if err := enter(); err != nil {
		return nil, err
	}
	defer exit()
	return state.world, nil
}

// MaxTag is the largest tag MPI accepts (the MPI_TAG_UB attribute).
func MaxTag() (int, error) {
	if err := enter(); err != nil {
		return 0, err
	}
	defer exit()
	return state.maxTag, nil
}

// CUDAAware reports whether MPI may be handed device memory. The
// environment variable DISTBUF_MPI_CUDA_AWARE ("0" or "1") overrides the
// library's own query (Open MPI's MPIX_Query_cuda_support, MPICH's
// MPIX_GPU_query_support); any other value is an error. It is read on every
// call, so it can be changed while running.
func CUDAAware() (bool, error) {
	if err := enter(); err != nil {
		return false, err
	}
	defer exit()
	v, ok := os.LookupEnv(envCUDAAware)
	if !ok {
		return state.cudaQuery, nil
	}
	switch strings.TrimSpace(v) {
	case "0":
		return false, nil
	case "1":
		if !haveMPI {
			return false, envError(envCUDAAware, v,
				"this build has no MPI (built without the mpi tag); the in-process world cannot read device memory")
		}
		return true, nil
	}
	return false, envError(envCUDAAware, v, "want 0 or 1")
}

// initInfo is what a backend reports from Init.
type initInfo struct {
	attempted bool // MPI_Init_thread was called, so Init cannot be retried
	world     commImpl
	thread    ThreadMode
	provided  string
	cudaAware bool
	maxTag    int
}
