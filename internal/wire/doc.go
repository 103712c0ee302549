// Package wire encodes and decodes the bytes of msg's messages: the
// manifest (header and one entry per block) that precedes a payload, the
// abort notice a sender sends in place of a message it cannot deliver, and
// the read notice that tells a node-local peer where to read a message.
// docs/WIRE.md documents the format byte for byte, for peers written in
// other languages; testdata/golden-v1.bin is its reference message, and
// the tests check the doc's dump against it.
//
// A manifest's entries are packing.Entry values and its element types
// packing.DType codes, so a decoded manifest feeds packing.FromManifest
// as it is. Every decoding function takes the peer and the MPI tag the
// bytes came with and names them, and the field at fault, in its *Error.
//
// Nothing here keeps state or owns memory beyond what it returns: a
// Layout belongs to its caller, who may keep it across exchanges (msg does,
// per destination and per source) but must not use one from several
// goroutines at once, since Seal and DecodeHeader build its CRC shift on
// first use.
package wire
