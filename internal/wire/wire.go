package wire

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"

	"github.com/distbuf/distbuf/packing"
)

// The wire format is documented byte for byte in docs/WIRE.md. Every field
// is little-endian.
const (
	magic        = "DBUF"
	Version      = 1
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

// Mixed is the header's dtype code for a message whose blocks are not all
// of one type (and for one without blocks). The codes of the four element
// types are packing's: Float32 1, Float64 2, Complex64 3, Complex128 4.
const Mixed packing.DType = 0

// elemSize is the element size of a dtype code, 0 for Mixed and unknown
// codes.
func elemSize(d packing.DType) uint64 { return uint64(d.Size()) }

// rawEntry is an entry as its bytes give it, before it is known to fit
// packing.Entry's signed fields.
type rawEntry struct {
	id, offset uint64
	rows, cols uint32
	dtype      packing.DType
}

func (e rawEntry) entry() packing.Entry {
	return packing.Entry{ID: e.id, DType: e.dtype, Rows: int(e.rows), Cols: int(e.cols), Offset: int64(e.offset)}
}

// bytes is the block's length in the payload. It wraps for shapes of 2^64
// bytes or more, which no decoded or encodable manifest has.
func (e rawEntry) bytes() uint64 { return uint64(e.rows) * uint64(e.cols) * elemSize(e.dtype) }

// Header is the fixed part of the manifest.
type Header struct {
	Source, Dest int32         // ranks in the communicator of the exchange
	Tag          int32         // the MPI tag the message is sent with
	Epoch        uint64        // exchange sequence number, for persistent plans
	DType        packing.DType // the type of every block, or Mixed
	Count        uint32        // number of entries
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

// Manifest is a decoded, validated manifest. Entries fit packing.Entry:
// a payload is shorter than 2^63 bytes (its message's length is an int), so
// every offset inside it is a valid int64.
type Manifest struct {
	Header
	Entries []packing.Entry
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
func EncodeManifest(dst []byte, h Header, entries []packing.Entry) error {
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
	b := dst[:h.PayloadOffset]
	end := HeaderSize + len(entries)*EntrySize
	if err := encodeEntries(b[HeaderSize:end], h, entries); err != nil {
		return fmt.Errorf("msg: encode: %w", err)
	}
	clear(b[end:])
	sealHeader(b, h, b[HeaderSize:end])
	return nil
}

// encodeEntries validates entries for a message with header h (step 6 of
// docs/WIRE.md, as a decoder will run it) and writes them into dst, which
// holds len(entries)*EntrySize bytes.
func encodeEntries(dst []byte, h Header, entries []packing.Entry) error {
	c := newEntryCheck(h, -1, -1)
	if err := c.header(); err != nil {
		return err
	}
	le := binary.LittleEndian
	for i, e := range entries {
		raw, err := c.fits(i, e)
		if err == nil {
			err = c.check(i, raw)
		}
		if err != nil {
			return err
		}
		p := dst[i*EntrySize : (i+1)*EntrySize]
		le.PutUint64(p[0:], raw.id)
		le.PutUint64(p[8:], raw.offset)
		le.PutUint32(p[16:], raw.rows)
		le.PutUint32(p[20:], raw.cols)
		p[24] = byte(raw.dtype)
		clear(p[25:])
	}
	return c.finish(len(entries), func(i int) uint64 { return entries[i].ID })
}

// sealHeader writes the header of h into b[:HeaderSize] and the manifest
// checksum over it and the encoded entries, which must already be in place.
func sealHeader(b []byte, h Header, encodedEntries []byte) {
	hdr := b[:HeaderSize]
	writeHeader(hdr, h, len(encodedEntries)/EntrySize)
	binary.LittleEndian.PutUint32(hdr[60:], crc32.Update(crc32.Checksum(hdr, castagnoli), castagnoli, encodedEntries))
}

// writeHeader writes every header field but the manifest checksum, which
// it leaves 0.
func writeHeader(hdr []byte, h Header, count int) {
	le := binary.LittleEndian
	hdr = hdr[:HeaderSize]
	clear(hdr)
	copy(hdr[0:4], magic)
	le.PutUint16(hdr[4:], Version)
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
	h, _, err := DecodeHeader(msg, uint64(len(msg)), peer, tag, nil)
	if err != nil {
		return nil, err
	}
	entries, err := DecodeEntries(h, msg, peer, tag, nil)
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

// PayloadChecksumAnnounced reads, from the first HeaderSize bytes of a
// message, whether its header announces a payload checksum, without
// validating anything else: a receiver that gets the payload in pieces
// and lets each go once it is copied on learns from it whether to sum
// them as they pass. DecodeHeader checks the flag with the rest.
func PayloadChecksumAnnounced(header []byte) (bool, bool) {
	if len(header) < HeaderSize {
		return false, false
	}
	return binary.LittleEndian.Uint16(header[6:])&flagPayloadChecksum != 0, true
}

// DecodeHeader runs validation steps 1 to 6 of docs/WIRE.md on man, which
// holds at least the manifest of a message of msgLen bytes (all of it when
// it is shorter), and returns the header; DecodeEntries then reads the
// entries. When the entries are byte for byte those of known, a layout
// kept from before, it says so (matched) and hashes only the header for
// the manifest checksum, using the known entries' CRC: the entries need
// not be decoded again.
func DecodeHeader(man []byte, msgLen uint64, peer, tag int, known *Layout) (h Header, matched bool, err error) {
	bad := func(field, format string, args ...any) error {
		return Errorf(ErrMalformed, peer, tag, field, format, args...)
	}
	if msgLen < HeaderSize || len(man) < HeaderSize {
		return h, false, bad("header", "truncated: %d bytes, the header alone is %d", min(msgLen, uint64(len(man))), HeaderSize)
	}
	le := binary.LittleEndian
	if string(man[0:4]) != magic {
		return h, false, bad("magic", "got %q, want %q", man[0:4], magic)
	}
	if v := le.Uint16(man[4:]); v != Version {
		return h, false, bad("version", "unsupported version %d (this decoder reads %d)", v, Version)
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
	h.DType = packing.DType(man[20])
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
	if h.DType != Mixed && elemSize(h.DType) == 0 {
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
	hsum := UpdateChecksum(UpdateChecksum(0, man[:60]), zeroChecksum[:])
	var sum uint32
	if matched = known.matches(h, man[HeaderSize:end]); matched {
		sum = crcCombine(hsum, known.entriesCRC, known.shiftOp())
	} else {
		sum = UpdateChecksum(hsum, man[HeaderSize:end])
	}
	if sum != want {
		return h, false, Errorf(ErrChecksum, peer, tag, "manifest_checksum", "computed %#08x, header says %#08x", sum, want)
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

// DecodeEntries runs validation step 6 on the entries of a manifest whose
// header DecodeHeader accepted, and appends them to dst[:0] (a caller that
// decodes often passes the slice it got back last time).
func DecodeEntries(h Header, man []byte, peer, tag int, dst []packing.Entry) ([]packing.Entry, error) {
	c := newEntryCheck(h, peer, tag)
	if err := c.header(); err != nil {
		return dst[:0], err
	}
	le := binary.LittleEndian
	entries := dst[:0]
	for i := range int(h.Count) {
		p := man[HeaderSize+i*EntrySize : HeaderSize+(i+1)*EntrySize]
		if le.Uint32(p[25:]) != 0 || le.Uint32(p[28:]) != 0 {
			return entries, Errorf(ErrMalformed, peer, tag, fmt.Sprintf("entry[%d].reserved", i), "must be zero")
		}
		raw := rawEntry{id: le.Uint64(p[0:]), offset: le.Uint64(p[8:]), rows: le.Uint32(p[16:]), cols: le.Uint32(p[20:]), dtype: packing.DType(p[24])}
		if err := c.check(i, raw); err != nil {
			return entries, err
		}
		entries = append(entries, raw.entry())
	}
	return entries, c.finish(len(entries), func(i int) uint64 { return entries[i].ID })
}

// entryCheck validates entries one at a time (step 6 of docs/WIRE.md, but
// for duplicate ids, which need every id: finish looks for them, and only
// when the ids were not strictly increasing).
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
	if c.h.DType != Mixed && elemSize(c.h.DType) == 0 {
		return Errorf(ErrMalformed, c.peer, c.tag, "dtype", "unknown dtype code %d", uint8(c.h.DType))
	}
	return nil
}

func (c *entryCheck) bad(i int, field, format string, args ...any) error {
	return Errorf(ErrMalformed, c.peer, c.tag, fmt.Sprintf("entry[%d].%s", i, field), format, args...)
}

// fits converts an entry to encode into the format's field widths.
func (c *entryCheck) fits(i int, e packing.Entry) (rawEntry, error) {
	switch {
	case e.Rows < 0 || e.Cols < 0 || uint64(e.Rows) > math.MaxUint32 || uint64(e.Cols) > math.MaxUint32:
		return rawEntry{}, c.bad(i, "shape", "%dx%d does not fit the format's 32-bit dimensions", e.Rows, e.Cols)
	case e.Offset < 0:
		return rawEntry{}, c.bad(i, "offset", "negative offset %d", e.Offset)
	}
	return rawEntry{id: e.ID, offset: uint64(e.Offset), rows: uint32(e.Rows), cols: uint32(e.Cols), dtype: e.DType}, nil
}

func (c *entryCheck) check(i int, e rawEntry) error {
	size := elemSize(e.dtype)
	switch {
	case size == 0:
		return c.bad(i, "dtype", "unknown dtype code %d", uint8(e.dtype))
	case c.h.DType != Mixed && e.dtype != c.h.DType:
		return c.bad(i, "dtype", "%v in a message of %v blocks", e.dtype, c.h.DType)
	case e.rows == 0 || e.cols == 0:
		return c.bad(i, "shape", "empty block %dx%d", e.rows, e.cols)
	case e.offset < c.next:
		return c.bad(i, "offset", "%d overlaps the previous block (ends at %d); blocks must be in offset order", e.offset, c.next)
	case e.offset&(size-1) != 0: // sizes are powers of two
		return c.bad(i, "offset", "%d is not aligned to the %d-byte element", e.offset, size)
	}
	// rows*cols*size < 2^32 * 2^32 * 2^4 may overflow: compute it in 128 bits.
	hiMul, n := bits.Mul64(uint64(e.rows)*uint64(e.cols), size)
	hi, carry := bits.Add64(e.offset, n, 0)
	if hiMul != 0 {
		carry = 1
	}
	if carry != 0 || hi > c.h.PayloadLen {
		return c.bad(i, "offset", "block [%d, +%d) runs past the %d-byte payload", e.offset, e.bytes(), c.h.PayloadLen)
	}
	c.increasing = c.increasing && (i == 0 || e.id > c.prevID)
	c.prevID, c.next = e.id, hi
	return nil
}

// finish checks the n entries checked one by one for a duplicate id.
func (c *entryCheck) finish(n int, id func(i int) uint64) error {
	if c.increasing {
		return nil
	}
	if i := firstDuplicate(n, id); i >= 0 {
		return c.bad(i, "id", "block id %d appears twice", id(i))
	}
	return nil
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
		return Errorf(ErrMalformed, peer, tag, "payload_length", "header says %d bytes, got %d", m.PayloadLen, len(payload))
	}
	if !m.HasPayloadChecksum {
		return nil
	}
	if sum := Checksum(payload); sum != m.PayloadChecksum {
		return Errorf(ErrChecksum, peer, tag, "payload_checksum", "computed %#08x, header says %#08x", sum, m.PayloadChecksum)
	}
	return nil
}

// UpdateChecksum continues a CRC-32C over more bytes: UpdateChecksum(0, b)
// == Checksum(b). A payload that arrives in chunks is checked with it.
func UpdateChecksum(sum uint32, b []byte) uint32 { return crc32.Update(sum, castagnoli, b) }
