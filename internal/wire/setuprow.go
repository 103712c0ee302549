package wire

import (
	"encoding/binary"
	"fmt"
)

// A setup row (docs/WIRE.md, "The node-local setup row") is one rank's part of the
// node-local setup: an Allgather of SetupRowWords int64s over the node's
// ranks, in which each rank says whether it moves device messages through
// CUDA IPC windows, or host messages by reads of its memory, and what its
// peers need for that.
const (
	// SetupRowWords is the length of a setup row in int64 words.
	SetupRowWords = 2 + 2*IPCEventHandleSize/8
	// IPCEventHandleSize is the length of a cudaIpcEventHandle_t.
	IPCEventHandleSize = 64

	// SetupWindows is the flags bit of a rank that takes part in windows.
	SetupWindows = 1
	// SetupReads is the flags bit of a rank that offers reads of its memory.
	SetupReads = 2
)

// SetupRow is one rank's setup row. A rank sets at most one of the two
// bits; the fields of the other stay zero.
type SetupRow struct {
	Rank  int    // the rank in the exchanger's communicator
	Flags uint64 // SetupWindows, SetupReads, or 0
	// With SetupWindows: the IPC handles of the rank's ready and consumed
	// events.
	Ready, Consumed [IPCEventHandleSize]byte
	// With SetupReads: the rank's process id, and the address and value of
	// its probe word.
	PID        int64
	ProbeAddr  uint64
	ProbeValue uint64
}

// Encode writes r into dst, SetupRowWords words.
func (r *SetupRow) Encode(dst []int64) {
	clear(dst[:SetupRowWords])
	dst[0], dst[1] = int64(r.Rank), int64(r.Flags)
	switch {
	case r.Flags&SetupWindows != 0:
		for i, h := range [][]byte{r.Ready[:], r.Consumed[:]} {
			for w := range IPCEventHandleSize / 8 {
				dst[2+8*i+w] = int64(binary.LittleEndian.Uint64(h[8*w:]))
			}
		}
	case r.Flags&SetupReads != 0:
		dst[2], dst[3], dst[4] = r.PID, int64(r.ProbeAddr), int64(r.ProbeValue)
	}
}

// DecodeSetupRow reads the row of a rank of a communicator of size ranks.
// A rank outside it, unknown flag bits, both bits at once, an offer of
// reads without a process or a probe, or a word the row's flags leave
// unused that is not zero breaks the format: ErrMalformed.
func DecodeSetupRow(src []int64, size int) (SetupRow, error) {
	var r SetupRow
	if len(src) < SetupRowWords {
		return r, fmt.Errorf("msg: node-local setup: a row of %d words, %d expected: %w", len(src), SetupRowWords, ErrMalformed)
	}
	r.Rank, r.Flags = int(src[0]), uint64(src[1])
	switch {
	case src[0] < 0 || src[0] >= int64(size):
		return r, fmt.Errorf("msg: node-local setup: a row names rank %d of %d: %w", src[0], size, ErrMalformed)
	case r.Flags&^(SetupWindows|SetupReads) != 0 || r.Flags == SetupWindows|SetupReads:
		return r, fmt.Errorf("msg: node-local setup: rank %d's row has flags %#x: %w", r.Rank, r.Flags, ErrMalformed)
	case r.Flags == SetupWindows:
		for i, h := range [][]byte{r.Ready[:], r.Consumed[:]} {
			for w := range IPCEventHandleSize / 8 {
				binary.LittleEndian.PutUint64(h[8*w:], uint64(src[2+8*i+w]))
			}
		}
	case r.Flags == SetupReads:
		r.PID, r.ProbeAddr, r.ProbeValue = src[2], uint64(src[3]), uint64(src[4])
		if r.PID <= 0 || r.ProbeAddr == 0 || r.ProbeValue == 0 {
			return r, fmt.Errorf("msg: node-local setup: rank %d offers reads of process %d at %#x: %w", r.Rank, r.PID, r.ProbeAddr, ErrMalformed)
		}
	}
	used := 2
	switch r.Flags {
	case SetupWindows:
		used = SetupRowWords
	case SetupReads:
		used = 5
	}
	for w := used; w < SetupRowWords; w++ {
		if src[w] != 0 {
			return r, fmt.Errorf("msg: node-local setup: rank %d's row has %#x in word %d, which its flags leave unused: %w", r.Rank, src[w], w, ErrMalformed)
		}
	}
	return r, nil
}

// DecodeSetupRows reads the rows the node-local Allgather left in words:
// row i is the row of the process at position i, whose rank in the
// exchanger's communicator (of size ranks) is ranks[i], as the receiver's
// MPI says (the Allgather puts each row at its sender's place, which a
// sender cannot choose). Besides each row's own format (DecodeSetupRow),
// a row whose rank field is not its sender's rank, and two rows that
// name one process or one event, break the format: ErrMalformed, naming
// the sender. Every rank of the node finds the same rows, so all reach
// the same verdict.
func DecodeSetupRows(words []int64, ranks []int, size int) ([]SetupRow, error) {
	if len(words) != len(ranks)*SetupRowWords {
		return nil, fmt.Errorf("msg: node-local setup: %d words for %d rows of %d: %w", len(words), len(ranks), SetupRowWords, ErrMalformed)
	}
	rows := make([]SetupRow, len(ranks))
	pids := make(map[int64]int, len(ranks))
	events := make(map[[IPCEventHandleSize]byte]int, 2*len(ranks))
	for i, sender := range ranks {
		r, err := DecodeSetupRow(words[i*SetupRowWords:(i+1)*SetupRowWords], size)
		if err != nil {
			return nil, fmt.Errorf("%w (the row sent by rank %d, at position %d)", err, sender, i)
		}
		if r.Rank != sender {
			return nil, fmt.Errorf("msg: node-local setup: the row of rank %d (position %d) says it is rank %d's: %w", sender, i, r.Rank, ErrMalformed)
		}
		switch r.Flags {
		case SetupReads:
			if other, ok := pids[r.PID]; ok {
				return nil, fmt.Errorf("msg: node-local setup: the rows of ranks %d and %d both offer reads of process %d: %w", other, sender, r.PID, ErrMalformed)
			}
			pids[r.PID] = sender
		case SetupWindows:
			for _, h := range [][IPCEventHandleSize]byte{r.Ready, r.Consumed} {
				if other, ok := events[h]; ok {
					return nil, fmt.Errorf("msg: node-local setup: the rows of ranks %d and %d name one interprocess event: %w", other, sender, ErrMalformed)
				}
				events[h] = sender
			}
		}
		rows[i] = r
	}
	return rows, nil
}
