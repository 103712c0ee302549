package devalloc

import (
	"github.com/distbuf/distbuf"

	"errors"
	"path/filepath"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig("policy:retain,prime:2GiB,limit:80%")
	require.NoError(t, err)
	require.Equal(t, Config{Policy: Retain, Prime: 2 << 30, Limit: Limit{Fraction: 0.8}}, c)

	c, err = ParseConfig(" policy : free , limit: 512MiB, threshold:64MiB, pool:off, cache:off ")
	require.NoError(t, err)
	require.Equal(t, Config{Policy: AggressiveFree, Limit: Limit{Bytes: 512 << 20}, FreeThreshold: 64 << 20, Pool: PoolOff, Cache: -1}, c)

	c, err = ParseConfig("")
	require.NoError(t, err)
	require.Equal(t, Config{}, c)

	c, err = ParseConfig("limit:none,cache:1.5GB")
	require.NoError(t, err)
	require.Equal(t, Config{Cache: 1_500_000_000}, c)
}

func TestParseConfigErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ in, key string }{
		{"policy:keep", "policy"},
		{"prime:lots", "prime"},
		{"limit:150%", "limit"},
		{"limit:-3%", "limit"},
		{"limit:-1GiB", "limit"},
		{"threshold:1e400", "threshold"},
		{"pool:maybe", "pool"},
		{"cache:?", "cache"},
		{"colour:blue", "colour"},
		{"policy", "policy"},
		{"policy:retain,policy:free", "policy"},
		// Values that used to become a budget of 0 bytes, that is none.
		{"limit:0.5", "limit"},
		{"limit:0.9B", "limit"},
		{"limit:1e-300%", "limit"},
		{"limit:0KiB", "limit"},
		{"prime:0.5", "prime"},
		{"threshold:1.1KiB", "threshold"},
		{"cache:1e-3", "cache"},
		{"limit:1/2", "limit"},
		{"limit:0x10", "limit"},
		{"limit:1e99999999999", "limit"},
	} {
		_, err := ParseConfig(tc.in)
		require.ErrorIs(t, err, distbuf.ErrBadConfig, tc.in)
		var ce *ConfigError
		require.True(t, errors.As(err, &ce), tc.in)
		require.Equal(t, tc.key, ce.Key, tc.in)
		require.Contains(t, err.Error(), tc.key, tc.in)
	}
}

func TestParseConfigRejectsWithReason(t *testing.T) {
	for in, reason := range map[string]string{
		"limit:0.5":     "whole number of bytes",
		"limit:0.9B":    "whole number of bytes",
		"limit:1e-300%": "too small",
		"limit:0B":      "write none",
		"limit:-2GiB":   "negative",
	} {
		_, err := ParseConfig(in)
		require.ErrorIs(t, err, distbuf.ErrBadConfig, in)
		require.ErrorContains(t, err, reason, in)
	}
}

func TestConfigStringRoundTrip(t *testing.T) {
	for _, c := range []Config{
		{},
		{Policy: AggressiveFree, Prime: 3 << 30, Limit: Limit{Fraction: 0.75}, FreeThreshold: 1000, Pool: PoolOff, Cache: -1},
		{Limit: Limit{Bytes: 12345}, Cache: 64 << 20},
		{Limit: Limit{Fraction: 1.0 / 3}},
		{Limit: Limit{Fraction: 2.0 / 3}},
		{Limit: Limit{Fraction: 0.1}},
		{Limit: Limit{Fraction: 1}},
		{Limit: Limit{Fraction: 0.07}},
		{Limit: Limit{Fraction: 1e-9}},
		{Limit: Limit{Fraction: minLimitFraction}},
		{Limit: Limit{Bytes: 1<<53 + 1}},     // beyond float64's integers
		{Prime: 9_007_199_254_740_993 * 256}, // likewise, in a unit
	} {
		back, err := ParseConfig(c.String())
		require.NoError(t, err, c.String())
		require.Equal(t, c, back, c.String())
	}
}

