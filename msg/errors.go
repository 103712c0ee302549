package msg

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns matches one of them
// with errors.Is (or is an error of package cluster, devalloc or packing,
// wrapped).
var (
	// ErrMalformed matches a message whose bytes break the wire format
	// (docs/WIRE.md); checksum failures match it too.
	ErrMalformed = errors.New("msg: malformed message")
	// ErrChecksum matches a manifest or payload checksum that does not
	// match the bytes.
	ErrChecksum = errors.New("msg: checksum mismatch")
	// ErrSizeMismatch matches a message, or one of the MPI messages it
	// travels as, whose length differs from the length announced by the
	// count exchange or expected by a persistent pattern.
	ErrSizeMismatch = errors.New("msg: message size mismatch")
	// ErrUnexpectedPeer matches a message whose header names another
	// source, destination, tag or exchange epoch than the receiver expects,
	// an MPI message with another tag, a stray (a message from a rank that
	// owes this one nothing more in the exchange), and an agreement that
	// says a rank sent fewer messages than arrived from it.
	ErrUnexpectedPeer = errors.New("msg: message from an unexpected peer")
	// ErrPatternMismatch matches an exchange that departs from its
	// persistent pattern: other sizes, other destinations, another manifest.
	ErrPatternMismatch = errors.New("msg: exchange does not match the persistent pattern")
	// ErrPeerAborted matches another rank's failure of a collective step
	// this rank took part in: a -1 in the count exchange, an abort notice
	// in place of a message, a failure reported in the agreement that ends
	// every exchange, or a rank that could not set up its exchanger in New.
	// That rank's own error says why.
	ErrPeerAborted = errors.New("msg: peer aborted the exchange")
	// ErrTooLarge matches a length a peer announced that this rank cannot
	// take: beyond the protocol's limits, its budget or its memory. Nothing
	// is allocated for it; what the peer sends is drained.
	ErrTooLarge = errors.New("msg: announced message too large")
	// ErrTimeout matches an exchange that waited longer than
	// Options.Timeout without any of its messages moving: a peer sent fewer
	// MPI messages than it announced, or took none of this rank's.
	ErrTimeout = errors.New("msg: exchange timed out")
	// ErrInvalid reports a bad argument or option.
	ErrInvalid = errors.New("msg: invalid argument")
	// ErrClosed is returned for any use of an Exchanger after Close.
	ErrClosed = errors.New("msg: exchanger closed")
)

// WireError names the peer, the MPI tag and the field of a message that was
// rejected (or of the exchange step that failed with that peer), and the
// sentinel it matches: ErrMalformed, ErrChecksum (which matches
// ErrMalformed too), ErrSizeMismatch, ErrUnexpectedPeer,
// ErrPatternMismatch, ErrPeerAborted, ErrTooLarge or ErrTimeout.
type WireError struct {
	Peer     int  // the other rank
	Tag      int  // the MPI tag of the message
	Outgoing bool // a message this rank was sending, not receiving
	Field    string
	Reason   string
	Err      error
}

func (e *WireError) Error() string {
	dir := "from"
	if e.Outgoing {
		dir = "to"
	}
	return fmt.Sprintf("msg: message %s rank %d tag %d: field %s: %s", dir, e.Peer, e.Tag, e.Field, e.Reason)
}

// Is matches the sentinel, and ErrMalformed for checksum failures.
func (e *WireError) Is(target error) bool {
	return target == e.Err || (target == ErrMalformed && e.Err == ErrChecksum)
}

// Unwrap exposes the sentinel.
func (e *WireError) Unwrap() error { return e.Err }

// outgoing marks the error as about a message this rank sends.
func (e *WireError) outgoing() *WireError {
	e.Outgoing = true
	return e
}

func wireErr(sentinel error, peer, tag int, field, format string, args ...any) *WireError {
	return &WireError{Peer: peer, Tag: tag, Field: field, Reason: fmt.Sprintf(format, args...), Err: sentinel}
}
