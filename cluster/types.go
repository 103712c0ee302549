package cluster

import (
	"fmt"
	"os"
	"strings"
)

// Wildcards and the null color. They are this package's values; the MPI
// build translates them to MPI_ANY_SOURCE, MPI_ANY_TAG and MPI_UNDEFINED.
const (
	AnySource = -1 // Irecv, Probe, Iprobe: match any source rank
	AnyTag    = -1 // Irecv, Probe, Iprobe: match any tag
	Undefined = -1 // Split color: this rank joins no new communicator
)

// Status describes a received or probed message. For a completed send,
// Source is -1, Tag the tag sent and Bytes the length sent.
type Status struct {
	Source int
	Tag    int
	Bytes  int64
}

// Op is a reduction operator for Allreduce.
type Op int

// Reduction operators.
const (
	Sum Op = iota
	Min
	Max
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

func (o Op) valid() bool { return o == Sum || o == Min || o == Max }

// Environment variables read by this package.
const (
	// EnvThread selects the threading design: "multiple", "funneled" or
	// "auto" (the default); Options.Thread takes precedence.
	EnvThread = "DISTBUF_MPI_THREAD"
	// EnvCUDAAware overrides the CUDA-awareness query: "0" or "1".
	EnvCUDAAware = "DISTBUF_MPI_CUDA_AWARE"
	// EnvGPUMap lists a GPU ordinal per local rank, e.g. "0,1,1,0".
	EnvGPUMap = "DISTBUF_GPU_MAP"
	// EnvDevice puts every rank of the node on one GPU ordinal.
	EnvDevice = "DISTBUF_DEVICE"
)

// ThreadMode is how Go's goroutines reach MPI.
type ThreadMode int

const (
	// ThreadAuto asks for MPI_THREAD_MULTIPLE and funnels when MPI
	// provides less.
	ThreadAuto ThreadMode = iota
	// ThreadMultiple requires MPI_THREAD_MULTIPLE: every goroutine calls
	// MPI directly, from whatever OS thread it runs on. Init fails if MPI
	// provides less.
	ThreadMultiple
	// ThreadFunneled asks for MPI_THREAD_FUNNELED and runs every MPI call
	// on the one locked OS thread that called MPI_Init_thread.
	ThreadFunneled
)

func (m ThreadMode) String() string {
	switch m {
	case ThreadAuto:
		return "auto"
	case ThreadMultiple:
		return "multiple"
	case ThreadFunneled:
		return "funneled"
	}
	return fmt.Sprintf("ThreadMode(%d)", int(m))
}

// ParseThreadMode parses "auto", "multiple" or "funneled".
func ParseThreadMode(s string) (ThreadMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return ThreadAuto, nil
	case "multiple":
		return ThreadMultiple, nil
	case "funneled", "funnelled":
		return ThreadFunneled, nil
	}
	return ThreadAuto, fmt.Errorf("cluster: thread mode %q (want auto, multiple or funneled): %w", s, ErrInvalid)
}

// Options configures Init. The zero value asks for the thread mode named
// by DISTBUF_MPI_THREAD, else ThreadAuto.
type Options struct {
	Thread ThreadMode
}

func (o Options) threadMode() (ThreadMode, error) {
	if o.Thread != ThreadAuto {
		if o.Thread < ThreadAuto || o.Thread > ThreadFunneled {
			return 0, fmt.Errorf("cluster: Options.Thread %v: %w", o.Thread, ErrInvalid)
		}
		return o.Thread, nil
	}
	v, ok := os.LookupEnv(EnvThread)
	if !ok {
		return ThreadAuto, nil
	}
	m, err := ParseThreadMode(v)
	if err != nil {
		return 0, &EnvError{Name: EnvThread, Value: v, Reason: "want auto, multiple or funneled"}
	}
	return m, nil
}
