package devalloc

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// markRefs reports the entries on the current mark and the recorded marks
// still kept.
func (s *Stream) markRefs() (current, recorded int) {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	return s.curRefs, len(s.recorded)
}

// flakyBackend is the null backend whose streams fail to record while
// failRecords is set.
type flakyBackend struct {
	nullBackend
	failRecords atomic.Bool
}

type flakyStream struct {
	nullStream
	be *flakyBackend
}

var errRecord = errors.New("record refused")

func (b *flakyBackend) newStream() (streamImpl, error) { return flakyStream{be: b}, nil }

func (s flakyStream) record() (eventImpl, error) {
	if s.be.failRecords.Load() {
		return nil, errRecord
	}
	return nullEvent{}, nil
}

// TestMarkRecordFailure: a mark whose record fails stays the current mark,
// with its entries still counted, beside those taken after; the next record
// covers them all, and the event goes once the last of them is dropped.
func TestMarkRecordFailure(t *testing.T) {
	be := &flakyBackend{}
	a := openOn(t, be)
	s1 := a.DefaultStream()
	s2, err := a.NewStream()
	require.NoError(t, err)

	x, err := a.Alloc(256, s1)
	require.NoError(t, err)
	be.failRecords.Store(true)
	_, err = x.Read(s2) // must wait for x's allocation: records s1's mark
	require.ErrorIs(t, err, errRecord)
	n, rec := s1.markRefs()
	require.Equal(t, 1, n, "x's writer is still on the current mark")
	require.Zero(t, rec)

	y, err := a.Alloc(256, s1) // on the epoch after the failed record
	require.NoError(t, err)
	require.NotEqual(t, x.writer.epoch, y.writer.epoch)
	require.NoError(t, s1.Memset(x, 0, 256, 1))
	n, _ = s1.markRefs()
	require.Equal(t, 2, n)

	be.failRecords.Store(false)
	events := a.Stats().LedgerEvents
	r, err := y.Read(s2)
	require.NoError(t, err)
	require.NoError(t, r.Done())
	require.Equal(t, events+2, a.Stats().LedgerEvents, "one mark record and the read's completion")
	n, rec = s1.markRefs()
	require.Zero(t, n)
	require.Equal(t, 1, rec, "x and y share the one recorded mark")
	r, err = x.Read(s2) // waits on the same event: no new record
	require.NoError(t, err)
	require.NoError(t, r.Done())
	require.Equal(t, events+3, a.Stats().LedgerEvents)

	require.NoError(t, x.Free())
	_, rec = s1.markRefs()
	require.Equal(t, 1, rec)
	require.NoError(t, y.Free())
	n, rec = s1.markRefs()
	require.Zero(t, n)
	require.Zero(t, rec, "the event went with the last entry on it")
	require.NoError(t, a.Close())
}
