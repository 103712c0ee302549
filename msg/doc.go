// Package msg moves coalesced buffers between ranks: each exchange sends one
// MPI message per peer (a manifest followed by the payload), and each
// received message becomes a pooled buffer whose views are the blocks, with
// no copy after the receive.
//
// # Wire format and protocol
//
// docs/WIRE.md describes every byte msg sends (the module's internal/wire
// package is its reference implementation, and its blocks are
// packing.Entry values) and the exchange protocol: the collectives of New
// and the node-local setup, the count exchange and its bounds, receiving
// by matched probe, tags and epochs, abort notices, the cutting of
// messages above the chunk size into several MPI messages, the notices of
// the node-local routes, the agreement that ends every exchange, and the
// timeout. The count exchange and the agreement are the only steps of an
// exchange that wait for every rank; both go through one place
// (collective.go), as cluster's bounded collectives, like every collective
// of New and Close. Errors about a
// message are *WireError values naming the peer, the tag and the field,
// matching ErrMalformed, ErrChecksum, ErrSizeMismatch, ErrUnexpectedPeer,
// ErrPatternMismatch, ErrPeerAborted, ErrTooLarge or ErrTimeout.
//
// # Routes
//
// Every peer has one route, chosen once in New (Exchanger.Routes reports
// them, and why a faster one was not taken), and every message to or from
// that peer takes it:
//
//   - RouteMPI: MPI messages from and into the buffers themselves: host
//     memory, or device memory handed to a CUDA-aware MPI (cluster.CUDAAware,
//     unless TransportStaged).
//   - RouteStaged: device memory without a CUDA-aware MPI travels through
//     pinned host memory, chunk by chunk (below).
//   - RouteWindow: between two ranks of one node that both exchange device
//     memory under TransportAuto, a message travels through CUDA IPC
//     (docs/WIRE.md, rule 9; internal/ipcwin): the sender copies it into a
//     window of its own device memory, which every node-local peer opens
//     (once per window: the window grows by doubling, so that happens a
//     few times at most), and sends an MPI notice carrying the manifest;
//     the receiver checks the notice and the manifest, then copies the
//     message out of the window into its pooled buffer. Two
//     device-to-device copies replace a transfer that MPI's shared memory
//     stages through host memory (docs/PERFORMANCE.md has both rates).
//     Interprocess events order it all on the streams: the sender's copies
//     wait until the readers of its last exchange are done, the receiver's
//     copy waits until the sender's copies are. A rank's copies into its window, for every
//     peer, are one cudaMemcpyBatchAsync, or where the GPU is shared through
//     MPS one launch of the gather kernel (internal/gather); its copies from
//     its peers' windows are one such call per wait of the data phase that
//     delivered notices. The windows are cudaMalloc memory outside the
//     allocator's pool and budget, at least 4 MiB each; every window stays
//     allocated until Close, since a peer may hold it open.
//   - RouteRead: between two ranks of one node that both exchange host
//     memory under TransportAuto, the receiver reads a message straight out
//     of the sender's send buffer with one process_vm_readv (docs/WIRE.md,
//     rule 10; internal/peermem), and MPI carries only a 24-byte notice of
//     where it lies: one copy by the kernel, where MPI's shared memory
//     without a single-copy mechanism (Open MPI's vader with
//     single_copy_mechanism none, as containers often set it) copies a
//     message twice in fragments. The sender keeps the buffer under its read
//     hold until the agreement that ends the exchange, and a receiver reads
//     only before it joins the agreement, so no read outlasts the sender's
//     hold. A send buffer in device memory is first copied to host memory
//     the exchange keeps as long. A rank that offers reads lets every
//     process of its user read its memory (prctl PR_SET_PTRACER_ANY, as Open
//     MPI's CMA transport does); DISTBUF_MSG_TRANSPORT=mpi keeps it from
//     doing so.
//   - RouteNCCL: under TransportNCCL, below.
//   - RouteSelf: a rank's message to itself, one stream copy (below).
//
// The node-local routes are decided collectively over the node, from one
// row per rank of an Allgather (docs/WIRE.md, "Setup"), each checked
// against its sender: two ranks use a window, or reads, when both offer it
// and every rank of the node could use what the others offered (open their
// events, read their probe words), which one Allreduce tells them all; a
// rank with TransportMPI or TransportStaged, or whose runtime or kernel
// refuses (no interprocess functions; Yama's ptrace_scope 2 or more, a
// seccomp filter, another PID namespace), keeps MPI for all its pairs. Inside the package a route is a
// type implementing the route interface (route.go): how many MPI messages
// a message travels as, how it is prepared, where its pieces are received
// and what is done once they are in, and its part in each exchange's steps.
// A new data path is one new file with such a type and, for a route
// between ranks of one node, one line in chooseRoutes (called by New),
// which lists the node-local routes in order of preference:
//
//	candidates := []nodeRoute{
//		newWindowRoute(x, auto),
//		newReadRoute(x, auto),
//	}
//
// # Sending
//
// AllocSend allocates one buffer per destination group of a packing plan,
// with room for the manifest before the blocks (packing.AllocOptions.Prefix).
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
// prepared. On RouteStaged each chunk is copied to its own pinned buffer
// by the send stream, and sent as soon as that copy has completed, so the
// copy of chunk i+1 overlaps the send of chunk i. With the payload checksum
// on, the manifest needs the whole payload first, so staging then finishes
// every copy before the first send.
//
// With TransportNCCL (DISTBUF_MSG_TRANSPORT=nccl) and every rank on a GPU
// of its own, messages go GPU to GPU through NCCL instead: the same bytes,
// all of an exchange's sends and receives in one NCCL group on the send
// stream, with the send buffers under read holds and the receive buffers
// under write holds until the stream has passed the group. NCCL cannot
// cancel a posted receive, so sends are prepared before the count exchange
// (a failing rank announces -1), learned patterns still exchange counts,
// and a receiver that cannot allocate drains the message into a scratch
// buffer of 64 MiB kept by the exchanger (docs/WIRE.md, rule 8). New
// decides collectively; Exchanger.Routes reports the outcome and why.
//
// NCCL cannot probe: a receive names its length beforehand, and a peer
// that sends another length than it announced breaks NCCL's contract (NCCL
// may hang or write the wrong bytes), which no receiver can detect, and no
// deadline can end an NCCL group. What the NCCL path guarantees is that
// every receive buffer is exactly the announced length, bounded before
// anything is allocated (a rank that refuses a length makes every rank
// skip the group, by a vote before it), that every manifest is validated,
// and that a failure anywhere fails the exchange everywhere (the
// agreement). Between distbuf ranks the lengths cannot differ: both ends
// of a transfer take it from the same count exchange.
//
// # Receiving
//
// Sizes come from one Alltoall of int64s (or from a learned Pattern), and
// are checked before anything is sized from them: a length shorter than
// any message, beyond the protocol's limit (2^50 bytes), the allocator's
// budget or the memory is refused (ErrMalformed or ErrTooLarge), and what
// its sender sends is drained. Each accepted source gets one pooled buffer
// of the announced size from the allocator (device memory on the CUDA
// backend), taken before anything is received.
//
// No receive is posted before its message's length is known: the rank
// matches whatever arrives on the exchanger's communicator by matched
// probe (cluster.Await, MPI_Improbe), and receives it only then, with
// MPI_Imrecv, into memory that holds it: the piece its source owes next,
// in place, when it has the announced length (or less, which is then
// rejected); anything longer, a piece of a message that already failed,
// and a stray (a message from a rank that owes this one nothing more) go
// to scratch memory that is dropped (cluster.Message.Discard), and are
// reported. Some MPI libraries, Open MPI 4.1 above its eager limit among
// them, write a message longer than the posted receive past the receive
// buffer rather than truncate it; a receiver that trusted the announced
// length would let a faulty peer write over other live memory. Receives go
// straight into the buffer for host memory and CUDA-aware MPI; staged
// receives land in pinned chunks, each copied into the device buffer on the
// receive stream as it arrives (overlapping the receive of the next); a
// window message's one MPI message is its notice, a read message's too. The
// manifest is then decoded and checked (read back from the device first
// when the buffer is device memory; decoded from the pinned chunks when
// staged), the payload checksum verified when present, and
// packing.FromManifest plus packing.Wrap turn the buffer into a
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
// Sends are posted in the order of steps (step k: to rank+k), each chunk
// after the previous one of its message, with at most Options.Window
// outstanding; receives are posted as their messages are matched, with at
// most Options.Window outstanding. Every outstanding receive is of a
// matched message, which completes as soon as its sender's MPI moves the
// data, so the windows cannot deadlock (the sched type says why). A rank
// tests its requests and probes in turn (cluster.Await: short C slices,
// never blocking inside MPI), and handles each message as it completes.
// Ranks with nothing to send each other exchange no message at all.
//
// A rank's message to itself is one stream-ordered copy of its blocks into
// a fresh pooled buffer, without MPI, made once the first MPI requests are
// posted (it needs no peer, and the peers need those requests). The sender
// keeps its buffer (persistent exchanges refill it every sweep), so handing
// it over is not an option, and on device memory the copy stays on the
// device where MPI would stage it twice. The buffer is allocated and the
// copy made on the allocator's default stream, where a solver's own work
// usually runs: the copy then waits for the work that filled the send
// buffer without an event between streams. Nothing crosses a wire, so no
// manifest is written, checksummed or decoded: the received layout (the
// same a peer would rebuild, blocks in offset order) is made from the send
// buffer's layout, once per layout, and kept while the send buffers keep
// it.
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
// ledger instead. Send buffers may be the parts of one joined buffer
// (JoinSend, packing.Coalesced.Parts), which share its ledger: Exchange
// writes every manifest before any send holds the buffer, and the caller
// frees the joined buffer, not its parts.
//
// A receive buffer is a writer, through a write hold attached to its
// requests, until they complete; work declared on it waits. Exchange
// returns the received buffers as a Received: they belong to the caller,
// who frees them (Received.Free, or each Coalesced's Free) after the last
// use of their views, declared on the Coalesced as for any other. The
// messages that arrive through node-local windows, when there are several,
// share one receive buffer (one allocation an exchange), which each of
// their Coalesced owns with the others (a reference each, given back by
// its Free through packing.Wrap's release): it is freed
// with the last of them. A staged
// receive buffer's last writer is the copy into it on the exchanger's
// receive stream, ordered before any access declared on the buffer. Pinned
// staging chunks belong to the exchange and go back to devalloc's pinned
// pool as soon as their copy or send has completed.
//
// The Exchanger owns its duplicate of the communicator and two streams of
// the allocator (send-side and receive-side copies), freed by Close;
// received buffers stay valid after Close. What it keeps from one exchange
// to the next is its own memory, allocated from the CUDA runtime
// directly, outside the allocator's ledger and budget: the windows, the
// pinned buffers its window notices travel in, the staging slots of
// RouteStaged and NCCL's drain buffer. So the allocator's
// Stats().LiveBuffers counts the caller's buffers only: a phase that frees
// all it allocated reads 0 on every backend and route. What an exchange
// allocates for itself (receive buffers, pinned chunks, manifests'
// scratch) comes from the allocator and is freed, or handed to the caller,
// before Exchange returns. Send buffers may come from another allocator
// than the exchanger's: their staging copies and the copy to self then go
// through that allocator's default stream and pinned memory, since a
// stream copies only between buffers of its own allocator. A Pattern holds
// the plans of the layouts it learned; they are shared, read-only, by the
// buffers received through it.
//
// # Failures
//
// An exchange never leaves a peer waiting for a message this rank
// announced or expects: a rank that fails before the count exchange
// announces -1 (its peers skip it), a sender that fails afterwards sends an
// abort notice in place of the message (a window it cannot allocate
// included), and a receiver that cannot allocate, or refuses the announced
// length, drains the pieces into scratch memory as they come.
//
// Every exchange ends with the agreement, one Alltoall in which each rank
// tells each other how many MPI messages it sent it and whether its part
// failed, on its own or only because another rank's did: each rank then
// drains what it was sent and did not match (so nothing is left for the
// next exchange), and every rank of a failed exchange returns an error.
// Errors say who failed: a rank whose own part failed (its input, its
// memory, a message it rejected) returns its own errors only, none of
// which matches ErrPeerAborted; a rank that failed only because others did
// returns ErrPeerAborted naming them. No rank returns buffers from an
// exchange whose data did not all arrive. On error Exchange returns no
// buffers and frees those it received. Every exchange, failed ones
// included, advances the epoch. A message that no agreement counts (sent
// on the exchanger's communicator outside an exchange, or left by an
// exchange whose agreement failed) fails the exchange that meets it: its
// receiver drains everything that has come from its sender before and
// after the agreement, and the next exchange with that rank works.
//
// No wait is without limit while Options.Timeout (DISTBUF_MSG_TIMEOUT, 120
// s by default) is set. A peer that sends fewer pieces than it announced,
// or takes none of this rank's, cannot hold a data phase: when nothing has
// moved for the timeout the rank gives up what is owed (ErrTimeout). The
// count exchange, the agreement and the collectives of New and Close are
// cluster's bounded collectives: a rank that does not arrive within the
// timeout (the agreement: the timeout and a grace of a second, or the
// grace alone once this rank's data phase timed out) is named in an error
// that matches ErrTimeout and cluster.ErrTimeout. So a rank that stops for
// good anywhere in an exchange ends it on every other rank within the
// timeout and a second of the last progress; one that stops for less than
// the timeout costs nothing. After such a timeout the ranks no longer
// agree on where they are (the stopped rank, once resumed, may even see
// the exchange succeed): end the job (print the error, cluster.Abort). The
// requests an exchange gave up on stay the exchanger's, which completes
// them in a later exchange, or waits for them (up to the timeout) in Close.
//
// # Concurrency
//
// New duplicates Options.Comm: each exchanger's messages, count exchanges
// and agreements travel on a communicator of its own, so exchangers made on
// one communicator, even with the same tag, are independent and may run
// from different goroutines at once, and nothing else sent on the
// caller's communicator is taken for theirs. Exchanges are collective:
// every rank of the communicator calls Exchange (or Pattern.Exchange) on
// its exchanger the same number of times in the same order. An Exchanger
// runs one exchange at a time. New and Close are collective too, and
// bounded by the timeout like the exchanges.
package msg
