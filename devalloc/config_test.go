package devalloc

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig("policy:retain,prime:2GiB,limit:80%")
	require.NoError(t, err)
	require.Equal(t, Config{Policy: Retain, Prime: 2 << 30, Limit: Limit{Fraction: 0.8}}, c)

	c, err = ParseConfig(" policy : free , limit: 512MiB, threshold:64MiB, pool:off, cache:off ")
	require.NoError(t, err)
	require.Equal(t, Config{Policy: AggressiveFree, Limit: Limit{Bytes: 512 << 20}, FreeThreshold: 64 << 20, Pool: PoolOff, FallbackCache: -1}, c)

	c, err = ParseConfig("")
	require.NoError(t, err)
	require.Equal(t, Config{}, c)

	c, err = ParseConfig("limit:none,cache:1.5GB")
	require.NoError(t, err)
	require.Equal(t, Config{FallbackCache: 1_500_000_000}, c)
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
	} {
		_, err := ParseConfig(tc.in)
		require.ErrorIs(t, err, ErrBadConfig, tc.in)
		var ce *ConfigError
		require.True(t, errors.As(err, &ce), tc.in)
		require.Equal(t, tc.key, ce.Key, tc.in)
		require.Contains(t, err.Error(), tc.key, tc.in)
	}
}

func TestConfigStringRoundTrip(t *testing.T) {
	for _, c := range []Config{
		{},
		{Policy: AggressiveFree, Prime: 3 << 30, Limit: Limit{Fraction: 0.75}, FreeThreshold: 1000, Pool: PoolOff, FallbackCache: -1},
		{Limit: Limit{Bytes: 12345}, FallbackCache: 64 << 20},
	} {
		back, err := ParseConfig(c.String())
		require.NoError(t, err, c.String())
		require.Equal(t, c, back, c.String())
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "64KiB": 64 << 10, "2G": 2 << 30, "1.5GB": 1_500_000_000,
		"3 MiB": 3 << 20, "7b": 7, "1TiB": 1 << 40,
	} {
		got, err := ParseBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "-1", "abc", "NaN", "1e300TiB", "Inf"} {
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
	require.ErrorIs(t, err, ErrBadConfig)
}

func TestAutoFallbackIsReported(t *testing.T) {
	if openCUDA != nil {
		t.Skip("the CUDA backend is compiled in; the fallback reason depends on the machine")
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
	require.ErrorIs(t, err, ErrUnavailable, "an explicit cuda request never falls back")
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"policy:retain,prime:2GiB,limit:80%", "limit:none", "pool:off,cache:off", "threshold:1.5GB", ",,", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConfig(s)
		if err != nil {
			if !errors.Is(err, ErrBadConfig) {
				t.Fatalf("error %v does not match ErrBadConfig", err)
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
