package wire

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadNotice(t *testing.T) {
	b := make([]byte, ReadNoticeSize)
	EncodeReadNotice(b, 0x7f0012345000, 4096)
	addr, err := DecodeReadNotice(b, 3, 17, 4096)
	require.NoError(t, err)
	require.EqualValues(t, 0x7f0012345000, addr)
	require.Equal(t, "distrd01", string(b[:8]), "docs/WIRE.md, rule 12")

	for _, tc := range []struct {
		name     string
		edit     func(b []byte) []byte
		sentinel error
		field    string
	}{
		{"short", func(b []byte) []byte { return b[:20] }, ErrSizeMismatch, "message_size"},
		{"long", func(b []byte) []byte { return append(b, 0) }, ErrSizeMismatch, "message_size"},
		{"magic", func(b []byte) []byte { b[7] = 'x'; return b }, ErrMalformed, "read_magic"},
		{"length", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], 4095); return b }, ErrSizeMismatch, "message_size"},
		{"null address", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 0); return b }, ErrMalformed, "read_address"},
		{"address wraps", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], ^uint64(0)-100); return b }, ErrMalformed, "read_address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.edit(append([]byte(nil), b...))
			_, err := DecodeReadNotice(c, 3, 17, 4096)
			requireField(t, err, tc.sentinel, 3, 17, tc.field)
		})
	}
}

func FuzzReadNotice(f *testing.F) {
	b := make([]byte, ReadNoticeSize)
	EncodeReadNotice(b, 0x1000, 256)
	f.Add(b, int64(256))
	f.Add(b[:8], int64(256))
	f.Add(make([]byte, AbortSize), int64(1<<20))
	f.Fuzz(func(t *testing.T, b []byte, announced int64) {
		addr, err := DecodeReadNotice(b, 1, 2, announced)
		if err != nil {
			var w *Error
			if !errors.As(err, &w) || w.Peer != 1 || w.Tag != 2 {
				t.Fatalf("error %v names no peer", err)
			}
			return
		}
		// Anything accepted names a range that does not wrap, and encodes
		// back to the same bytes.
		if addr == 0 || addr+uint64(announced) < addr {
			t.Fatalf("accepted [%#x, +%d)", addr, announced)
		}
		again := make([]byte, ReadNoticeSize)
		EncodeReadNotice(again, addr, announced)
		require.Equal(t, b, again)
	})
}
