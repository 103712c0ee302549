// Package ipcwin is the CUDA IPC window machinery of msg's window route:
// between two ranks of one node on GPUs, a message goes from the sender's
// send buffer into a window of the sender's device memory, which the
// receiver opens through CUDA IPC and copies the message out of, device to
// device, while MPI carries only a notice of where it lies.
//
// A Link is one rank's part: its own window (cudaMalloc memory outside any
// allocator's pool and budget, grown by doubling, every generation kept
// until Free since a peer may hold it open), the windows of its peers as it
// opened them, two interprocess events of its own (ready: its copies into
// the window are done; consumed: its copies out of its peers' windows are
// done) and its peers' events as it opened them, the copy batches of an
// exchange, and the pinned buffers its notices travel in, kept per peer
// from one exchange to the next. What it keeps is its own cudaMalloc and
// cudaHostAlloc memory, outside any allocator's ledger: a caller's
// allocator counts none of it among its buffers. It knows nothing of MPI or of messages:
// the caller exchanges the event handles (wire.SetupRow), sends the
// notices (wire.WindowNotice) and orders the steps.
//
// Ordering, all on the device: the sender's copies into its window follow,
// on its stream, the consumed event of every peer that read the window in
// the previous exchange (Reserve); it records ready after them (Ready),
// before its notices go out. The receiver's copy follows the sender's
// ready event on its stream (WaitReady), and it records consumed after its
// copies (Consumed), before the agreement that ends the exchange: an event
// wait takes the last record made before it, so one event of each kind
// serves every exchange.
//
// A Link belongs to one exchanger and is used by one exchange at a time.
package ipcwin
