// Package msg moves coalesced buffers between ranks: each exchange sends one
// MPI message per peer (a manifest followed by the payload), and each
// received message becomes a pooled buffer whose views are the blocks.
package msg
