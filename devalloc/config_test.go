package devalloc

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig("policy:retain,prime:2GiB,limit:80%")
	require.NoError(t, err)
	require.Equal(t, Config{Policy: Retain, Prime: 2 << 30, LimitFraction: 0.8}, c)

	c, err = ParseConfig(" policy : free , limit: 512MiB, threshold:64MiB, pool:off, cache:off ")
	require.NoError(t, err)
	require.Equal(t, Config{Policy: AggressiveFree, Limit: 512 << 20, FreeThreshold: 64 << 20, NoPool: true, Cache: -1}, c)

	c, err = ParseConfig("")
	require.NoError(t, err)
	require.Equal(t, Config{}, c)

	c, err = ParseConfig("policy:auto,headroom:12.5%")
	require.NoError(t, err)
	require.Equal(t, Config{Policy: Auto, HeadroomFraction: 0.125}, c)
	require.Equal(t, Auto, Config{}.Policy, "auto is the default")

	for in, want := range map[string]Config{
		"prime:none": {Prime: -1}, "prime:0": {Prime: -1}, "prime:0B": {Prime: -1},
		"prime:6.25%": {PrimeFraction: 0.0625}, "prime:3GiB": {Prime: 3 << 30},
	} {
		c, err = ParseConfig(in)
		require.NoError(t, err, in)
		require.Equal(t, want, c, in)
	}
	const gib = int64(1) << 30
	require.EqualValues(t, 5*gib, Config{}.resolvePrime(80*gib, true, Auto), "a sixteenth of the device on a retaining pool")
	require.EqualValues(t, 5*gib, Config{}.resolvePrime(80*gib, true, Retain))
	require.Zero(t, Config{}.resolvePrime(80*gib, true, AggressiveFree), "free gives it back at once")
	require.Zero(t, Config{}.resolvePrime(80*gib, false, Auto), "no default prime off the CUDA pool")
	require.Zero(t, Config{Prime: -1}.resolvePrime(80*gib, true, Auto))
	require.EqualValues(t, 8*gib, Config{PrimeFraction: 0.1}.resolvePrime(80*gib, true, Auto))
	require.EqualValues(t, 3*gib, Config{Prime: 3 * gib}.resolvePrime(80*gib, false, AggressiveFree))

	c, err = ParseConfig("headroom:4GiB")
	require.NoError(t, err)
	require.Equal(t, Config{Headroom: 4 << 30}, c)
	require.EqualValues(t, 4<<30, c.resolveHeadroom(80<<30))
	require.EqualValues(t, 5<<30, Config{}.resolveHeadroom(80<<30), "a sixteenth of the device by default")
	require.EqualValues(t, 8<<30, Config{HeadroomFraction: 0.1}.resolveHeadroom(80<<30))
	require.Zero(t, Config{}.resolveHeadroom(-1), "no headroom where the total is unknown")

	c, err = ParseConfig("limit:none,cache:1.5GB")
	require.NoError(t, err)
	require.Equal(t, Config{Cache: 1_500_000_000}, c)
}

func TestParseConfigErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ in, key string }{
		{"policy:keep", "policy"},
		{"headroom:lots", "headroom"},
		{"prime:150%", "prime"},
		{"headroom:120%", "headroom"},
		{"headroom:-1GiB", "headroom"},
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
		var ce *configError
		require.True(t, errors.As(err, &ce), tc.in)
		require.Equal(t, tc.key, ce.key, tc.in)
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
		{Policy: AggressiveFree, Prime: 3 << 30, LimitFraction: 0.75, FreeThreshold: 1000, NoPool: true, Cache: -1},
		{Limit: 12345, Cache: 64 << 20},
		{Policy: Retain, Headroom: 3 << 30},
		{Prime: -1},
		{PrimeFraction: 0.0625},
		{Policy: Auto, HeadroomFraction: 1.0 / 3},
		{LimitFraction: 1.0 / 3},
		{LimitFraction: 2.0 / 3},
		{LimitFraction: 0.1},
		{LimitFraction: 1},
		{LimitFraction: 0.07},
		{LimitFraction: 1e-9},
		{LimitFraction: minLimitFraction},
		{Limit: 1<<53 + 1},                   // beyond float64's integers
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
	require.Equal(t, 0.8, c.LimitFraction)
	c, err = ParseConfig("limit:8e1%")
	require.NoError(t, err)
	require.Equal(t, 0.8, c.LimitFraction)
}

// TestOpenRefusesLimitBelowOneAllocation: a percentage valid in itself may
// still resolve to less than one allocation of this machine's memory.
func TestOpenRefusesLimitBelowOneAllocation(t *testing.T) {
	_, err := Open(Options{Backend: BackendHost, Config: &Config{LimitFraction: 1e-12}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "less than one allocation")
	t.Setenv(envConf, "limit:1e-10%")
	_, err = Open(Options{Backend: BackendHost})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, envConf)
	_, err = Open(Options{Backend: BackendHost, Config: &Config{LimitFraction: 1e-300}})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "too small")
}

func TestBackendFromEnv(t *testing.T) {
	t.Setenv(envBackend, "HOST")
	b, err := resolveBackend("")
	require.NoError(t, err)
	require.Equal(t, BackendHost, b)
	b, err = resolveBackend(BackendCUDA)
	require.NoError(t, err)
	require.Equal(t, BackendCUDA, b, "Options win over the environment")
	b, err = resolveBackend(" Cuda ")
	require.NoError(t, err)
	require.Equal(t, BackendCUDA, b, "a name in Options is read as in the environment")
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
	require.Equal(t, BackendHost, a.Info().Backend)
	require.Contains(t, a.Info().FallbackReason, "CUDA")
	require.Len(t, warned, 1)
	require.EqualValues(t, 1, a.Stats().Fallbacks)
	require.NoError(t, a.Close())

	_, err = Open(Options{Backend: BackendCUDA, Config: &Config{}})
	require.ErrorIs(t, err, distbuf.ErrUnavailable, "an explicit cuda request never falls back")
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"policy:retain,prime:2GiB,limit:80%", "limit:none", "pool:off,cache:off", "threshold:1.5GB", "policy:auto,headroom:6.25%", "headroom:3GiB", ",,", "a:b:c"} {
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

func TestEnvConfig(t *testing.T) {
	t.Setenv("DISTBUF_ALLOC_CONF", "policy:retain,prime:none")
	c, err := EnvConfig()
	require.NoError(t, err)
	require.Equal(t, Config{Policy: Retain, Prime: -1}, c)
	t.Setenv("DISTBUF_ALLOC_CONF", "prime:lots")
	_, err = EnvConfig()
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.EqualError(t, err, `devalloc: DISTBUF_ALLOC_CONF: key "prime": bad value "lots": not a size (want e.g. 4096, 64KiB, 2GiB)`)
	t.Setenv("DISTBUF_ALLOC_CONF", "")
	c, err = EnvConfig()
	require.NoError(t, err)
	require.Equal(t, Config{}, c)
}
