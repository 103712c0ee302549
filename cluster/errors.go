package cluster

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns is one of these or
// matches one of them with errors.Is.
var (
	// ErrNotInitialized is returned by every call made before Init.
	ErrNotInitialized = errors.New("cluster: MPI not initialized (call Init first)")
	// ErrFinalized is returned by every call made after Finalize.
	ErrFinalized = errors.New("cluster: MPI already finalized")
	// ErrInitialized is returned by a second Init.
	ErrInitialized = errors.New("cluster: Init already called")
	// ErrInitFailed is returned by every call after an Init that failed.
	ErrInitFailed = errors.New("cluster: MPI initialization failed")
	// ErrRank reports a rank outside the communicator (also MPI_ERR_RANK).
	ErrRank = errors.New("cluster: invalid rank")
	// ErrTag reports a tag outside 0..MaxTag (also MPI_ERR_TAG).
	ErrTag = errors.New("cluster: invalid tag")
	// ErrTruncate reports a message longer than the receive buffer
	// (MPI_ERR_TRUNCATE).
	ErrTruncate = errors.New("cluster: message truncated")
	// ErrMemory reports memory that MPI may not hold: an unpinned or
	// released region, or a region whose owner reports an error.
	ErrMemory = errors.New("cluster: memory not usable by MPI")
	// ErrDeviceMemory reports device memory given to an MPI that is not
	// CUDA-aware.
	ErrDeviceMemory = errors.New("cluster: device memory needs a CUDA-aware MPI")
	// ErrInvalid reports a bad argument: mismatched lengths, a nil request,
	// a negative color.
	ErrInvalid = errors.New("cluster: invalid argument")
	// ErrTooLarge reports a size MPI's int counts cannot describe where no
	// large-count path exists (Allgatherv displacements).
	ErrTooLarge = errors.New("cluster: size too large for MPI")
	// ErrBadEnv matches every *EnvError.
	ErrBadEnv = errors.New("cluster: bad environment setting")
	// ErrPending is returned by Finalize while requests are still pending.
	ErrPending = errors.New("cluster: requests still pending")
	// ErrCommFreed is returned for any use of a communicator after Free.
	ErrCommFreed = errors.New("cluster: communicator freed")
	// ErrInUse reports a request used by two goroutines at once, or listed
	// twice in one Waitall, Waitsome or Testany.
	ErrInUse = errors.New("cluster: request in use by another call")
	// ErrNoDevice reports a placement request with no visible GPU.
	ErrNoDevice = errors.New("cluster: no visible GPU")
	// ErrMPI matches every *MPIError.
	ErrMPI = errors.New("cluster: MPI error")
)

// ErrorClass is the portable class of an MPI error (MPI_Error_class),
// numbered by this package so it means the same with every MPI.
type ErrorClass int

// Error classes that callers may want to tell apart; the rest are
// ClassOther.
const (
	ClassOther ErrorClass = iota
	ClassTruncate
	ClassRank
	ClassTag
	ClassCount
	ClassBuffer
	ClassComm
	ClassType
	ClassRequest
	ClassRoot
	ClassArg
	ClassNoMem
	ClassIntern
)

var classNames = [...]string{
	ClassOther:    "MPI_ERR_OTHER",
	ClassTruncate: "MPI_ERR_TRUNCATE",
	ClassRank:     "MPI_ERR_RANK",
	ClassTag:      "MPI_ERR_TAG",
	ClassCount:    "MPI_ERR_COUNT",
	ClassBuffer:   "MPI_ERR_BUFFER",
	ClassComm:     "MPI_ERR_COMM",
	ClassType:     "MPI_ERR_TYPE",
	ClassRequest:  "MPI_ERR_REQUEST",
	ClassRoot:     "MPI_ERR_ROOT",
	ClassArg:      "MPI_ERR_ARG",
	ClassNoMem:    "MPI_ERR_NO_MEM",
	ClassIntern:   "MPI_ERR_INTERN",
}

func (c ErrorClass) String() string {
	if c >= 0 && int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("ErrorClass(%d)", int(c))
}

// MPIError is an error code returned by MPI (under MPI_ERRORS_RETURN), or
// the same condition detected by the in-process world.
type MPIError struct {
	Op      string     // the MPI function, e.g. "MPI_Wait"
	Code    int        // the implementation's error code; -1 from the in-process world
	Class   ErrorClass // portable class
	Message string     // MPI_Error_string of Code
}

func (e *MPIError) Error() string {
	return fmt.Sprintf("cluster: %s failed: %s (%s)", e.Op, e.Message, e.Class)
}

// Is matches ErrMPI, and ErrTruncate, ErrRank or ErrTag by class.
func (e *MPIError) Is(target error) bool {
	switch target {
	case ErrMPI:
		return true
	case ErrTruncate:
		return e.Class == ClassTruncate
	case ErrRank:
		return e.Class == ClassRank
	case ErrTag:
		return e.Class == ClassTag
	}
	return false
}

// EnvError reports a malformed environment variable.
type EnvError struct {
	Name, Value string
	Reason      string
}

func (e *EnvError) Error() string {
	return fmt.Sprintf("cluster: %s=%q: %s", e.Name, e.Value, e.Reason)
}

// Is matches ErrBadEnv.
func (e *EnvError) Is(target error) bool { return target == ErrBadEnv }
