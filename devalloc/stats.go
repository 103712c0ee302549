package devalloc

// Stats is a snapshot of the allocator's counters. Reading it takes a lock,
// a few atomic loads and, on the CUDA pool, a few pool-attribute queries:
// cheap enough for every iteration, but not free (keep it off the clock of
// what it measures).
type Stats struct {
	// Bytes asked for by Alloc: live now, the high-water mark since the last
	// ResetPeak, and the sum over all allocations.
	RequestedCurrent, RequestedPeak, RequestedTotal int64
	// Bytes the pool holds from the driver or OS: now, the high-water mark,
	// and the cumulative bytes obtained (on CUDA sampled when Stats is read).
	ReservedCurrent, ReservedPeak, ReservedTotal int64
	// Bytes the pool has handed out, including rounding, frees whose
	// stream order has not yet reached them and the blocks kept for reuse.
	PoolUsedCurrent, PoolUsedPeak int64
	// On the CUDA pool under Retain: the bytes of freed blocks kept for the
	// next allocation of their size on the stream they were freed on (any
	// stream, for those the reclamation stream freed), and how many
	// allocations such a block served (no pool call).
	ReuseKept, ReuseHits int64

	LiveBuffers  int64 // allocated and not yet freed (device or host-backend memory and pinned)
	AllocCalls   int64 // successful Alloc calls
	BackendCalls int64 // calls into the backend allocator, retries and priming included
	Frees        int64
	PendingFrees int64 // freed but deferred until an outside hold is released
	Trims        int64
	OOMRetries   int64
	Fallbacks    int64 // 1 when the backend is not the one asked for
	// LedgerEvents counts the events the ledger recorded: one per access
	// the caller declared, and one per stream mark that another stream or a
	// hold had to wait for. Allocating, filling and freeing on one stream
	// records none. (DoneAll records one for all of its accesses.)
	LedgerEvents int64
	// WaitsSkipped counts the cross-stream waits the ledger left out: a
	// stream that has waited for one of another stream's ledger events
	// waits for no earlier one.
	WaitsSkipped int64
	// HostWaitsSkipped counts the host's waits for and queries of ledger
	// events left out: once the host has seen one of a stream's ledger
	// events complete (a hold's Wait, a query, Synchronize), every earlier
	// one has too.
	HostWaitsSkipped int64

	PinnedReserved, PinnedUsed int64
	PinnedAllocCalls           int64 // page-locked allocations from the driver or OS
}

// Stats returns a snapshot. It works after Close too, for final reports.
func (a *Allocator) Stats() Stats {
	u := a.be.usage()
	pr, pu, pc := a.pinned.stats()
	a.mu.Lock()
	n := a.n
	a.mu.Unlock()
	return Stats{
		RequestedCurrent: n.requestedCur,
		RequestedPeak:    n.requestedPeak,
		RequestedTotal:   n.requestedTotal,
		ReservedCurrent:  u.reservedCur,
		ReservedPeak:     u.reservedHigh,
		ReservedTotal:    u.reservedTotal,
		PoolUsedCurrent:  u.usedCur,
		PoolUsedPeak:     u.usedHigh,
		ReuseKept:        u.reuseKept,
		ReuseHits:        u.reuseHits,
		LiveBuffers:      n.liveBuffers,
		AllocCalls:       n.allocCalls,
		BackendCalls:     n.backendCalls + a.c.backendCalls.Load(),
		Frees:            n.frees,
		PendingFrees:     a.c.heldFrees.Load(),
		Trims:            a.c.trims.Load(),
		OOMRetries:       a.c.oomRetries.Load(),
		Fallbacks:        a.c.fallbacks.Load(),
		LedgerEvents:     a.c.ledgerEvents.Load(),
		WaitsSkipped:     a.c.waitsSkipped.Load(),
		HostWaitsSkipped: a.c.hostWaitsSkipped.Load(),
		PinnedReserved:   pr,
		PinnedUsed:       pu,
		PinnedAllocCalls: pc,
	}
}

// ResetPeak starts new high-water marks at the current values: the peaks
// of a phase (a sweep, a solve) are then read from Stats at its end.
func (a *Allocator) ResetPeak() {
	a.mu.Lock()
	a.n.requestedPeak = a.n.requestedCur
	a.mu.Unlock()
	a.be.resetHigh()
}
