package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/distbuf/distbuf/packing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden-v1.bin")

// blockBytes is the length of e's block in the payload.
func blockBytes(e packing.Entry) int64 { return int64(e.Rows) * int64(e.Cols) * e.DType.Size() }

// goldenMessage is the message kept in testdata: two float64 blocks and one
// complex64 block from rank 1 to rank 0.
func goldenMessage(t testing.TB) []byte {
	entries := []packing.Entry{
		{ID: 7, Offset: 0, Rows: 2, Cols: 3, DType: packing.Float64},
		{ID: 42, Offset: 256, Rows: 1, Cols: 1, DType: packing.Float64},
		{ID: 1 << 40, Offset: 512, Rows: 2, Cols: 2, DType: packing.Complex64},
	}
	// Byte i of each block is 7*i mod 256 (i from the payload start); the
	// padding between blocks is zero, as every sender must write it.
	payload := make([]byte, 544)
	for _, e := range entries {
		for i := e.Offset; i < e.Offset+blockBytes(e); i++ {
			payload[i] = byte(i * 7)
		}
	}
	h := Header{Source: 1, Dest: 0, Tag: 9, Epoch: 3, DType: Mixed, PayloadLen: uint64(len(payload)),
		HasPayloadChecksum: true, PayloadChecksum: Checksum(payload)}
	msg := make([]byte, PayloadOffset(len(entries))+uint64(len(payload)))
	require.NoError(t, EncodeManifest(msg, h, entries))
	copy(msg[PayloadOffset(len(entries)):], payload)
	return msg
}

func TestGoldenMessage(t *testing.T) {
	path := filepath.Join("testdata", "golden-v1.bin")
	if *update {
		require.NoError(t, os.WriteFile(path, goldenMessage(t), 0o644))
	}
	golden, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, golden, goldenMessage(t), "the encoder no longer produces the documented bytes")

	m, err := DecodeManifest(golden, 1, 9)
	require.NoError(t, err)
	require.EqualValues(t, 1, m.Source)
	require.EqualValues(t, 0, m.Dest)
	require.EqualValues(t, 9, m.Tag)
	require.EqualValues(t, 3, m.Epoch)
	require.Equal(t, Mixed, m.DType)
	require.EqualValues(t, 3, m.Count)
	require.EqualValues(t, 256, m.PayloadOffset)
	require.EqualValues(t, 544, m.PayloadLen)
	require.Equal(t, []packing.Entry{
		{ID: 7, Offset: 0, Rows: 2, Cols: 3, DType: packing.Float64},
		{ID: 42, Offset: 256, Rows: 1, Cols: 1, DType: packing.Float64},
		{ID: 1 << 40, Offset: 512, Rows: 2, Cols: 2, DType: packing.Complex64},
	}, m.Entries)
	require.NoError(t, m.VerifyPayload(golden[m.PayloadOffset:], 1, 9))
	// The padding between the blocks is zero.
	payload := golden[m.PayloadOffset:]
	end := int64(0)
	for _, e := range m.Entries {
		require.Equal(t, make([]byte, e.Offset-end), payload[end:e.Offset], "padding before block %d", e.ID)
		end = e.Offset + blockBytes(e)
	}
	require.NotZero(t, payload[1], "block bytes follow 7*i mod 256")
	// Spot-check documented offsets (docs/WIRE.md).
	require.Equal(t, "DBUF", string(golden[0:4]))
	require.EqualValues(t, 1, binary.LittleEndian.Uint16(golden[4:]))
	require.EqualValues(t, 42, binary.LittleEndian.Uint64(golden[64+32:]))
	require.EqualValues(t, 3, golden[64+2*32+24])
}

