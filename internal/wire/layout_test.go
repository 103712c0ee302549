package wire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/distbuf/distbuf/packing"
)

// TestLayoutSealsAsEncodeManifest: a layout encoded once writes the bytes
// EncodeManifest writes, and resealing only its header for another
// exchange gives the bytes of a full encode of that exchange.
func TestLayoutSealsAsEncodeManifest(t *testing.T) {
	golden := goldenMessage(t)
	m, err := DecodeManifest(golden, 1, 9)
	require.NoError(t, err)
	l, err := NewLayout(m.DType, m.PayloadLen, m.Entries)
	require.NoError(t, err)
	require.Equal(t, 3, l.Count())
	require.Equal(t, m.PayloadOffset, l.PayloadOffset())

	got := make([]byte, l.PayloadOffset())
	for i := range got {
		got[i] = 0xEE // padding must come out zero
	}
	l.Encode(got, m.Header)
	require.Equal(t, golden[:m.PayloadOffset], got)

	next := m.Header
	next.Epoch, next.Tag = 4, 11
	want := make([]byte, l.PayloadOffset())
	require.NoError(t, EncodeManifest(want, next, m.Entries))
	l.Seal(got, next)
	require.Equal(t, want, got, "a header-only seal")
}

// TestDecodeHeaderWithKnownLayout: a known layout is recognised only when
// the entries are byte-equal, and its CRC then stands in for hashing them;
// a corrupted checksum still fails.
func TestDecodeHeaderWithKnownLayout(t *testing.T) {
	golden := goldenMessage(t)
	h, matched, err := DecodeHeader(golden, uint64(len(golden)), 1, 9, nil)
	require.NoError(t, err)
	require.False(t, matched)
	known := ReceivedLayout(h, golden)

	_, matched, err = DecodeHeader(golden, uint64(len(golden)), 1, 9, known)
	require.NoError(t, err)
	require.True(t, matched)

	bad := bytes.Clone(golden)
	bad[61] ^= 1
	_, _, err = DecodeHeader(bad, uint64(len(bad)), 1, 9, known)
	require.ErrorIs(t, err, ErrChecksum)

	other := bytes.Clone(golden)
	other[64+32] = 43 // block id 42 becomes 43
	other[60], other[61], other[62], other[63] = 0, 0, 0, 0
	_, _, err = DecodeHeader(other, uint64(len(other)), 1, 9, nil)
	require.ErrorIs(t, err, ErrChecksum, "edited without a reseal")
	sealHeader(other, h, other[HeaderSize:HeaderSize+3*EntrySize])
	_, matched, err = DecodeHeader(other, uint64(len(other)), 1, 9, known)
	require.NoError(t, err)
	require.False(t, matched, "other entries than the known layout's")
	require.False(t, known.SameEntries(ReceivedLayout(h, other)))
	require.True(t, known.SameEntries(ReceivedLayout(h, golden)))
}

// TestEncodeRejectsFieldsOutOfRange: packing.Entry's signed fields that
// the format's unsigned ones cannot carry are refused by name.
func TestEncodeRejectsFieldsOutOfRange(t *testing.T) {
	buf := make([]byte, 1024)
	h := Header{DType: packing.Float64, PayloadLen: 1 << 40}
	for _, tc := range []struct {
		field string
		e     packing.Entry
	}{
		{"entry[0].shape", packing.Entry{ID: 1, Rows: -1, Cols: 1, DType: packing.Float64}},
		{"entry[0].shape", packing.Entry{ID: 1, Rows: 1, Cols: 1 << 32, DType: packing.Float64}},
		{"entry[0].offset", packing.Entry{ID: 1, Offset: -8, Rows: 1, Cols: 1, DType: packing.Float64}},
	} {
		err := EncodeManifest(buf, h, []packing.Entry{tc.e})
		require.ErrorIs(t, err, ErrMalformed)
		var we *Error
		require.True(t, errors.As(err, &we))
		require.Equal(t, tc.field, we.Field)
		_, err = NewLayout(h.DType, h.PayloadLen, []packing.Entry{tc.e})
		require.ErrorIs(t, err, ErrMalformed)
	}
}

func TestMalformedKinds(t *testing.T) {
	kind := NewMalformedKind("msg: some kind")
	require.ErrorIs(t, kind, ErrMalformed)
	require.NotErrorIs(t, kind, ErrChecksum)
	require.ErrorIs(t, Errorf(kind, 1, 2, "f", "r"), ErrMalformed)
	require.ErrorIs(t, Errorf(kind, 1, 2, "f", "r"), kind)
	require.NotErrorIs(t, Errorf(ErrMalformed, 1, 2, "f", "r"), ErrChecksum)
	require.ErrorIs(t, Errorf(ErrChecksum, 1, 2, "f", "r"), ErrMalformed)
}
