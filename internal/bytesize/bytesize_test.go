package bytesize

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "64KiB": 64 << 10, "2G": 2 << 30, "1.5GB": 1_500_000_000,
		"3 MiB": 3 << 20, "7b": 7, "1TiB": 1 << 40, "2.3MB": 2_300_000, "0.1KB": 100, "1e3": 1000,
		"1.5KiB": 1536, "9007199254740993": 9007199254740993,
	} {
		got, err := Parse(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "-1", "abc", "NaN", "1e300TiB", "Inf", "0.5", "1.1KiB", "3/4", "1_000", "0x100", "1e-99999999"} {
		_, err := Parse(in)
		require.Error(t, err, in)
	}
}

func TestFormat(t *testing.T) {
	require.Equal(t, "512 B", Format(512))
	require.Equal(t, "64 KiB", Format(64<<10))
	require.Equal(t, "1.5 GiB", Format(3<<29))
}

func TestExactRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 1000, 1024, 3 << 30, 12345, 1<<53 + 1, 9_007_199_254_740_993 * 256} {
		back, err := Parse(Exact(n))
		require.NoError(t, err, Exact(n))
		require.Equal(t, n, back, Exact(n))
	}
	require.Equal(t, "2GiB", Exact(2<<30))
	require.Equal(t, "1000", Exact(1000))
}
