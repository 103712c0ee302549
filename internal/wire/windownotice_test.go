package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// goldenWindowNotice is the window notice kept in testdata: the reference
// message (goldenMessage) placed at offset 512 of the sender's second
// window, of 8 MiB, whose handle's byte i is 0x40+i.
func goldenWindowNotice(t testing.TB) []byte {
	msg := goldenMessage(t)
	n := WindowNotice{Generation: 2, Window: 8 << 20, Offset: 512, Size: uint64(len(msg))}
	for i := range n.Handle {
		n.Handle[i] = byte(0x40 + i)
	}
	p := PayloadOffset(3)
	b := make([]byte, WindowNoticeHead+p)
	n.Encode(b)
	copy(b[WindowNoticeHead:], msg[:p])
	return b
}

func TestGoldenWindowNotice(t *testing.T) {
	golden := readGolden(t, "window-notice-v1.bin", goldenWindowNotice(t))
	require.Equal(t, "distipc1", string(golden[:8]), "docs/WIRE.md, rule 10")
	n, man, err := DecodeWindowNotice(golden, 1, 9, 800)
	require.NoError(t, err)
	require.EqualValues(t, 2, n.Generation)
	require.EqualValues(t, 8<<20, n.Window)
	require.EqualValues(t, 512, n.Offset)
	require.EqualValues(t, 800, n.Size)
	require.EqualValues(t, 0x40, n.Handle[0])
	require.EqualValues(t, 0x7f, n.Handle[63])
	require.Equal(t, goldenMessage(t)[:256], man, "the manifest follows the fixed part")
	m, err := DecodeManifest(append(bytes.Clone(man), goldenMessage(t)[256:]...), 1, 9)
	require.NoError(t, err)
	require.EqualValues(t, 3, m.Count)
}

func TestWindowNoticeErrorsNameTheField(t *testing.T) {
	golden := goldenWindowNotice(t)
	for _, tc := range []struct {
		name      string
		edit      func(b []byte) []byte
		announced int64
		sentinel  error
		field     string
	}{
		{"short", func(b []byte) []byte { return b[:WindowNoticeHead+HeaderSize-1] }, 800, ErrSizeMismatch, "message_size"},
		{"manifest cut", func(b []byte) []byte { return b[:len(b)-1] }, 800, ErrSizeMismatch, "message_size"},
		{"manifest longer than the message", func(b []byte) []byte { return b }, 255, ErrSizeMismatch, "message_size"},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, 800, ErrMalformed, "ipc_magic"},
		{"length", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[32:], 801); return b }, 800, ErrSizeMismatch, "message_size"},
		{"offset past the window", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 8<<20-799); return b }, 800, ErrMalformed, "ipc_offset"},
		{"offset wraps", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], ^uint64(0)-100); return b }, 800, ErrMalformed, "ipc_offset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodeWindowNotice(tc.edit(bytes.Clone(golden)), 3, 17, tc.announced)
			requireField(t, err, tc.sentinel, 3, 17, tc.field)
		})
	}
}

func FuzzWindowNotice(f *testing.F) {
	golden := goldenWindowNotice(f)
	f.Add(golden, int64(800))
	f.Add(golden[:WindowNoticeHead], int64(800))
	f.Add(make([]byte, AbortSize), int64(1<<20))
	f.Fuzz(func(t *testing.T, b []byte, announced int64) {
		n, man, err := DecodeWindowNotice(b, 1, 2, announced)
		if err != nil {
			var w *Error
			if !errors.As(err, &w) || w.Peer != 1 || w.Tag != 2 || !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v names no peer or does not match ErrMalformed", err)
			}
			return
		}
		// Anything accepted places the announced length inside the window
		// and encodes back to the same bytes.
		if n.Size != uint64(announced) || n.Offset > n.Window || n.Size > n.Window-n.Offset {
			t.Fatalf("accepted %+v for %d bytes", n, announced)
		}
		again := make([]byte, WindowNoticeHead, len(b))
		n.Encode(again)
		require.Equal(t, b, append(again, man...))
	})
}

// readGolden compares want with testdata/name (rewriting the file under
// -update) and returns the file's bytes.
func readGolden(t *testing.T, name string, want []byte) []byte {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, want, 0o644))
	}
	golden, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, golden, want, "the encoder no longer produces the documented bytes of %s", name)
	return golden
}

// requireField checks that err is an *Error matching sentinel that names
// peer, tag and field.
func requireField(t *testing.T, err error, sentinel error, peer, tag int, field string) {
	t.Helper()
	require.ErrorIs(t, err, sentinel)
	var w *Error
	require.True(t, errors.As(err, &w), "want an *Error, got %v", err)
	require.Equal(t, peer, w.Peer)
	require.Equal(t, tag, w.Tag)
	require.Equal(t, field, w.Field)
}
