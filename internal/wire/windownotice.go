package wire

import "encoding/binary"

// A window notice (docs/WIRE.md, rule 9) is what a sender sends through
// MPI, in place of a message it copied into its CUDA IPC window: where the
// message lies, and its manifest.
const (
	// windowMagic opens every window notice: "distipc1", little-endian.
	windowMagic = 0x3163706974736964
	// IPCHandleSize is the length of a cudaIpcMemHandle_t.
	IPCHandleSize = 64
	// WindowNoticeHead is the fixed part of a window notice: magic,
	// generation, window size, offset and length (8 bytes each), then the
	// window's IPC handle. The message's manifest follows it.
	WindowNoticeHead = 40 + IPCHandleSize
)

// WindowNotice is the fixed part of a window notice.
type WindowNotice struct {
	Generation uint64 // 1 for the sender's first window, one more for each larger one
	Window     uint64 // the window's size in bytes
	Offset     uint64 // where the message starts in the window
	Size       uint64 // the message's length, as announced
	Handle     [IPCHandleSize]byte
}

// Encode writes n into the first WindowNoticeHead bytes of dst; the
// manifest goes after them.
func (n *WindowNotice) Encode(dst []byte) {
	le := binary.LittleEndian
	le.PutUint64(dst[0:], windowMagic)
	le.PutUint64(dst[8:], n.Generation)
	le.PutUint64(dst[16:], n.Window)
	le.PutUint64(dst[24:], n.Offset)
	le.PutUint64(dst[32:], n.Size)
	copy(dst[40:WindowNoticeHead], n.Handle[:])
}

// DecodeWindowNotice checks a window notice from src, as MPI delivered it,
// against the length src announced for the message, in the order of rule
// 10's checks that need no window: its length (at least the head and a
// manifest header, and exactly the head and the whole manifest, which must
// fit the message), the magic, the message's length, and the message's
// place inside the window. It returns the fixed part and the manifest,
// which the receiver then checks as a message's. An abort notice in place
// of the notice is the caller's to recognise first. Its errors are *Errors
// naming src and the field.
func DecodeWindowNotice(b []byte, src, tag int, announced int64) (WindowNotice, []byte, error) {
	var n WindowNotice
	if len(b) < WindowNoticeHead+HeaderSize {
		return n, nil, Errorf(ErrSizeMismatch, src, tag, "message_size", "a node-local notice of %d bytes: at least %d expected", len(b), WindowNoticeHead+HeaderSize)
	}
	man := b[WindowNoticeHead:]
	if p, _ := ManifestSize(man); announced < 0 || p > uint64(announced) || p != uint64(len(man)) {
		return n, nil, Errorf(ErrSizeMismatch, src, tag, "message_size", "the node-local notice has %d bytes, its manifest says %d", len(b), WindowNoticeHead+p)
	}
	le := binary.LittleEndian
	if m := le.Uint64(b); m != windowMagic {
		return n, nil, Errorf(ErrMalformed, src, tag, "ipc_magic", "%#016x is not a node-local notice", m)
	}
	n.Generation, n.Window, n.Offset, n.Size = le.Uint64(b[8:]), le.Uint64(b[16:]), le.Uint64(b[24:]), le.Uint64(b[32:])
	copy(n.Handle[:], b[40:WindowNoticeHead])
	switch {
	case n.Size != uint64(announced):
		return n, nil, Errorf(ErrSizeMismatch, src, tag, "message_size", "the notice places a %d-byte message, %d were announced", n.Size, announced)
	case n.Offset > n.Window || n.Size > n.Window-n.Offset:
		return n, nil, Errorf(ErrMalformed, src, tag, "ipc_offset", "bytes [%d, +%d) lie outside the %d-byte window", n.Offset, n.Size, n.Window)
	}
	return n, man, nil
}
