package msg

import "github.com/distbuf/distbuf/packing"

// transport moves the messages of an exchanger's exchanges. Exchange
// begins an exchange (its epoch and state) and hands it to the transport,
// which runs it to the Received it returns: MPI (mpiTransport, mpi.go),
// with node-local routes between ranks of one node where they apply, or
// NCCL (ncclTransport, nccl.go). Both describe each message from the
// layout cache (layouts.go), schedule them in the same ring order, and end
// with the same agreement.
type transport interface {
	exchange(e *exchange, send []*packing.Coalesced) (*Received, error)
	// describe is what Exchanger.Transport reports: how device memory
	// travels, and why TransportNCCL was not honoured when it was not.
	describe() (how, why string)
	// close lets go of what the transport holds; Exchanger.Close calls it
	// first.
	close() error
}
