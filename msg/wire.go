package msg

import (
	"encoding/binary"
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
	flagAbort           = 1 << 1
	knownFlags          = flagPayloadChecksum | flagAbort

	// AbortSize is the length of an abort notice: a header without entries
	// or payload, padded to the payload alignment.
	AbortSize = PayloadAlign
)

// DType is the element type code on the wire. The codes of the four element
// types equal packing's.
type DType uint8

const (
	Mixed      DType = 0 // header only: blocks of several types
	Float32    DType = 1
	Float64    DType = 2
	Complex64  DType = 3
	Complex128 DType = 4
)

// dtypeSizes is indexed by DType; 0 marks Mixed and unknown codes.
var dtypeSizes = [...]uint64{0, 4, 8, 8, 16}

// Size is the element size in bytes, 0 for an unknown code or Mixed.
func (d DType) Size() int { return int(d.size()) }

func (d DType) size() uint64 {
	if int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
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

// Bytes is the block's length in the payload. It wraps for shapes of 2^64
// bytes or more, which no decoded or encodable manifest has.
func (e Entry) Bytes() uint64 { return uint64(e.Rows) * uint64(e.Cols) * e.DType.size() }

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
	// Aborted marks an abort notice: the sender failed and sends this, with
	// no entries and no payload, in place of the message it announced.
	Aborted bool
	// PayloadOffset is where the payload starts, from the message start.
	PayloadOffset uint64
}

