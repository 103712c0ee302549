package wire

import (
	"errors"
	"fmt"
)

// The sentinels of a message that breaks the format. Their texts speak as
// msg, which re-exports them: a user meets them only through msg.
var (
	// ErrMalformed matches a message whose bytes break the wire format
	// (docs/WIRE.md); every kind made by NewMalformedKind matches it too.
	ErrMalformed = errors.New("msg: malformed message")
	// ErrChecksum matches a manifest or payload checksum that does not
	// match the bytes.
	ErrChecksum = NewMalformedKind("msg: checksum mismatch")
	// ErrSizeMismatch matches a message, or a piece of one, whose length
	// is not the length announced for it.
	ErrSizeMismatch = NewMalformedKind("msg: message size mismatch")
)

// NewMalformedKind returns a sentinel for one kind of malformed message: a
// caller can tell it from the other kinds, and errors.Is matches it with
// ErrMalformed too.
func NewMalformedKind(text string) error { return &malformedKind{text} }

type malformedKind struct{ text string }

func (k *malformedKind) Error() string { return k.text }

func (k *malformedKind) Is(target error) bool { return target == ErrMalformed }

// Error names the peer, the MPI tag and the field of a message that was
// rejected (or of the exchange step that failed with that peer), and the
// sentinel it matches (Err).
type Error struct {
	Peer     int  // the other rank
	Tag      int  // the MPI tag of the message
	Outgoing bool // a message this rank was sending, not receiving
	Field    string
	Reason   string
	Err      error
}

func (e *Error) Error() string {
	dir := "from"
	if e.Outgoing {
		dir = "to"
	}
	return fmt.Sprintf("msg: message %s rank %d tag %d: field %s: %s", dir, e.Peer, e.Tag, e.Field, e.Reason)
}

// Unwrap exposes the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// Errorf makes the Error for sentinel about a message with peer and tag.
func Errorf(sentinel error, peer, tag int, field, format string, args ...any) *Error {
	return &Error{Peer: peer, Tag: tag, Field: field, Reason: fmt.Sprintf(format, args...), Err: sentinel}
}
