package wire

import (
	"encoding/binary"
	"math"
)

// A read notice (docs/WIRE.md, rule 10) is what a sender sends, in place
// of a message, to a node-local peer that reads the message from the
// sender's memory: where it lies.
const (
	// readMagic opens every read notice: "distrd01", little-endian.
	readMagic = 0x3130647274736964
	// ReadNoticeSize is the length of a read notice: magic, address and
	// message length, 8 bytes each.
	ReadNoticeSize = 24
)

// EncodeReadNotice writes the notice of a message of size bytes at addr in
// the sender's memory (ReadNoticeSize bytes).
func EncodeReadNotice(dst []byte, addr uint64, size int64) {
	binary.LittleEndian.PutUint64(dst[0:], readMagic)
	binary.LittleEndian.PutUint64(dst[8:], addr)
	binary.LittleEndian.PutUint64(dst[16:], uint64(size))
}

// DecodeReadNotice checks a read notice from src against the length that
// src announced, and returns where the message lies in src's memory. Its
// errors are *Errors naming src and the field.
func DecodeReadNotice(b []byte, src, tag int, announced int64) (addr uint64, err error) {
	if announced < 0 {
		return 0, Errorf(ErrMalformed, src, tag, "message_size", "a read notice for a message of %d bytes", announced)
	}
	if len(b) != ReadNoticeSize {
		return 0, Errorf(ErrSizeMismatch, src, tag, "message_size", "the read notice of its %d-byte message has %d bytes, a notice has %d", announced, len(b), ReadNoticeSize)
	}
	if m := binary.LittleEndian.Uint64(b); m != readMagic {
		return 0, Errorf(ErrMalformed, src, tag, "read_magic", "the read notice opens with %#016x, not %#016x", m, uint64(readMagic))
	}
	if n := binary.LittleEndian.Uint64(b[16:]); n != uint64(announced) {
		return 0, Errorf(ErrSizeMismatch, src, tag, "message_size", "the read notice says %d bytes, %d were announced", n, announced)
	}
	addr = binary.LittleEndian.Uint64(b[8:])
	if addr == 0 || addr > math.MaxUint64-uint64(announced) {
		return 0, Errorf(ErrMalformed, src, tag, "read_address", "the read notice places its %d bytes at %#x", announced, addr)
	}
	return addr, nil
}
