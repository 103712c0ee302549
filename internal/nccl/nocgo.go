//go:build !cgo

package nccl

import "fmt"

// Lib is a loaded libnccl (never, without cgo).
type Lib struct{}

// Comm is an NCCL communicator (never, without cgo).
type Comm struct{}

// Transfer is one buffer of a SendRecv.
type Transfer struct {
	Addr  uintptr
	Bytes int64
	Peer  int
}

// UniqueIDBytes is the size of the bootstrap identifier.
const UniqueIDBytes = 128

// Load always fails without cgo.
func Load() (*Lib, error) { return nil, fmt.Errorf("%w: built without cgo", ErrUnavailable) }

func (l *Lib) Version() (int, error)                              { return 0, ErrUnavailable }
func (l *Lib) Library() string                                    { return "" }
func (l *Lib) UniqueID() ([]byte, error)                          { return nil, ErrUnavailable }
func (l *Lib) NewComm(id []byte, n, rank, dev int) (*Comm, error) { return nil, ErrUnavailable }
func (c *Comm) SendRecv(uintptr, []Transfer, []Transfer) error    { return ErrUnavailable }
func (c *Comm) Close() error                                      { return ErrUnavailable }