func TestDecodeErrorsNameTheField(t *testing.T) {
	golden := goldenMessage(t)
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(golden)) }
	reseal := func(b []byte) []byte { // recompute the manifest checksum after an edit
		binary.LittleEndian.PutUint32(b[60:], 0)
		end := HeaderSize + int(binary.LittleEndian.Uint32(b[24:]))*EntrySize
		if end <= len(b) {
			binary.LittleEndian.PutUint32(b[60:], Checksum(b[:end]))
		}
		return b
	}
	for _, tc := range []struct {
		name, field string
		msg         []byte
		checksum    bool
	}{
		{"empty", "header", nil, false},
		{"truncated header", "header", golden[:40], false},
		{"truncated manifest", "block_count", golden[:100], false},
		{"truncated payload", "payload_length", golden[:len(golden)-1], false},
		{"extra bytes", "payload_length", append(bytes.Clone(golden), 0), false},
		{"magic", "magic", mutate(func(b []byte) []byte { b[0] = 'X'; return b }), false},
		{"version", "version", mutate(func(b []byte) []byte { b[4] = 2; return reseal(b) }), false},
		{"flags", "flags", mutate(func(b []byte) []byte { b[6] = 0x80; return reseal(b) }), false},
		{"entry size", "entry_size", mutate(func(b []byte) []byte { b[28] = 16; return reseal(b) }), false},
		{"manifest checksum", "manifest_checksum", mutate(func(b []byte) []byte { b[64] ^= 1; return b }), true},
		{"dtype", "entry[1].dtype", mutate(func(b []byte) []byte { b[64+32+24] = 9; return reseal(b) }), false},
		{"header dtype", "dtype", mutate(func(b []byte) []byte { b[20] = 77; return reseal(b) }), false},
		{"header dtype mismatch", "entry[2].dtype", mutate(func(b []byte) []byte { b[20] = byte(packing.Float64); return reseal(b) }), false},
		{"empty block", "entry[0].shape", mutate(func(b []byte) []byte { b[64+16] = 0; return reseal(b) }), false},
		{"overlap", "entry[1].offset", mutate(func(b []byte) []byte { b[64+32+9] = 0; b[64+32+8] = 8; return reseal(b) }), false},
		{"past payload", "entry[2].offset", mutate(func(b []byte) []byte { b[64+2*32+20] = 200; return reseal(b) }), false},
		{"size overflows 64 bits", "entry[2].offset", mutate(func(b []byte) []byte {
			// 2^31 x 2^30 complex64: rows*cols*8 is 2^64, 0 in 64 bits.
			binary.LittleEndian.PutUint32(b[64+2*32+16:], 1<<31)
			binary.LittleEndian.PutUint32(b[64+2*32+20:], 1<<30)
			return reseal(b)
		}), false},
		{"duplicate id", "entry[1].id", mutate(func(b []byte) []byte { b[64+32] = 7; return reseal(b) }), false},
		{"reserved", "entry[0].reserved", mutate(func(b []byte) []byte { b[64+30] = 1; return reseal(b) }), false},
		{"padding", "padding", mutate(func(b []byte) []byte { b[255] = 1; return reseal(b) }), false},
		{"payload offset", "payload_offset", mutate(func(b []byte) []byte { b[41] = 2; return reseal(b) }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeManifest(tc.msg, 3, 17)
			require.ErrorIs(t, err, ErrMalformed)
			var we *Error
			require.True(t, errors.As(err, &we))
			require.Equal(t, tc.field, we.Field)
			require.Equal(t, 3, we.Peer)
			require.Equal(t, 17, we.Tag)
			require.Equal(t, tc.checksum, errors.Is(err, ErrChecksum))
			require.ErrorContains(t, err, "rank 3 tag 17")
		})
	}
}

func TestPayloadChecksum(t *testing.T) {
	golden := goldenMessage(t)
	m, err := DecodeManifest(golden, 1, 9)
	require.NoError(t, err)
	payload := bytes.Clone(golden[m.PayloadOffset:])
	payload[100] ^= 0xff
	err = m.VerifyPayload(payload, 1, 9)
	require.ErrorIs(t, err, ErrChecksum)
	require.ErrorContains(t, err, "payload_checksum")
	require.ErrorIs(t, m.VerifyPayload(payload[:10], 1, 9), ErrMalformed)
	m.HasPayloadChecksum = false
	require.NoError(t, m.VerifyPayload(payload, 1, 9), "checksum switched off")
}

