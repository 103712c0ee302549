// Package wire encodes and decodes every byte msg sends: the manifest
// (header and one entry per block) that precedes a payload, the abort
// notice a sender sends in place of a message it cannot deliver, the
// window notice that tells a node-local peer where in the sender's CUDA
// IPC window a message lies, the read notice that tells it where to read
// a message, and the row of the node-local setup. docs/WIRE.md documents
// them byte for byte, for peers written in other languages; testdata holds
// a reference of each (golden-v1.bin, window-notice-v1.bin,
// setup-rows-v1.bin), and the tests check the doc's dumps against them.
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
