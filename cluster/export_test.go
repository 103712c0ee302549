package cluster

// What the tests need to see that the API keeps to itself.

// Threading reports the design in use (ThreadMultiple or ThreadFunneled)
// and the thread level MPI provided, e.g. "MPI_THREAD_MULTIPLE".
func Threading() (ThreadMode, string, error) {
	if err := enter(); err != nil {
		return 0, "", err
	}
	defer exit()
	return state.thread, state.provided, nil
}

// Initialized reports whether Init succeeded and Finalize has not run.
func Initialized() bool { return state.phase.Load() == phaseReady }

// DeviceFor is Comm.Device for any local rank.
var DeviceFor = deviceFor

// ParseThreadMode parses DISTBUF_MPI_THREAD's values.
var ParseThreadMode = parseThreadMode
