package wire

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// goldenSetupRows are the setup rows kept in testdata, as the Allgather
// leaves them (little-endian int64s, row after row): rank 2 takes part in
// windows (its ready handle's byte i is i, its consumed handle's 0x80+i),
// rank 0 offers reads (process 4242, its probe word at 0x7ffd12345678
// holding 0x0123456789abcdef), rank 1 neither.
func goldenSetupRows() []SetupRow {
	win := SetupRow{Rank: 2, Flags: SetupWindows}
	for i := range win.Ready {
		win.Ready[i], win.Consumed[i] = byte(i), byte(0x80+i)
	}
	return []SetupRow{
		win,
		{Rank: 0, Flags: SetupReads, PID: 4242, ProbeAddr: 0x7ffd12345678, ProbeValue: 0x0123456789abcdef},
		{Rank: 1},
	}
}

func setupBytes(rows []SetupRow) []byte {
	words := make([]int64, SetupRowWords*len(rows))
	for i := range rows {
		rows[i].Encode(words[i*SetupRowWords:])
	}
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(w))
	}
	return b
}

func TestGoldenSetupRows(t *testing.T) {
	rows := goldenSetupRows()
	golden := readGolden(t, "setup-rows-v1.bin", setupBytes(rows))
	require.Len(t, golden, 3*SetupRowWords*8)
	for i, want := range rows {
		words := make([]int64, SetupRowWords)
		for w := range words {
			words[w] = int64(binary.LittleEndian.Uint64(golden[8*(i*SetupRowWords+w):]))
		}
		got, err := DecodeSetupRow(words, 3)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
}

func TestSetupRowErrors(t *testing.T) {
	good := make([]int64, SetupRowWords)
	reads := goldenSetupRows()[1]
	reads.Encode(good)
	for _, tc := range []struct {
		name string
		edit func(w []int64) []int64
	}{
		{"short", func(w []int64) []int64 { return w[:SetupRowWords-1] }},
		{"rank", func(w []int64) []int64 { w[0] = 3; return w }},
		{"negative rank", func(w []int64) []int64 { w[0] = -1; return w }},
		{"unknown flag", func(w []int64) []int64 { w[1] |= 4; return w }},
		{"both flags", func(w []int64) []int64 { w[1] = SetupWindows | SetupReads; return w }},
		{"no process", func(w []int64) []int64 { w[2] = 0; return w }},
		{"no probe", func(w []int64) []int64 { w[3] = 0; return w }},
		{"unused word", func(w []int64) []int64 { w[9] = 1; return w }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSetupRow(tc.edit(append([]int64(nil), good...)), 3)
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
	idle := make([]int64, SetupRowWords)
	idle[0], idle[5] = 1, 7
	_, err := DecodeSetupRow(idle, 3)
	require.ErrorIs(t, err, ErrMalformed, "a rank that takes part in nothing leaves its words zero")
}

func FuzzSetupRow(f *testing.F) {
	f.Add(setupBytes(goldenSetupRows()[:1]), 3)
	f.Add(setupBytes(goldenSetupRows()[1:2]), 3)
	f.Add(setupBytes(goldenSetupRows()[2:]), 2)
	f.Fuzz(func(t *testing.T, b []byte, size int) {
		words := make([]int64, len(b)/8)
		for i := range words {
			words[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		r, err := DecodeSetupRow(words, size)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		// Anything accepted names a rank of the communicator and encodes
		// back to the same words.
		if r.Rank < 0 || r.Rank >= size {
			t.Fatalf("accepted rank %d of %d", r.Rank, size)
		}
		again := make([]int64, SetupRowWords)
		r.Encode(again)
		require.Equal(t, words[:SetupRowWords], again)
	})
}
