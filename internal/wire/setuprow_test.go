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

// goldenRanks are the senders of the golden rows, by position.
var goldenRanks = []int{2, 0, 1}

func setupWords(rows []SetupRow) []int64 {
	words := make([]int64, SetupRowWords*len(rows))
	for i := range rows {
		rows[i].Encode(words[i*SetupRowWords:])
	}
	return words
}

func TestSetupRowsAgainstSenders(t *testing.T) {
	rows, err := DecodeSetupRows(setupWords(goldenSetupRows()), goldenRanks, 3)
	require.NoError(t, err)
	require.Equal(t, goldenSetupRows(), rows)

	for _, tc := range []struct {
		name  string
		edit  func(rows []SetupRow)
		ranks []int
		want  string
	}{
		{"a rank field that is not its sender's", func(r []SetupRow) { r[2].Rank = 0 }, goldenRanks,
			"the row of rank 1 (position 2) says it is rank 0's"},
		{"rows that trade places", nil, []int{0, 2, 1}, "the row of rank 0 (position 0) says it is rank 2's"},
		{"two rows offering reads of one process", func(r []SetupRow) {
			r[2] = SetupRow{Rank: 1, Flags: SetupReads, PID: r[1].PID, ProbeAddr: 8, ProbeValue: 9}
		}, goldenRanks, "the rows of ranks 0 and 1 both offer reads of process 4242"},
		{"two rows naming one event", func(r []SetupRow) {
			r[2] = SetupRow{Rank: 1, Flags: SetupWindows, Ready: r[0].Consumed}
			r[2].Consumed[0] = 0xee
		}, goldenRanks, "the rows of ranks 2 and 1 name one interprocess event"},
		{"a malformed row names its sender", func(r []SetupRow) { r[1].ProbeValue = 0 }, goldenRanks,
			"sent by rank 0, at position 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := goldenSetupRows()
			if tc.edit != nil {
				tc.edit(rows)
			}
			_, err := DecodeSetupRows(setupWords(rows), tc.ranks, 3)
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err = DecodeSetupRows(setupWords(goldenSetupRows())[1:], goldenRanks, 3)
	require.ErrorIs(t, err, ErrMalformed, "a word short")
}

func FuzzSetupRows(f *testing.F) {
	f.Add(setupBytes(goldenSetupRows()), []byte{2, 0, 1})
	f.Add(setupBytes(goldenSetupRows()[1:]), []byte{0, 1})
	f.Fuzz(func(t *testing.T, b []byte, senders []byte) {
		words := make([]int64, len(b)/8)
		for i := range words {
			words[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		ranks := make([]int, len(senders))
		for i, s := range senders {
			ranks[i] = int(s % 8)
		}
		rows, err := DecodeSetupRows(words, ranks, 8)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		// Anything accepted is its senders' rows, each naming its
		// sender, no process offered twice.
		pids := map[int64]bool{}
		for i, r := range rows {
			if r.Rank != ranks[i] {
				t.Fatalf("row %d of rank %d accepted naming rank %d", i, ranks[i], r.Rank)
			}
			if r.Flags == SetupReads {
				if pids[r.PID] {
					t.Fatalf("process %d offered twice", r.PID)
				}
				pids[r.PID] = true
			}
		}
	})
}