func TestEncodeRejects(t *testing.T) {
	buf := make([]byte, 1024)
	h := Header{DType: packing.Float64, PayloadLen: 64}
	require.ErrorIs(t, EncodeManifest(buf[:100], h, []packing.Entry{{ID: 1, Rows: 1, Cols: 1, DType: packing.Float64}}), ErrMalformed)
	require.ErrorIs(t, EncodeManifest(buf, h, []packing.Entry{{ID: 1, Rows: 9, Cols: 1, DType: packing.Float64}}), ErrMalformed, "past the payload")
	require.ErrorIs(t, EncodeManifest(buf, h, []packing.Entry{{ID: 1, Rows: 1, Cols: 1, DType: packing.Float32}}), ErrMalformed, "dtype mismatch")
	require.ErrorIs(t, EncodeManifest(buf, h, []packing.Entry{{ID: 1, Offset: 8, Rows: 1, Cols: 1, DType: packing.Float64}, {ID: 2, Rows: 1, Cols: 1, DType: packing.Float64}}), ErrMalformed, "out of order")
	require.NoError(t, EncodeManifest(buf, Header{DType: packing.Float64}, nil), "an empty message is valid")
	m, err := DecodeManifest(buf[:PayloadOffset(0)], 0, 0)
	require.NoError(t, err)
	require.Empty(t, m.Entries)
}

func FuzzDecodeManifest(f *testing.F) {
	golden := goldenMessage(f)
	f.Add(golden)
	f.Add(golden[:64])
	f.Add([]byte("DBUF"))
	empty := make([]byte, PayloadOffset(0))
	_ = EncodeManifest(empty, Header{DType: packing.Float32}, nil)
	f.Add(empty)
	notice := make([]byte, AbortSize)
	_ = EncodeAbort(notice, Header{Source: 1, Dest: 2, Tag: 3, Epoch: 4})
	f.Add(notice)
	f.Fuzz(func(t *testing.T, msg []byte) {
		m, err := DecodeManifest(msg, 1, 2)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		// Anything accepted is canonical: encoding it again gives the same manifest.
		again := make([]byte, m.PayloadOffset)
		if err := EncodeManifest(again, m.Header, m.Entries); err != nil {
			t.Fatalf("re-encode of an accepted manifest: %v", err)
		}
		if !bytes.Equal(again, msg[:m.PayloadOffset]) {
			t.Fatalf("accepted manifest is not canonical")
		}
		for _, e := range m.Entries {
			if e.Rows <= 0 || e.Cols <= 0 || e.Offset < 0 {
				t.Fatalf("entry %+v has a negative or empty field", e)
			}
			hi, n := bits.Mul64(uint64(e.Rows)*uint64(e.Cols), uint64(e.DType.Size()))
			end, carry := bits.Add64(uint64(e.Offset), n, 0)
			if hi != 0 || carry != 0 || end > m.PayloadLen {
				t.Fatalf("entry %+v outside the payload", e)
			}
		}
		_ = m.VerifyPayload(msg[m.PayloadOffset:], 1, 2)
	})
}

