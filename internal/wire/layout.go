package wire

import (
	"encoding/binary"

	"github.com/distbuf/distbuf/packing"
)

// Layout is the entries of a manifest, encoded and checksummed once, with
// the header fields that go with them. A sender that sends the same layout
// again writes only the 64-byte header (Seal); a receiver that gets the
// same layout again hashes only the header (DecodeHeader with the layout as
// known) and decodes no entry.
type Layout struct {
	count      uint32
	dtype      packing.DType
	payloadLen uint64
	entries    []byte // count*EntrySize bytes
	entriesCRC uint32
	shift      *crcShift // advances a CRC by len(entries): built at the first reuse
}

// NewLayout validates entries, in offset order, for a payload of
// payloadLen bytes and encodes them. dtype is the header's: the blocks'
// common type, or Mixed.
func NewLayout(dtype packing.DType, payloadLen uint64, entries []packing.Entry) (*Layout, error) {
	l := &Layout{count: uint32(len(entries)), dtype: dtype, payloadLen: payloadLen, entries: make([]byte, len(entries)*EntrySize)}
	if err := encodeEntries(l.entries, Header{DType: dtype, PayloadLen: payloadLen}, entries); err != nil {
		return nil, err
	}
	l.entriesCRC = Checksum(l.entries)
	return l, nil
}

// ReceivedLayout keeps the layout of a received manifest man whose header h
// DecodeHeader and whose entries DecodeEntries accepted.
func ReceivedLayout(h Header, man []byte) *Layout {
	encoded := man[HeaderSize : HeaderSize+int(h.Count)*EntrySize]
	return &Layout{count: h.Count, dtype: h.DType, payloadLen: h.PayloadLen,
		entries: append([]byte(nil), encoded...), entriesCRC: Checksum(encoded)}
}

// Count is the number of entries.
func (l *Layout) Count() int { return int(l.count) }

// PayloadOffset is where the payload starts in a message of this layout.
func (l *Layout) PayloadOffset() uint64 { return PayloadOffset(int(l.count)) }

// SameEntries reports whether two layouts list the same blocks at the same
// offsets, byte for byte.
func (l *Layout) SameEntries(o *Layout) bool {
	return l.count == o.count && l.dtype == o.dtype && l.payloadLen == o.payloadLen && string(l.entries) == string(o.entries)
}

// Encode writes the whole manifest (header, entries, zero padding) into
// dst, which holds at least PayloadOffset bytes. The layout's dtype and
// payload length replace h's.
func (l *Layout) Encode(dst []byte, h Header) {
	h.DType, h.PayloadLen = l.dtype, l.payloadLen
	end := HeaderSize + len(l.entries)
	copy(dst[HeaderSize:end], l.entries)
	clear(dst[end:l.PayloadOffset()])
	sealHeader(dst, h, dst[HeaderSize:end])
}

// Seal rewrites only the header of a manifest whose entries and padding dst
// already holds. The checksum comes from the entries' known CRC: if the
// bytes in dst were changed meanwhile, the receiver's check of the manifest
// checksum fails, so nothing wrong can pass as valid.
func (l *Layout) Seal(dst []byte, h Header) {
	h.DType, h.PayloadLen = l.dtype, l.payloadLen
	writeHeader(dst, h, int(l.count))
	binary.LittleEndian.PutUint32(dst[60:], crcCombine(Checksum(dst[:HeaderSize]), l.entriesCRC, l.shiftOp()))
}

func (l *Layout) shiftOp() *crcShift {
	if l.shift == nil {
		op := newCRCShift(uint64(len(l.entries)))
		l.shift = &op
	}
	return l.shift
}

// matches reports whether a message with header h and encoded entries has
// this layout.
func (l *Layout) matches(h Header, encoded []byte) bool {
	return l != nil && l.count == h.Count && l.dtype == h.DType && l.payloadLen == h.PayloadLen && string(l.entries) == string(encoded)
}
