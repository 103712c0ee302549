// Package msg moves coalesced buffers between ranks: each exchange sends one
// MPI message per peer (a manifest followed by the payload), and each
// received message becomes a pooled buffer whose views are the blocks, with
// no copy after the receive.
//
// # Wire format and protocol
//
// docs/WIRE.md describes the message byte for byte (EncodeManifest,
// DecodeManifest and VerifyPayload are its reference implementation) and
// the exchange protocol: the count exchange, tags and epochs, abort
// notices, and the cutting of messages above the chunk size into several
// MPI messages. Errors about a message are *WireError values naming the
// peer, the tag and the field, matching ErrMalformed, ErrChecksum,
// ErrSizeMismatch, ErrUnexpectedPeer, ErrPatternMismatch or ErrPeerAborted.
//
// # Sending
//
// AllocSend allocates one buffer per destination group of a packing plan,
// with room for the manifest before the blocks (packing.AllocPrefixed).
// Exchange writes the manifest there and sends the region from the
// manifest to the end of the blocks as the message: the buffer that holds
// the blocks is the message. On host-accessible memory the manifest is
// written from the calling goroutine under a write hold (after the work the
// buffer's ledger says comes first); a buffer sent again with the layout
// its prefix already holds gets a new header only, checksummed from the
// known CRC of its entries, so bytes changed in the prefix meanwhile fail
// the receiver's check rather than pass. On device memory the manifest is
// encoded in pinned memory and copied in front of the blocks on the
// exchanger's send stream. Receives are posted before the sends are
// prepared. Device memory goes to MPI directly when cluster.CUDAAware
// reports true (and Options.Transport allows); otherwise it is staged: each
// chunk is copied to its own pinned buffer by the send stream, and sent as
// soon as that copy has completed, so the copy of chunk i+1 overlaps the
// send of chunk i. With the payload checksum on, the manifest needs the
// whole payload first, so staging then finishes every copy before the first
// send.
//
// With TransportNCCL (DISTBUF_MSG_TRANSPORT=nccl) and every rank on a GPU
// of its own, messages go GPU to GPU through NCCL instead: the same bytes,
// all of an exchange's sends and receives in one NCCL group on the send
// stream, with the send buffers under read holds and the receive buffers
// under write holds until the stream has passed the group. NCCL cannot
// cancel a posted receive, so sends are prepared before the count exchange
// (a failing rank announces -1), learned patterns still exchange counts,
// and a receiver that cannot allocate drains the message into a scratch
// buffer of 64 MiB kept by the exchanger (docs/WIRE.md, rule 5). New
// decides collectively; Exchanger.Transport reports the outcome and why.
//
// # Receiving
//
// Sizes come from one Alltoall of int64s (or from a learned Pattern). Each
// source gets one pooled buffer of the announced size from the allocator
// (device memory on the CUDA backend), taken before anything is posted.
// Receives go straight into it for host memory and CUDA-aware MPI; staged
// receives land in pinned chunks, each copied into the device buffer on the
// receive stream as it arrives (overlapping the receive of the next). The
// manifest is then decoded and checked (read back from the device first
// when the buffer is device memory; decoded from the pinned chunks when
// staged), the payload checksum verified when present, and
// packing.FromManifest plus packing.WrapAt turn the buffer into a
// Coalesced whose views start after the manifest. A message whose entries
// are byte for byte those of the last message from its source (a sweep
// repeating its layout) reuses that message's plan instead of decoding the
// entries again, and its manifest checksum is checked by hashing the header
// only, combined with the known CRC of the entries once they compare equal;
// a learned Pattern does the same with the layouts it learned, and a
// different layout is then an error. The exchanger keeps, per source, the
// last layout's entries, their CRC and its plan for this.
//
// # Scheduling
//
// Receives are posted in the order of steps (step k: from rank-k), sends
// likewise (step k: to rank+k), each chunk after the previous one of its
// message, with at most Options.Window requests of each direction
// outstanding; the incomplete request of lowest step and chunk over all
// ranks is always posted on both sides, so the windows cannot deadlock.
// A rank waits inside MPI for whichever of its requests completes next
// (polling only while a staged send waits for its copy), and handles each
// message as it completes. Ranks with nothing to send each other exchange
// no message at all. A rank's message to itself is one stream-ordered copy
// into a fresh pooled buffer, without MPI, made once the first MPI
// requests are posted (it needs no peer, and the peers need those
// requests): the sender keeps its buffer (persistent exchanges refill it
// every sweep), so handing it over is not an option, and on device memory
// the copy stays on the device where MPI would stage it twice.
// Options.SelfViaMPI sends it through MPI instead.
//
// # Ownership and lifetimes
//
// The caller owns its send buffers. During Exchange each one is written
// (its manifest) and then read by MPI: it is a reader, through a devalloc
// read hold attached to its requests, until the last of them completes, so
// a Free during that time is deferred (Stats().PendingFrees) and a write
// declared on a stream waits. Exchange returns only once every request has
// completed; the buffers are then the caller's again, to refill or free.
// Staged sends read the device buffer by stream copies declared in its
// ledger instead.
//
// A receive buffer is a writer, through a write hold attached to its
// requests, until they complete; work declared on it waits. Exchange
// returns the received buffers as a Received: they belong to the caller,
// who frees them (Received.Free, or each Coalesced's Free) after the last
// use of their views, declared on the Coalesced as for any other. A staged
// receive buffer's last writer is the copy into it on the exchanger's
// receive stream, ordered before any access declared on the buffer. Pinned
// staging chunks belong to the exchange and go back to devalloc's pinned
// pool as soon as their copy or send has completed.
//
// The Exchanger owns two streams of the allocator (send-side and
// receive-side copies), destroyed by Close; received buffers stay valid
// after Close. A Pattern holds the plans of the layouts it learned; they
// are shared, read-only, by the buffers received through it.
//
// # Failures
//
// An exchange never leaves a peer waiting for a message this rank
// announced or expects: a rank that fails before the count exchange
// announces -1 (its peers skip it), a sender that fails afterwards sends an
// abort notice in place of the message, and a receiver that cannot
// allocate from the pool receives the message into Go memory and drops it. The
// failing rank reports its own error, the others ErrPeerAborted naming it.
// On error Exchange returns no buffers and frees those it received.
//
// # Concurrency
//
// Exchanges are collective: every rank of the communicator calls
// Exchange (or Pattern.Exchange) the same number of times in the same
// order. An Exchanger runs one exchange at a time; exchangers on one
// communicator need distinct tags.
package msg