func TestAbortNotice(t *testing.T) {
	n := make([]byte, AbortSize)
	require.NoError(t, EncodeAbort(n, Header{Source: 2, Dest: 5, Tag: 7, Epoch: 9, PayloadLen: 100, HasPayloadChecksum: true}))
	m, err := DecodeManifest(n, 2, 7)
	require.NoError(t, err)
	require.True(t, m.Aborted)
	require.EqualValues(t, 9, m.Epoch)
	require.Zero(t, m.PayloadLen, "a notice carries nothing, whatever the header asked")
	require.Empty(t, m.Entries)
	require.Equal(t, uint16(flagAbort), binary.LittleEndian.Uint16(n[6:]))
	// The abort flag with entries or payload is malformed.
	require.ErrorIs(t, EncodeManifest(make([]byte, 512), Header{Aborted: true, PayloadLen: 8}, []packing.Entry{{ID: 1, Rows: 1, Cols: 1, DType: packing.Float64}}), ErrMalformed)
	golden := goldenMessage(t)
	golden[6] |= flagAbort
	binary.LittleEndian.PutUint32(golden[60:], 0)
	binary.LittleEndian.PutUint32(golden[60:], Checksum(golden[:HeaderSize+3*EntrySize]))
	_, err = DecodeManifest(golden, 1, 9)
	require.ErrorIs(t, err, ErrMalformed)
	var we *Error
	require.ErrorAs(t, err, &we)
	require.Equal(t, "flags", we.Field)
}

func TestFirstDuplicate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := 1 + rng.IntN(300)
		ids := make([]uint64, n)
		for i := range ids {
			switch rng.IntN(4) {
			case 0:
				ids[i] = math.MaxUint64 - uint64(rng.IntN(3)) // around the wrap of id+1
			case 1:
				ids[i] = uint64(rng.IntN(2 * n))
			default:
				ids[i] = rng.Uint64()
			}
		}
		want := -1
		seen := map[uint64]bool{}
		for i, id := range ids {
			if seen[id] {
				want = i
				break
			}
			seen[id] = true
		}
		require.Equal(t, want, firstDuplicate(n, func(i int) uint64 { return ids[i] }), "ids %v", ids)
	}
}

// TestWireDocShowsTheGoldenFiles compares each hex dump in docs/WIRE.md
// with its golden file, row by row: the doc shows the bytes a peer must
// produce.
func TestWireDocShowsTheGoldenFiles(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "WIRE.md"))
	require.NoError(t, err)
	row := regexp.MustCompile(`(?m)^([0-9a-f]{8}): ((?:[0-9a-f]{4} ){7}[0-9a-f]{4})`)
	for name, least := range map[string]int{"golden-v1.bin": 10, "window-notice-v1.bin": 7, "setup-rows-v1.bin": 13} {
		golden, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(t, err)
		// The dump is the first code block after the last paragraph that opens
		// with the file's name.
		at := strings.LastIndex(string(doc), "\n`internal/wire/testdata/"+name+"`")
		require.GreaterOrEqual(t, at, 0, "docs/WIRE.md introduces %s", name)
		block := string(doc[at:])
		start := strings.Index(block, "\n```\n")
		require.GreaterOrEqual(t, start, 0)
		block = block[start+5:]
		block = block[:strings.Index(block, "\n```")]
		rows := row.FindAllStringSubmatch(block, -1)
		require.GreaterOrEqual(t, len(rows), least, "the doc's dump of %s", name)
		for _, r := range rows {
			off, err := strconv.ParseUint(r[1], 16, 32)
			require.NoError(t, err)
			want, err := hex.DecodeString(strings.ReplaceAll(r[2], " ", ""))
			require.NoError(t, err)
			require.Equal(t, want, golden[off:off+16], "docs/WIRE.md, %s row %s", name, r[1])
		}
	}
}

// TestPayloadChecksumAnnounced: the flag as the header carries it, read
// from the header alone, as DecodeHeader reads it.
func TestPayloadChecksumAnnounced(t *testing.T) {
	golden := goldenMessage(t)
	on, ok := PayloadChecksumAnnounced(golden[:HeaderSize])
	require.True(t, ok)
	require.True(t, on)
	abort := make([]byte, AbortSize)
	require.NoError(t, EncodeAbort(abort, Header{Source: 1, Dest: 0, Tag: 9}))
	on, ok = PayloadChecksumAnnounced(abort)
	require.True(t, ok)
	require.False(t, on)
	_, ok = PayloadChecksumAnnounced(golden[:HeaderSize-1])
	require.False(t, ok, "a short header says nothing")
}
