// Package peermem reads the memory of another process of this node with
// process_vm_readv: one copy, made by the kernel, without the other
// process taking part. msg's node-local read route uses it to take a host
// message straight out of its sender's send buffer.
//
// The kernel decides each read: the reader and the target run as the same
// user, and under Yama's ptrace_scope 1 the target has allowed it
// (AllowReaders). Unavailable says, before any read, why this process
// cannot try; a Probe is a word of this process's memory that a peer reads
// back (CheckProbe) to prove that its reads reach the right process.
//
// The package owns nothing beyond its Probes: a Probe pins its word until
// Close. Reads copy into memory the caller owns; the source is the other
// process's, which must keep it mapped and unchanged during the read.
package peermem
