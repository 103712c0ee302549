package msg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
)

// The wire format is documented byte for byte in docs/WIRE.md. Every field
// is little-endian.
const (
	wireMagic    = "DBUF"
	WireVersion  = 1
	HeaderSize   = 64
	EntrySize    = 32
	PayloadAlign = 256 // the payload starts at a multiple of this from the message start

	flagPayloadChecksum = 1 << 0
	knownFlags          = flagPayloadChecksum
)

// DType is the element type code on the wire.
type DType uint8

const (
	Mixed      DType = 0 // header only: blocks of several types
	Float32    DType = 1
	Float64    DType = 2
	Complex64  DType = 3
	Complex128 DType = 4
)

// Size is the element size in bytes, 0 for an unknown code or Mixed.
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case Float64, Complex64:
		return 8
	case Complex128:
		return 16
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case Mixed:
		return "mixed"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Complex64:
		return "complex64"
	case Complex128:
		return "complex128"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Entry describes one block of the payload.
type Entry struct {
	ID     uint64
	Offset uint64 // from the start of the payload
	Rows   uint32
	Cols   uint32
	DType  DType
}

// Bytes is the block's length in the payload.
func (e Entry) Bytes() uint64 { return uint64(e.Rows) * uint64(e.Cols) * uint64(e.DType.Size()) }

// Header is the fixed part of the manifest.
type Header struct {
	Source, Dest int32  // ranks in the communicator of the exchange
	Tag          int32  // the MPI tag the message is sent with
	Epoch        uint64 // exchange sequence number, for persistent plans
	DType        DType  // the type of every block, or Mixed
	Count        uint32 // number of entries
	PayloadLen   uint64
	// PayloadChecksum is the CRC-32C of the payload when HasPayloadChecksum.
	PayloadChecksum    uint32
	HasPayloadChecksum bool
	// PayloadOffset is where the payload starts, from the message start.
	PayloadOffset uint64
}