func TestPercentRoundTrip(t *testing.T) {
	for _, f := range []float64{1.0 / 3, 2.0 / 3, 0.1, 0.2, 0.3, 0.8, 1, 0.999999999, 1e-7, 3e-12, 0.5} {
		s := formatPercent(f)
		back, err := parsePercent(s[:len(s)-1])
		require.NoError(t, err, s)
		require.Equal(t, f, back, "%v -> %s", f, s)
	}
	require.Equal(t, "80%", formatPercent(0.8))
	require.Equal(t, "33.33333333333333%", formatPercent(1.0/3))
	require.Equal(t, "100%", formatPercent(1))
	require.Equal(t, "0.01%", formatPercent(0.0001))
	c, err := ParseConfig("limit:80%")
	require.NoError(t, err)
	require.Equal(t, 0.8, c.Limit.Fraction)
	c, err = ParseConfig("limit:8e1%")
	require.NoError(t, err)
	require.Equal(t, 0.8, c.Limit.Fraction)
}

// TestOpenRefusesLimitBelowOneAllocation: a percentage valid in itself may
// still resolve to less than one allocation of this machine's memory.
func TestOpenRefusesLimitBelowOneAllocation(t *testing.T) {
	_, err := Open(Options{Backend: BackendHost, Config: &Config{Limit: Limit{Fraction: 1e-12}}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "less than one allocation")
	t.Setenv(EnvConf, "limit:1e-10%")
	_, err = Open(Options{Backend: BackendHost})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, EnvConf)
	_, err = Open(Options{Backend: BackendHost, Config: &Config{Limit: Limit{Fraction: 1e-300}}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "too small")
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "64KiB": 64 << 10, "2G": 2 << 30, "1.5GB": 1_500_000_000,
		"3 MiB": 3 << 20, "7b": 7, "1TiB": 1 << 40, "2.3MB": 2_300_000, "0.1KB": 100, "1e3": 1000,
		"1.5KiB": 1536, "9007199254740993": 9007199254740993,
	} {
		got, err := ParseBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "-1", "abc", "NaN", "1e300TiB", "Inf", "0.5", "1.1KiB", "3/4", "1_000", "0x100", "1e-99999999"} {
		_, err := ParseBytes(in)
		require.Error(t, err, in)
	}
}

func TestFormatBytes(t *testing.T) {
	require.Equal(t, "512 B", FormatBytes(512))
	require.Equal(t, "64 KiB", FormatBytes(64<<10))
	require.Equal(t, "1.5 GiB", FormatBytes(3<<29))
}

func TestBackendFromEnv(t *testing.T) {
	t.Setenv(EnvBackend, "HOST")
	b, err := resolveBackend("")
	require.NoError(t, err)
	require.Equal(t, BackendHost, b)
	b, err = resolveBackend(BackendCUDA)
	require.NoError(t, err)
	require.Equal(t, BackendCUDA, b, "Options win over the environment")
	_, err = resolveBackend("tpu")
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
}

func TestAutoFallbackIsReported(t *testing.T) {
	if openCUDA != nil {
		// The CUDA backend is compiled in: take the runtime away.
		t.Setenv(cudart.EnvCUDART, filepath.Join(t.TempDir(), "libcudart-absent.so"))
	}
	var warned []string
	a, err := Open(Options{Backend: BackendAuto, Config: &Config{}, Warn: func(m string) { warned = append(warned, m) }})
	require.NoError(t, err)
	require.Equal(t, KindHost, a.Kind())
	require.Contains(t, a.FallbackReason(), "CUDA")
	require.Len(t, warned, 1)
	require.EqualValues(t, 1, a.Stats().Fallbacks)
	require.NoError(t, a.Close())

	_, err = Open(Options{Backend: BackendCUDA, Config: &Config{}})
	require.ErrorIs(t, err, distbuf.ErrUnavailable, "an explicit cuda request never falls back")
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"policy:retain,prime:2GiB,limit:80%", "limit:none", "pool:off,cache:off", "threshold:1.5GB", ",,", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConfig(s)
		if err != nil {
			if !errors.Is(err, distbuf.ErrBadConfig) {
				t.Fatalf("error %v does not match distbuf.ErrBadConfig", err)
			}
			return
		}
		if err := c.validate("fuzz"); err != nil {
			t.Fatalf("parsed config %+v fails validation: %v", c, err)
		}
		back, err := ParseConfig(c.String())
		if err != nil || back != c {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, c, c.String(), back, err)
		}
	})
}
