package msg

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/internal/wire"
)

// Sentinel errors. Every error this package returns matches one of them,
// or distbuf.ErrInvalid (a bad argument or option) or distbuf.ErrClosed
// (use after Close), with errors.Is; or is an error of package cluster,
// devalloc or packing, wrapped.
//
// A message that breaks the protocol matches ErrMalformed, whatever it
// broke; ErrChecksum, ErrSizeMismatch and ErrUnexpectedPeer each name one
// way to break it, for a caller that treats them apart (a checksum failure
// suggests corruption in flight, a size mismatch a peer with another
// pattern, an unexpected peer a stray or another exchanger's message).
var (
	// ErrMalformed matches a message whose bytes break the wire format
	// (docs/WIRE.md) or the exchange protocol.
	ErrMalformed = wire.ErrMalformed
	// ErrChecksum matches a manifest or payload checksum that does not
	// match the bytes. It matches ErrMalformed too.
	ErrChecksum = wire.ErrChecksum
	// ErrSizeMismatch matches a message, or one of the MPI messages it
	// travels as, whose length differs from the length announced by the
	// count exchange or expected by a persistent pattern. It matches
	// ErrMalformed too.
	ErrSizeMismatch = wire.ErrSizeMismatch
	// ErrUnexpectedPeer matches a message whose header names another
	// source, destination, tag or exchange epoch than the receiver expects,
	// an MPI message with another tag, a stray (a message from a rank that
	// owes this one nothing more in the exchange), and an agreement that
	// says a rank sent fewer messages than arrived from it. It matches
	// ErrMalformed too.
	ErrUnexpectedPeer = wire.NewMalformedKind("msg: message from an unexpected peer")
	// ErrPatternMismatch matches an exchange that departs from its
	// persistent pattern: other sizes, other destinations, another manifest.
	ErrPatternMismatch = errors.New("msg: exchange does not match the persistent pattern")
	// ErrPeerAborted matches another rank's failure of a collective step
	// this rank took part in: a -1 in the count exchange, an abort notice
	// in place of a message, a failure reported in the agreement that ends
	// every exchange, or a rank that could not set up its exchanger in New.
	// That rank's own error says why, and does not match ErrPeerAborted:
	// an error that matches it means this rank failed only because others
	// did.
	ErrPeerAborted = errors.New("msg: peer aborted the exchange")
	// ErrTooLarge matches a length a peer announced that this rank cannot
	// take: beyond the protocol's limits, its budget or its memory. Nothing
	// is allocated for it; what the peer sends is drained.
	ErrTooLarge = errors.New("msg: announced message too large")
	// ErrTimeout matches an exchange that waited longer than
	// Options.Timeout without any of its messages moving (a peer sent
	// fewer MPI messages than it announced, or took none of this rank's),
	// and a collective step of New, Exchange or Close that some rank did
	// not reach within the timeout; the latter matches cluster.ErrTimeout
	// too, and errors.As finds its *cluster.TimeoutError, which lists the
	// ranks not heard from.
	ErrTimeout = errors.New("msg: exchange timed out")
)

// WireError names the peer, the MPI tag and the field of a message that was
// rejected (or of the exchange step that failed with that peer), and the
// sentinel it matches: ErrMalformed, ErrChecksum, ErrSizeMismatch,
// ErrUnexpectedPeer (the last three match ErrMalformed too),
// ErrPatternMismatch, ErrPeerAborted, ErrTooLarge or ErrTimeout.
type WireError = wire.Error

// outgoing marks the error as about a message this rank sends.
func outgoing(e *WireError) *WireError {
	e.Outgoing = true
	return e
}

func wireErr(sentinel error, peer, tag int, field, format string, args ...any) *WireError {
	return wire.Errorf(sentinel, peer, tag, field, format, args...)
}

// stepError is the failure of a collective step (the count exchange, the
// agreement, a collective of New or Close): it names the step, and a
// timeout matches ErrTimeout as well as cluster's *TimeoutError, which
// names the ranks not heard from.
func stepError(step string, err error) error {
	var te *cluster.TimeoutError
	if errors.As(err, &te) {
		return &stepTimeout{step: step, err: err}
	}
	return fmt.Errorf("msg: %s: %w", step, err)
}

// stepTimeout is a collective step that some rank did not reach within
// the timeout.
type stepTimeout struct {
	step string
	err  error // wraps a *cluster.TimeoutError
}

func (e *stepTimeout) Error() string { return "msg: " + e.step + ": " + e.err.Error() }

// Unwrap exposes ErrTimeout and cluster's error, which matches
// cluster.ErrTimeout.
func (e *stepTimeout) Unwrap() []error { return []error{ErrTimeout, e.err} }
