package devalloc

import (
	"errors"
	"fmt"
	"strings"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/bytesize"
)

// OutOfMemoryError is returned by Alloc once the whole out-of-memory ladder
// (sync and retry, trim and retry, user callback) has failed. It matches
// distbuf.ErrOutOfMemory. Options.OnOutOfMemory receives the report so far.
type OutOfMemoryError struct {
	Requested int64 // bytes asked for
	Limit     int64 // per-rank budget in bytes; 0 means none
	Used      int64 // bytes held by live and pending-free buffers
	Reserved  int64 // bytes the pool holds from the driver or OS
	Free      int64 // free memory reported by the device or OS; -1 if unknown
	Total     int64 // total memory of the device or host; -1 if unknown
	Retries   int   // how many times the allocation was retried (so far, in the callback)
	Cause     error // the last failure: the budget, or the backend's error
}

func (e *OutOfMemoryError) Error() string {
	limit := "none"
	if e.Limit > 0 {
		limit = bytesize.Format(e.Limit)
	}
	return fmt.Sprintf("devalloc: out of memory: requested %s (limit %s, used %s, reserved %s, free %s of %s) after %d retries: %v",
		bytesize.Format(e.Requested), limit, bytesize.Format(e.Used), bytesize.Format(e.Reserved),
		formatMaybe(e.Free), formatMaybe(e.Total), e.Retries, e.Cause)
}

// Unwrap makes the error match distbuf.ErrOutOfMemory and exposes the last
// failure (Cause) to errors.Is and errors.As.
func (e *OutOfMemoryError) Unwrap() []error { return []error{distbuf.ErrOutOfMemory, e.Cause} }

func formatMaybe(n int64) string {
	if n < 0 {
		return "?"
	}
	return bytesize.Format(n)
}

// errHoldAbandoned fails the synchronisation of a stream that stopped
// waiting for an outside hold because the allocator was closed.
var errHoldAbandoned = fmt.Errorf("a wait for an outside hold was abandoned because the allocator was closed (the hold was never released): %w", distbuf.ErrClosed)

// waitOrAbandon waits for ch, the release of a hold, or for abort, and
// then reports the abandoned wait through fail.
func waitOrAbandon(ch, abort <-chan struct{}, fail func(error)) {
	select {
	case <-ch:
	case <-abort:
		select {
		case <-ch:
		default:
			fail(errHoldAbandoned)
		}
	}
}

// errBudget is the Cause of an OutOfMemoryError raised by the per-rank budget
// rather than by the backend.
var errBudget = errors.New("per-rank budget exceeded")

// configError names the configuration key whose value could not be used,
// and where it came from: "DISTBUF_ALLOC_CONF", "DISTBUF_BACKEND",
// "Options" or "config" (ParseConfig). It matches distbuf.ErrBadConfig.
type configError struct {
	source, key, value, reason string
}

func (e *configError) Error() string {
	return fmt.Sprintf("devalloc: %s: key %q: bad value %q: %s", e.source, e.key, e.value, e.reason)
}

func (e *configError) Is(target error) bool { return target == distbuf.ErrBadConfig }

// LeakedBuffer describes one buffer still live when the allocator was closed.
type LeakedBuffer struct {
	ID       uint64
	Bytes    int64
	Location Location
	Held     bool // freed by the owner but still held by an outside agent
}

// LeakError is returned by Close when buffers were never freed, or were freed
// while an outside agent (an MPI request) still held them. Their memory is not
// released, so stale pointers cannot crash the process.
type LeakError struct {
	Count   int
	Bytes   int64
	Buffers []LeakedBuffer // at most 16, lowest IDs first
}

func (e *LeakError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "devalloc: %d leaked buffer(s), %s", e.Count, bytesize.Format(e.Bytes))
	for i, l := range e.Buffers {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "#%d %s %s", l.ID, bytesize.Format(l.Bytes), l.Location)
		if l.Held {
			b.WriteString(" (freed, still held)")
		}
	}
	if len(e.Buffers) < e.Count {
		fmt.Fprintf(&b, ", and %d more", e.Count-len(e.Buffers))
	}
	return b.String()
}

// Is makes errors.Is(err, distbuf.ErrLeak) true.
func (e *LeakError) Is(target error) bool { return target == distbuf.ErrLeak }
