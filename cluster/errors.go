package cluster

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/distbuf/distbuf"
)

// Errors. Every error this package returns matches, with errors.Is, one of
// the module's shared sentinels or one of this package's own three,
// ErrNotInitialized, ErrMPI and ErrTimeout, whose meanings are cluster's
// alone:
//
//   - distbuf.ErrInvalid: a rank or tag outside its range, a bad argument
//     (mismatched lengths, a nil request, a negative color, a second Init),
//     a receive smaller than its message, a size MPI cannot describe; and
//     a bounded collective whose ranks disagree (another collective, root,
//     operator or length on some rank).
//   - distbuf.ErrClosed: a communicator used after Free, any call after
//     Finalize.
//   - distbuf.ErrFreed: a PinnedBytes used after Release.
//   - distbuf.ErrConflict: a request used by two calls at once, or
//     Finalize while requests or matched messages are still open.
//   - distbuf.ErrUnavailable: no visible GPU, device memory given to an MPI
//     that is not CUDA-aware, or an MPI without the thread level
//     ThreadMultiple requires.
//   - distbuf.ErrOutOfMemory: no scratch memory to discard a message.
//   - distbuf.ErrBadConfig: a malformed DISTBUF_* environment variable.
//
// A Memory whose Region fails is refused with that error wrapped, so it
// matches what its owner reports (devalloc's use after Free, say).
var (
	// ErrNotInitialized is returned by every call made before Init, and
	// by every call after an Init that failed (wrapping that failure).
	ErrNotInitialized = errors.New("cluster: MPI not initialized")
	// ErrMPI matches every *MPIError: an error code MPI returned.
	ErrMPI = errors.New("cluster: MPI error")
	// ErrTimeout matches every *TimeoutError: a bounded collective (the
	// ...Within functions) that did not complete within its timeout, and
	// Finalize while such a timeout is unresolved. A package that reports
	// its own timeouts (msg) can wrap the *TimeoutError so that its error
	// matches both its sentinel and this one.
	ErrTimeout = errors.New("cluster: collective timed out")
)

// TimeoutError reports a bounded collective that did not complete within
// its timeout, naming the ranks it did not hear from: those whose part
// had not arrived whole (or, for the root of a BcastWithin, that had not
// taken the root's message). In practice they are the ranks that stopped:
// a rank that enters the collective sends its part at once, so a live
// rank is heard from even while it waits for the others.
type TimeoutError struct {
	Op      string        // "Barrier", "Bcast", "Allgather", "Allreduce" or "Alltoall"
	Seq     uint64        // the collective's number among the bounded collectives on its communicator, from 1
	Timeout time.Duration // the timeout it was given
	Rank    int           // this rank, in the communicator
	Size    int           // ranks in the communicator
	// Missing lists the ranks, in the communicator, not heard from, in
	// increasing order; WorldMissing the same ranks in World.
	Missing      []int
	WorldMissing []int
}

func (e *TimeoutError) Error() string {
	ranks := make([]string, len(e.Missing))
	differ := false
	for i, r := range e.Missing {
		ranks[i] = strconv.Itoa(r)
		if i < len(e.WorldMissing) && e.WorldMissing[i] != r {
			differ = true
		}
	}
	who := "no rank"
	switch {
	case len(ranks) == 1:
		who = "rank " + ranks[0]
	case len(ranks) > 1:
		who = "ranks " + strings.Join(ranks, ", ")
	}
	if differ {
		world := make([]string, len(e.WorldMissing))
		for i, r := range e.WorldMissing {
			world[i] = strconv.Itoa(r)
		}
		who += " (world " + strings.Join(world, ", ") + ")"
	}
	return fmt.Sprintf("cluster: %s #%d timed out after %v: not heard from %s of %d (this rank is %d); a rank that has stopped cannot be waited for: end the job (Abort)",
		e.Op, e.Seq, e.Timeout, who, e.Size, e.Rank)
}

// Is matches ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// MPIError is an error code returned by MPI (under MPI_ERRORS_RETURN), or
// the same condition detected by the in-process world.
type MPIError struct {
	Op      string // the MPI function, e.g. "MPI_Wait"
	Code    int    // the implementation's error code; -1 from the in-process world
	Class   string // the portable class (MPI_Error_class), e.g. "MPI_ERR_TRUNCATE"
	Message string // MPI_Error_string of Code
}

func (e *MPIError) Error() string {
	return fmt.Sprintf("cluster: %s failed: %s (%s)", e.Op, e.Message, e.Class)
}

// Is matches ErrMPI, and distbuf.ErrInvalid for the classes that report a
// bad argument: a truncated receive, a bad rank or a bad tag.
func (e *MPIError) Is(target error) bool {
	switch target {
	case ErrMPI:
		return true
	case distbuf.ErrInvalid:
		return e.Class == classTruncate || e.Class == classRank || e.Class == classTag
	}
	return false
}

// The classes MPIError.Is matches by; the MPI build names every class MPI
// reports.
const (
	classTruncate = "MPI_ERR_TRUNCATE"
	classRank     = "MPI_ERR_RANK"
	classTag      = "MPI_ERR_TAG"
)

// envError reports a malformed environment variable, naming it and its
// value.
func envError(name, value, reason string) error {
	return fmt.Errorf("cluster: %s=%q: %s: %w", name, value, reason, distbuf.ErrBadConfig)
}
