// Package cluster is the MPI layer every rank uses: initialisation, the
// world and derived communicators (with their node-local parts), the
// mapping of local ranks to GPUs, the few collectives a solver needs
// (Bcast, Allgather, Allreduce, Alltoall, Barrier) and their bounded forms
// that fail instead of waiting for ever, ending the job (Abort),
// and the nonblocking point-to-point messages package msg sends its
// exchanges with. It is a thin cgo binding over MPI's C API and imports
// from this module only the root package's sentinel errors.
//
// # Builds
//
// With the build tag mpi the package calls MPI, with flags from
// `pkg-config mpi` (Open MPI's module name on Debian and Ubuntu). The tags
// "mpi mpich" use `pkg-config mpich` instead, and "mpi mpi_manual" use only
// CGO_CFLAGS and CGO_LDFLAGS. Without the tag the package needs no MPI: the
// world is this process alone (rank 0 of 1), where sends to self are
// matched with receives in process, probes and collectives work, and a send
// completes once its receive is posted (as MPI_Ssend would), so code that
// relies on MPI buffering small messages fails at once instead of later.
// Both builds have the same API and share one test suite.
//
// # Lifetimes and ownership
//
// Init may be called once, from any goroutine: MPI is initialised on a
// dedicated OS thread locked for the life of the process, which also calls
// MPI_Finalize, as MPI requires. Every call before Init returns
// ErrNotInitialized and every call after Finalize an error matching
// distbuf.ErrClosed; nothing crashes. Finalize refuses (an error matching
// distbuf.ErrConflict) while a request has not been completed.
// Communicators from Dup and Split are the caller's to Free; World and
// local parts are not. Every communicator, local parts included, has a
// control duplicate that only the bounded collectives use, made with it
// and freed with it.
//
// Point-to-point calls take Memory: a region that MPI may hold after the
// call returns, so C-owned, mmap'd, CUDA or pinned memory, never an
// ordinary Go slice (the cgo pointer rules). *devalloc.Buffer implements it;
// PinBytes pins a Go slice with runtime.Pinner. The region must stay valid
// until the request completes. Attach a devalloc Hold (Read for a send,
// Write for a receive) to the request so the buffer is neither freed nor
// reused before then; the call that observes completion (Wait, Waitall,
// Await) releases it. A request that is dropped while pending stays
// reachable from an internal list, with its memory, so a forgotten request
// leaks rather than letting the garbage collector reclaim memory MPI still
// writes. Device memory is refused unless CUDAAware reports true.
//
// A receiver that does not trust a sender's length matches the message first
// (Await with a Probe: MPI_Improbe), reads its length from Message.Status, and
// then receives it whole into memory that holds it (Message.Recv, MPI_Imrecv,
// which refuses smaller memory) or drops it (Message.Discard, into C scratch
// memory the request frees). It never posts a receive smaller than the
// message: Open MPI 4.1 writes a message longer than the posted receive past
// the receive buffer when the message is above its eager limit, instead of
// truncating it. A matched message must be received or discarded; Finalize
// refuses while one is not.
//
// Await waits for the completion of requests and, at once, for a matched
// message, up to a deadline; it tests and probes in short C slices instead
// of blocking inside MPI, so that the deadline holds. A timeout of zero
// tests once; a negative one waits without limit.
//
// Collectives take Go slices (of bytes, int64 or float64, as each allows; they
// are generic functions because Go methods cannot have type parameters): they
// block, and MPI does not keep the slices past the call (in the funnelled
// design they are pinned while the nonblocking collective that carries them is
// in flight).
//
// # Bounded collectives
//
// BarrierWithin, BcastWithin, AllgatherWithin, AllreduceWithin and
// AlltoallWithin do what their plain counterparts do, but a rank that
// does not arrive cannot hold them for ever: when the timeout passes they
// return a *TimeoutError, matching ErrTimeout, that names the operation
// and the ranks not heard from. A timeout of zero or less waits without
// limit. Whatever the timeout, they run the same protocol, so ranks with
// different timeouts, or none, still meet; but a bounded collective meets
// only the same bounded collective on the other ranks, never a plain one
// (MPI's own), so every rank calls the same function at the same point.
//
// They are built from point-to-point messages, not from MPI's nonblocking
// collectives, because a pending MPI_Ialltoall cannot say which ranks have
// not arrived, and arrival notices sent beside it would not name a rank
// that stopped inside it after sending its notice. Here every rank, on
// entering, sends its part at once to each rank that needs it (Barrier: an
// empty part to every other rank; Bcast: the root to every other rank;
// Allgather and Allreduce: its input to every other rank; Alltoall: in[j]
// to rank j), then waits in Await's polling slices (on the funnel thread
// in the funnelled design) for each part it needs. A rank's part is its
// arrival, so at the deadline the parts missing name exactly the ranks not
// heard from; a rank that stops after sending its part holds up nobody in
// that collective and is named by the next. The parts go through scratch
// memory of the package's, so MPI never holds the caller's slices past
// the call. The cost is a message per peer where MPI takes about log2 of
// the ranks' rounds: a few microseconds at 2 ranks against under one for
// MPI's own (cluster/internal/mpibench, BenchmarkCollective), which suits
// the control path (counts, agreements, barriers between phases), not
// bulk data; AllreduceWithin gathers every rank's input and combines them
// in rank order, so every rank gets the same bits, float sums included.
//
// The wire, for a peer in another language: the control duplicate C' of a
// communicator C is MPI_Comm_dup(C), made right after C (for World at
// Init: MPI_Comm_dup(MPI_COMM_WORLD), then the local part L =
// MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank), then
// MPI_Comm_dup(L); Dup and Split do the same with their new communicator).
// The k-th bounded collective on C (k = 1, 2, ...) sends on C' with tag k
// mod (MPI_TAG_UB+1) messages of a 16-byte header, then the part: k as a
// little-endian uint64, the operation as a little-endian uint32 (1
// Barrier, 2 Bcast, 3 Allgather, 4 Allreduce, 5 Alltoall), its argument as
// a little-endian uint32 (Bcast: the root; Allreduce: the operator (0 sum,
// 1 min, 2 max) times 256 plus the type (1 int64, 2 float64); else 0).
// Values travel in the sender's byte order, as MPI moves bytes between
// ranks of one machine type. A receiver matches each part with a matched
// probe (any source, the tag) and checks its length and header: a part of
// another length, operation or argument fails the collective on that rank
// with an error matching distbuf.ErrInvalid ("the ranks called different
// collectives", "every rank must pass the same length"), where an MPI
// collective would hang or mix the data. A Bcast whose ranks name
// different roots is found only by the ranks that receive.
//
// After a timeout the caller ends the job: print the error, which names
// the ranks, and Abort. Nothing of the collective is left inside MPI but
// this rank's sends to, and receives from, the ranks not heard from; the
// communicator stays usable. Later bounded collectives on it complete
// those requests when MPI does and drop the late parts of the failed one,
// so a rank that was only slow can finish its own part. Until one of them
// completes on that communicator (every rank heard from), Finalize
// refuses with an error matching ErrTimeout instead of calling
// MPI_Finalize, which would wait for the stopped rank for ever; Abort is
// unaffected (mpirun resumes and kills a stopped rank too). A job whose
// ranks may stop ends with FinalizeWithin, a bounded barrier on World
// before MPI_Finalize, so that a rank stopped after the last collective
// is named there rather than holding the others in MPI_Finalize. A tag
// repeats after MPI_TAG_UB+1 collectives (2^31 with Open MPI); a late part
// that meets a later collective of the same tag is dropped by its number.
//
// Messages of more than 2^31-1 bytes go as one element of a derived
// datatype (blocks of 2^30 bytes and a tail), so sizes up to 2^61 bytes
// are one message and a receive may be larger than the message.
//
// # Threads
//
// Goroutines move between OS threads, so MPI must accept calls from any
// thread. Init asks for MPI_THREAD_MULTIPLE and every goroutine then calls
// MPI directly: one cgo call per operation, each a whole MPI operation
// (posting a request builds its datatype, posts and frees the type in one
// call). The alternative, MPI_THREAD_FUNNELED with every call handed to
// the init thread, costs two thread switches per call; measured on the
// 2-core CI machine with 2 ranks (cluster/internal/mpibench), funnelling
// made the 8-byte one-way latency 22-29 µs instead of 1.0-1.4 µs and the
// 8-byte message rate 72-90 thousand instead of 1.4-1.65 million messages
// a second (docs/MPI.md has the table). The funnel is kept as the fallback
// when MPI provides less than MPI_THREAD_MULTIPLE (or when
// DISTBUF_MPI_THREAD=funneled asks for it); there the thread never blocks
// in MPI, polling waits between the calls it is handed so one goroutine's
// Wait cannot stall another's Isend.
//
// Waits in the multiple design poll (MPI_Test in slices of 10 µs, yielding
// to other goroutines between slices) for up to 1 ms before blocking in
// MPI_Wait, except for messages of 256 KiB or more, which block at once. A
// cgo call that lasts more than about 20 µs loses its P to the runtime's
// sysmon, and with GOMAXPROCS=1, which a rank bound to one core gets, the
// runtime then competes for that core with the MPI progress being waited
// for; large transfers run inside one long MPI call anyway, where returning
// to Go between polls only adds a thread switch. See docs/MPI.md for the
// figures.
//
// # Errors
//
// Errors say "cluster: <problem>" and match, with errors.Is, one of the
// module's shared sentinels (github.com/distbuf/distbuf: ErrInvalid for a
// bad rank, tag, argument or size, ErrClosed for a freed communicator or
// any call after Finalize, ErrUnavailable for no GPU or device memory
// without a CUDA-aware MPI, ErrBadConfig for a malformed environment
// variable, and the others errors.go lists) or one of this package's
// three: ErrNotInitialized, ErrMPI for an error code from MPI itself, and
// ErrTimeout for a bounded collective that timed out (*TimeoutError). MPI
// runs with MPI_ERRORS_RETURN; its codes become *MPIError, which carries
// MPI_Error_string and the portable class (MPI_ERR_TRUNCATE, ...) and
// matches ErrMPI, and distbuf.ErrInvalid for a truncated receive, a bad
// rank or a bad tag. Ranks and tags are checked before MPI sees them.
//
// An error that one rank has and its peers cannot learn from a collective
// they are in ends the job: print it, naming the rank, and call Abort
// (MPI_Abort on MPI_COMM_WORLD), which ends every rank at once, instead of
// returning to a Finalize that would wait for ranks that wait for this one.
//
// # Environment
//
// Read on every call that needs them; a malformed value is an error
// matching distbuf.ErrBadConfig that names the variable and its value.
//
//   - DISTBUF_MPI_THREAD: auto (default), multiple or funneled: the
//     threading design Init uses when Options.Thread is ThreadAuto.
//   - DISTBUF_MPI_CUDA_AWARE: 0 or 1 overrides the library's query
//     (CUDAAware); 1 is an error in the build without MPI.
//   - DISTBUF_GPU_MAP ("0,1,1,0": one GPU ordinal per local rank, covering
//     this rank) or DISTBUF_DEVICE (one ordinal for every rank of the node)
//     override Comm.Device's round-robin placement; setting both is an
//     error, as is an ordinal outside the visible GPUs.
package cluster