// Manifest is a decoded, validated manifest.
type Manifest struct {
	Header
	Entries []Entry
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C the wire format uses for manifests and payloads.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// PayloadOffset is the size of a manifest with n entries, padded so that the
// payload starts aligned.
func PayloadOffset(n int) uint64 {
	raw := uint64(HeaderSize) + uint64(n)*EntrySize
	return (raw + PayloadAlign - 1) / PayloadAlign * PayloadAlign
}

// Sentinel errors; every *WireError matches ErrMalformed, and checksum
// failures match ErrChecksum too.
var (
	ErrMalformed = errors.New("msg: malformed message")
	ErrChecksum  = errors.New("msg: checksum mismatch")
)

// WireError names the peer, the MPI tag and the field of a bad message.
type WireError struct {
	Peer   int
	Tag    int
	Field  string
	Reason string
	sum    bool
}

func (e *WireError) Error() string {
	return fmt.Sprintf("msg: message from rank %d tag %d: field %s: %s", e.Peer, e.Tag, e.Field, e.Reason)
}

// Is matches ErrMalformed, and ErrChecksum for checksum failures.
func (e *WireError) Is(target error) bool {
	return target == ErrMalformed || (e.sum && target == ErrChecksum)
}

// EncodeManifest writes the manifest for h and entries into dst, which must
// hold at least PayloadOffset(len(entries)) bytes; the padding up to the
// payload is zeroed. h.Count and h.PayloadOffset are filled in. Entries must
// be in increasing offset order without overlap, inside h.PayloadLen.
func EncodeManifest(dst []byte, h Header, entries []Entry) error {
	h.Count = uint32(len(entries))
	if uint64(len(entries)) > math.MaxUint32 {
		return fmt.Errorf("msg: encode: %d entries exceed the format's limit: %w", len(entries), ErrMalformed)
	}
	h.PayloadOffset = PayloadOffset(len(entries))
	if uint64(len(dst)) < h.PayloadOffset {
		return fmt.Errorf("msg: encode: manifest needs %d bytes, buffer has %d: %w", h.PayloadOffset, len(dst), ErrMalformed)
	}
	if err := validateEntries(h, entries, -1, -1); err != nil {
		return fmt.Errorf("msg: encode: %w", err)
	}
	b := dst[:h.PayloadOffset]
	clear(b)
	copy(b[0:4], wireMagic)
	le := binary.LittleEndian
	le.PutUint16(b[4:], WireVersion)
	var flags uint16
	if h.HasPayloadChecksum {
		flags |= flagPayloadChecksum
		le.PutUint32(b[56:], h.PayloadChecksum)
	}
	le.PutUint16(b[6:], flags)
	le.PutUint32(b[8:], uint32(h.Source))
	le.PutUint32(b[12:], uint32(h.Dest))
	le.PutUint32(b[16:], uint32(h.Tag))
	b[20] = byte(h.DType)
	le.PutUint32(b[24:], h.Count)
	le.PutUint32(b[28:], EntrySize)
	le.PutUint64(b[32:], h.Epoch)
	le.PutUint64(b[40:], h.PayloadOffset)
	le.PutUint64(b[48:], h.PayloadLen)
	for i, e := range entries {
		p := b[HeaderSize+i*EntrySize:]
		le.PutUint64(p[0:], e.ID)
		le.PutUint64(p[8:], e.Offset)
		le.PutUint32(p[16:], e.Rows)
		le.PutUint32(p[20:], e.Cols)
		p[24] = byte(e.DType)
	}
	end := HeaderSize + len(entries)*EntrySize
	le.PutUint32(b[60:], Checksum(b[:end]))
	return nil
}

// DecodeManifest validates and decodes the manifest at the start of msg, a
// whole received message. peer and tag name the message in errors. It checks
// the manifest checksum always, and the payload length against len(msg); the
// payload checksum is checked by VerifyPayload, so that a payload still on
// the device can be checked where it is.
func DecodeManifest(msg []byte, peer, tag int) (*Manifest, error) {
	bad := func(field, format string, args ...any) error {
		return &WireError{Peer: peer, Tag: tag, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if len(msg) < HeaderSize {
		return nil, bad("header", "truncated: %d bytes, the header alone is %d", len(msg), HeaderSize)
	}
	le := binary.LittleEndian
	if string(msg[0:4]) != wireMagic {
		return nil, bad("magic", "got %q, want %q", msg[0:4], wireMagic)
	}
	if v := le.Uint16(msg[4:]); v != WireVersion {
		return nil, bad("version", "unsupported version %d (this decoder reads %d)", v, WireVersion)
	}
	flags := le.Uint16(msg[6:])
	if flags&^knownFlags != 0 {
		return nil, bad("flags", "unknown flag bits %#x", flags&^knownFlags)
	}
	if msg[21] != 0 || msg[22] != 0 || msg[23] != 0 {
		return nil, bad("reserved", "header bytes 21-23 must be zero")
	}
	if es := le.Uint32(msg[28:]); es != EntrySize {
		return nil, bad("entry_size", "got %d, want %d", es, EntrySize)
	}
	m := &Manifest{}
	h := &m.Header
	h.Source = int32(le.Uint32(msg[8:]))
	h.Dest = int32(le.Uint32(msg[12:]))
	h.Tag = int32(le.Uint32(msg[16:]))
	h.DType = DType(msg[20])
	h.Count = le.Uint32(msg[24:])
	h.Epoch = le.Uint64(msg[32:])
	h.PayloadOffset = le.Uint64(msg[40:])
	h.PayloadLen = le.Uint64(msg[48:])
	h.HasPayloadChecksum = flags&flagPayloadChecksum != 0
	h.PayloadChecksum = le.Uint32(msg[56:])
	if !h.HasPayloadChecksum && h.PayloadChecksum != 0 {
		return nil, bad("payload_checksum", "set without the payload-checksum flag")
	}
	if h.DType != Mixed && h.DType.Size() == 0 {
		return nil, bad("dtype", "unknown dtype code %d", uint8(h.DType))
	}
	if want := PayloadOffset(int(h.Count)); h.PayloadOffset != want {
		return nil, bad("payload_offset", "got %d, want %d for %d entries", h.PayloadOffset, want, h.Count)
	}
	if h.PayloadOffset > uint64(len(msg)) {
		return nil, bad("block_count", "%d entries need a %d-byte manifest, message has %d bytes", h.Count, h.PayloadOffset, len(msg))
	}
	end := HeaderSize + int(h.Count)*EntrySize
	want := le.Uint32(msg[60:])
	hdr := [HeaderSize]byte(msg[:HeaderSize])
	le.PutUint32(hdr[60:], 0)
	sum := crc32.Update(crc32.Checksum(hdr[:], castagnoli), castagnoli, msg[HeaderSize:end])
	if sum != want {
		e := bad("manifest_checksum", "computed %#08x, header says %#08x", sum, want).(*WireError)
		e.sum = true
		return nil, e
	}
	for _, c := range msg[end:h.PayloadOffset] {
		if c != 0 {
			return nil, bad("padding", "manifest padding must be zero")
		}
	}
	if got := uint64(len(msg)) - h.PayloadOffset; got != h.PayloadLen {
		return nil, bad("payload_length", "header says %d bytes, message carries %d", h.PayloadLen, got)
	}
	m.Entries = make([]Entry, h.Count)
	for i := range m.Entries {
		p := msg[HeaderSize+i*EntrySize:]
		m.Entries[i] = Entry{ID: le.Uint64(p[0:]), Offset: le.Uint64(p[8:]), Rows: le.Uint32(p[16:]), Cols: le.Uint32(p[20:]), DType: DType(p[24])}
		for _, c := range p[25:32] {
			if c != 0 {
				return nil, bad(fmt.Sprintf("entry[%d].reserved", i), "must be zero")
			}
		}
	}
	if err := validateEntries(*h, m.Entries, peer, tag); err != nil {
		return nil, err
	}
	return m, nil
}

func validateEntries(h Header, entries []Entry, peer, tag int) error {
	bad := func(i int, field, format string, args ...any) error {
		return &WireError{Peer: peer, Tag: tag, Field: fmt.Sprintf("entry[%d].%s", i, field), Reason: fmt.Sprintf(format, args...)}
	}
	if h.DType != Mixed && h.DType.Size() == 0 {
		return &WireError{Peer: peer, Tag: tag, Field: "dtype", Reason: fmt.Sprintf("unknown dtype code %d", uint8(h.DType))}
	}
	seen := make(map[uint64]struct{}, len(entries))
	var next uint64
	for i, e := range entries {
		if e.DType.Size() == 0 {
			return bad(i, "dtype", "unknown dtype code %d", uint8(e.DType))
		}
		if h.DType != Mixed && e.DType != h.DType {
			return bad(i, "dtype", "%v in a message of %v blocks", e.DType, h.DType)
		}
		if e.Rows == 0 || e.Cols == 0 {
			return bad(i, "shape", "empty block %dx%d", e.Rows, e.Cols)
		}
		if e.Offset < next {
			return bad(i, "offset", "%d overlaps the previous block (ends at %d); blocks must be in offset order", e.Offset, next)
		}
		if e.Offset%uint64(e.DType.Size()) != 0 {
			return bad(i, "offset", "%d is not aligned to the %d-byte element", e.Offset, e.DType.Size())
		}
		hi, carry := bits.Add64(e.Offset, e.Bytes(), 0)
		if carry != 0 || hi > h.PayloadLen {
			return bad(i, "offset", "block [%d, +%d) runs past the %d-byte payload", e.Offset, e.Bytes(), h.PayloadLen)
		}
		if _, dup := seen[e.ID]; dup {
			return bad(i, "id", "block id %d appears twice", e.ID)
		}
		seen[e.ID] = struct{}{}
		next = hi
	}
	return nil
}

// VerifyPayload checks the payload checksum, if the sender set one.
func (m *Manifest) VerifyPayload(payload []byte, peer, tag int) error {
	if uint64(len(payload)) != m.PayloadLen {
		return &WireError{Peer: peer, Tag: tag, Field: "payload_length", Reason: fmt.Sprintf("header says %d bytes, got %d", m.PayloadLen, len(payload))}
	}
	if !m.HasPayloadChecksum {
		return nil
	}
	if sum := Checksum(payload); sum != m.PayloadChecksum {
		return &WireError{Peer: peer, Tag: tag, Field: "payload_checksum", Reason: fmt.Sprintf("computed %#08x, header says %#08x", sum, m.PayloadChecksum), sum: true}
	}
	return nil
}