// Manifest is a decoded, validated manifest.
type Manifest struct {
	Header
	Entries []Entry
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// zeroChecksum stands for the manifest checksum field while it is hashed.
var zeroChecksum [4]byte

// Checksum is the CRC-32C the wire format uses for manifests and payloads.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// PayloadOffset is the size of a manifest with n entries, padded so that the
// payload starts aligned.
func PayloadOffset(n int) uint64 {
	raw := uint64(HeaderSize) + uint64(n)*EntrySize
	return (raw + PayloadAlign - 1) / PayloadAlign * PayloadAlign
}

// EncodeManifest writes the manifest for h and entries into dst, which must
// hold at least PayloadOffset(len(entries)) bytes; the padding up to the
// payload is zeroed. h.Count and h.PayloadOffset are filled in. Entries must
// be in increasing offset order without overlap, inside h.PayloadLen.
func EncodeManifest(dst []byte, h Header, entries []Entry) error {
	if uint64(len(entries)) > math.MaxUint32 {
		return fmt.Errorf("msg: encode: %d entries exceed the format's limit: %w", len(entries), ErrMalformed)
	}
	h.Count = uint32(len(entries))
	h.PayloadOffset = PayloadOffset(len(entries))
	if uint64(len(dst)) < h.PayloadOffset {
		return fmt.Errorf("msg: encode: manifest needs %d bytes, buffer has %d: %w", h.PayloadOffset, len(dst), ErrMalformed)
	}
	if h.Aborted && (len(entries) > 0 || h.PayloadLen > 0 || h.HasPayloadChecksum) {
		return fmt.Errorf("msg: encode: an abort notice carries no entries, payload or payload checksum: %w", ErrMalformed)
	}
	if err := validateEntries(h, entries, -1, -1); err != nil {
		return fmt.Errorf("msg: encode: %w", err)
	}
	b := dst[:h.PayloadOffset]
	encodeEntries(b[HeaderSize:], entries)
	clear(b[HeaderSize+len(entries)*EntrySize:])
	sealHeader(b, h, b[HeaderSize:HeaderSize+len(entries)*EntrySize])
	return nil
}

// encodeEntries writes entries at the start of dst.
func encodeEntries(dst []byte, entries []Entry) {
	le := binary.LittleEndian
	for i, e := range entries {
		p := dst[i*EntrySize : (i+1)*EntrySize]
		le.PutUint64(p[0:], e.ID)
		le.PutUint64(p[8:], e.Offset)
		le.PutUint32(p[16:], e.Rows)
		le.PutUint32(p[20:], e.Cols)
		p[24] = byte(e.DType)
		clear(p[25:])
	}
}

// sealHeader writes the header of h into b[:HeaderSize] and the manifest
// checksum over it and the encoded entries, which must already be in place.
func sealHeader(b []byte, h Header, encodedEntries []byte) {
	hdr := b[:HeaderSize]
	writeHeader(hdr, h, len(encodedEntries)/EntrySize)
	binary.LittleEndian.PutUint32(hdr[60:], crc32.Update(crc32.Checksum(hdr, castagnoli), castagnoli, encodedEntries))
}

// sealHeaderKnown is sealHeader for entries whose CRC-32C is known: only
// the 64 header bytes are hashed.
func sealHeaderKnown(hdr []byte, h Header, count int, entriesCRC uint32, shift *crcShift) {
	writeHeader(hdr, h, count)
	binary.LittleEndian.PutUint32(hdr[60:], crcCombine(Checksum(hdr[:HeaderSize]), entriesCRC, shift))
}

// writeHeader writes every header field but the manifest checksum, which
// it leaves 0.
func writeHeader(hdr []byte, h Header, count int) {
	le := binary.LittleEndian
	hdr = hdr[:HeaderSize]
	clear(hdr)
	copy(hdr[0:4], wireMagic)
	le.PutUint16(hdr[4:], WireVersion)
	var flags uint16
	if h.HasPayloadChecksum {
		flags |= flagPayloadChecksum
		le.PutUint32(hdr[56:], h.PayloadChecksum)
	}
	if h.Aborted {
		flags |= flagAbort
	}
	le.PutUint16(hdr[6:], flags)
	le.PutUint32(hdr[8:], uint32(h.Source))
	le.PutUint32(hdr[12:], uint32(h.Dest))
	le.PutUint32(hdr[16:], uint32(h.Tag))
	hdr[20] = byte(h.DType)
	le.PutUint32(hdr[24:], uint32(count))
	le.PutUint32(hdr[28:], EntrySize)
	le.PutUint64(hdr[32:], h.Epoch)
	le.PutUint64(hdr[40:], PayloadOffset(count))
	le.PutUint64(hdr[48:], h.PayloadLen)
}

// EncodeAbort writes the abort notice a sender sends in place of a message
// it announced but cannot deliver: AbortSize bytes.
func EncodeAbort(dst []byte, h Header) error {
	h.Aborted, h.HasPayloadChecksum, h.PayloadChecksum, h.PayloadLen, h.DType = true, false, 0, 0, Mixed
	return EncodeManifest(dst, h, nil)
}

// DecodeManifest validates and decodes the manifest at the start of msg, a
// whole received message. peer and tag name the message in errors. It checks
// the manifest checksum always, and the payload length against len(msg); the
// payload checksum is checked by VerifyPayload, so that a payload still on
// the device can be checked where it is.
func DecodeManifest(msg []byte, peer, tag int) (*Manifest, error) {
	h, _, err := decodeHeader(msg, uint64(len(msg)), peer, tag, nil)
	if err != nil {
		return nil, err
	}
	entries, err := decodeEntries(h, msg, peer, tag)
	if err != nil {
		return nil, err
	}
	return &Manifest{Header: h, Entries: entries}, nil
}

// ManifestSize reads, from the first HeaderSize bytes of a message, how
// long its manifest is (the payload offset), without validating anything
// else: a receiver that gets a message in pieces learns from it how many
// bytes to gather before decoding.
func ManifestSize(header []byte) (uint64, bool) {
	if len(header) < HeaderSize {
		return 0, false
	}
	return PayloadOffset(int(binary.LittleEndian.Uint32(header[24:]))), true
}

// decodeHeader runs validation steps 1 to 6 of docs/WIRE.md on man, which
// holds at least the manifest of a message of msgLen bytes (all of it when
// it is shorter), and returns the header. When the entries are byte for
// byte those of known, a layout decoded before, it says so and hashes only
// the header for the manifest checksum, using the known entries' CRC.
func decodeHeader(man []byte, msgLen uint64, peer, tag int, known *learnedIn) (h Header, matched bool, err error) {
	bad := func(field, format string, args ...any) error {
		return wireErr(ErrMalformed, peer, tag, field, format, args...)
	}
	if msgLen < HeaderSize || len(man) < HeaderSize {
		return h, false, bad("header", "truncated: %d bytes, the header alone is %d", min(msgLen, uint64(len(man))), HeaderSize)
	}
	le := binary.LittleEndian
	if string(man[0:4]) != wireMagic {
		return h, false, bad("magic", "got %q, want %q", man[0:4], wireMagic)
	}
	if v := le.Uint16(man[4:]); v != WireVersion {
		return h, false, bad("version", "unsupported version %d (this decoder reads %d)", v, WireVersion)
	}
	flags := le.Uint16(man[6:])
	if flags&^knownFlags != 0 {
		return h, false, bad("flags", "unknown flag bits %#x", flags&^knownFlags)
	}
	if man[21] != 0 || man[22] != 0 || man[23] != 0 {
		return h, false, bad("reserved", "header bytes 21-23 must be zero")
	}
	if es := le.Uint32(man[28:]); es != EntrySize {
		return h, false, bad("entry_size", "got %d, want %d", es, EntrySize)
	}
	h.Source = int32(le.Uint32(man[8:]))
	h.Dest = int32(le.Uint32(man[12:]))
	h.Tag = int32(le.Uint32(man[16:]))
	h.DType = DType(man[20])
	h.Count = le.Uint32(man[24:])
	h.Epoch = le.Uint64(man[32:])
	h.PayloadOffset = le.Uint64(man[40:])
	h.PayloadLen = le.Uint64(man[48:])
	h.HasPayloadChecksum = flags&flagPayloadChecksum != 0
	h.Aborted = flags&flagAbort != 0
	h.PayloadChecksum = le.Uint32(man[56:])
	if !h.HasPayloadChecksum && h.PayloadChecksum != 0 {
		return h, false, bad("payload_checksum", "set without the payload-checksum flag")
	}
	if h.DType != Mixed && h.DType.Size() == 0 {
		return h, false, bad("dtype", "unknown dtype code %d", uint8(h.DType))
	}
	if want := PayloadOffset(int(h.Count)); h.PayloadOffset != want {
		return h, false, bad("payload_offset", "got %d, want %d for %d entries", h.PayloadOffset, want, h.Count)
	}
	if h.PayloadOffset > msgLen || h.PayloadOffset > uint64(len(man)) {
		return h, false, bad("block_count", "%d entries need a %d-byte manifest, message has %d bytes", h.Count, h.PayloadOffset, min(msgLen, uint64(len(man))))
	}
	end := HeaderSize + int(h.Count)*EntrySize
	want := le.Uint32(man[60:])
	// The header's CRC with its checksum field read as 0, hashed in place:
	// a copy of the header would escape to the heap through crc32.
	hsum := crcUpdate(crcUpdate(0, man[:60]), zeroChecksum[:])
	var sum uint32
	if matched = known.matches(h, man[HeaderSize:end]); matched {
		sum = crcCombine(hsum, known.entriesCRC, known.shiftOp())
	} else {
		sum = crcUpdate(hsum, man[HeaderSize:end])
	}
	if sum != want {
		return h, false, wireErr(ErrChecksum, peer, tag, "manifest_checksum", "computed %#08x, header says %#08x", sum, want)
	}
	for _, c := range man[end:h.PayloadOffset] {
		if c != 0 {
			return h, false, bad("padding", "manifest padding must be zero")
		}
	}
	if got := msgLen - h.PayloadOffset; got != h.PayloadLen {
		return h, false, bad("payload_length", "header says %d bytes, message carries %d", h.PayloadLen, got)
	}
	if h.Aborted && (h.Count != 0 || h.PayloadLen != 0 || h.HasPayloadChecksum || h.DType != Mixed) {
		return h, false, bad("flags", "an abort notice must have no entries, no payload, no payload checksum and dtype 0")
	}
	return h, matched, nil
}

// decodeEntries runs validation step 6 on the entries of a manifest whose
// header decodeHeader accepted.
func decodeEntries(h Header, man []byte, peer, tag int) ([]Entry, error) {
	c := newEntryCheck(h, peer, tag)
	if err := c.header(); err != nil {
		return nil, err
	}
	entries := make([]Entry, h.Count)
	for i := range entries {
		e, err := entryAt(man, i, peer, tag)
		if err == nil {
			err = c.check(i, e)
		}
		if err != nil {
			return nil, err
		}
		entries[i] = e
	}
	if !c.increasing {
		if i := firstDuplicate(len(entries), func(i int) uint64 { return entries[i].ID }); i >= 0 {
			return nil, c.duplicate(i, entries[i].ID)
		}
	}
	return entries, nil
}

func validateEntries(h Header, entries []Entry, peer, tag int) error {
	c := newEntryCheck(h, peer, tag)
	if err := c.header(); err != nil {
		return err
	}
	for i, e := range entries {
		if err := c.check(i, e); err != nil {
			return err
		}
	}
	if !c.increasing {
		if i := firstDuplicate(len(entries), func(i int) uint64 { return entries[i].ID }); i >= 0 {
			return c.duplicate(i, entries[i].ID)
		}
	}
	return nil
}

// entryCheck validates entries one at a time (step 6 of docs/WIRE.md, but
// for duplicate ids, which need every id: when the ids are not strictly
// increasing the caller runs firstDuplicate at the end).
type entryCheck struct {
	h          Header
	peer, tag  int
	next       uint64
	prevID     uint64
	increasing bool // strictly increasing ids so far: no duplicate possible
}

func newEntryCheck(h Header, peer, tag int) entryCheck {
	return entryCheck{h: h, peer: peer, tag: tag, increasing: true}
}

func (c *entryCheck) header() error {
	if c.h.DType != Mixed && c.h.DType.Size() == 0 {
		return wireErr(ErrMalformed, c.peer, c.tag, "dtype", "unknown dtype code %d", uint8(c.h.DType))
	}
	return nil
}

func (c *entryCheck) bad(i int, field, format string, args ...any) error {
	return wireErr(ErrMalformed, c.peer, c.tag, fmt.Sprintf("entry[%d].%s", i, field), format, args...)
}

func (c *entryCheck) check(i int, e Entry) error {
	size := e.DType.size()
	switch {
	case size == 0:
		return c.bad(i, "dtype", "unknown dtype code %d", uint8(e.DType))
	case c.h.DType != Mixed && e.DType != c.h.DType:
		return c.bad(i, "dtype", "%v in a message of %v blocks", e.DType, c.h.DType)
	case e.Rows == 0 || e.Cols == 0:
		return c.bad(i, "shape", "empty block %dx%d", e.Rows, e.Cols)
	case e.Offset < c.next:
		return c.bad(i, "offset", "%d overlaps the previous block (ends at %d); blocks must be in offset order", e.Offset, c.next)
	case e.Offset&(size-1) != 0: // sizes are powers of two
		return c.bad(i, "offset", "%d is not aligned to the %d-byte element", e.Offset, size)
	}
	// rows*cols*size < 2^32 * 2^32 * 2^4 may overflow: compute it in 128 bits.
	hiMul, n := bits.Mul64(uint64(e.Rows)*uint64(e.Cols), size)
	hi, carry := bits.Add64(e.Offset, n, 0)
	if hiMul != 0 {
		carry = 1
	}
	if carry != 0 || hi > c.h.PayloadLen {
		return c.bad(i, "offset", "block [%d, +%d) runs past the %d-byte payload", e.Offset, e.Bytes(), c.h.PayloadLen)
	}
	c.increasing = c.increasing && (i == 0 || e.ID > c.prevID)
	c.prevID, c.next = e.ID, hi
	return nil
}

func (c *entryCheck) duplicate(i int, id uint64) error {
	return c.bad(i, "id", "block id %d appears twice", id)
}

// entryAt decodes entry i of a manifest, with its reserved bytes checked.
func entryAt(man []byte, i int, peer, tag int) (Entry, error) {
	le := binary.LittleEndian
	p := man[HeaderSize+i*EntrySize : HeaderSize+(i+1)*EntrySize]
	if le.Uint32(p[25:]) != 0 || le.Uint32(p[28:]) != 0 {
		return Entry{}, wireErr(ErrMalformed, peer, tag, fmt.Sprintf("entry[%d].reserved", i), "must be zero")
	}
	return Entry{ID: le.Uint64(p[0:]), Offset: le.Uint64(p[8:]), Rows: le.Uint32(p[16:]), Cols: le.Uint32(p[20:]), DType: DType(p[24])}, nil
}

// firstDuplicate returns the index of the first of n ids that an earlier
// one equals, or -1: an open-addressing set of twice n's size, so a
// manifest of 10^5 blocks is checked in a few hundred microseconds without
// a map.
func firstDuplicate(n int, id func(i int) uint64) int {
	if n < 2 {
		return -1
	}
	size := 1 << bits.Len(uint(2*n-1))
	set := make([]uint64, size) // id+1, so that 0 marks an empty slot
	mask := uint64(size - 1)
	zero := false // id MaxUint64 wraps to 0: tracked apart
	for i := range n {
		key := id(i) + 1
		if key == 0 {
			if zero {
				return i
			}
			zero = true
			continue
		}
		h := key * 0x9E3779B97F4A7C15
		for h = (h ^ h>>31) & mask; set[h] != 0; h = (h + 1) & mask {
			if set[h] == key {
				return i
			}
		}
		set[h] = key
	}
	return -1
}

// VerifyPayload checks the payload checksum, if the sender set one.
func (m *Manifest) VerifyPayload(payload []byte, peer, tag int) error {
	if uint64(len(payload)) != m.PayloadLen {
		return wireErr(ErrMalformed, peer, tag, "payload_length", "header says %d bytes, got %d", m.PayloadLen, len(payload))
	}
	if !m.HasPayloadChecksum {
		return nil
	}
	if sum := Checksum(payload); sum != m.PayloadChecksum {
		return wireErr(ErrChecksum, peer, tag, "payload_checksum", "computed %#08x, header says %#08x", sum, m.PayloadChecksum)
	}
	return nil
}

// crcUpdate continues a CRC-32C over more bytes: crcUpdate(0, b) ==
// Checksum(b).
func crcUpdate(sum uint32, b []byte) uint32 { return crc32.Update(sum, castagnoli, b) }
