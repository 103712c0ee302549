package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allockind"
	"github.com/stretchr/testify/require"
)

func TestFlagsRejectBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"-iters", "3", "stray"}, `unexpected argument "stray"`},
		{[]string{"-iters", "9223372036854775807"}, "-iters 9223372036854775807: at most"},
		{[]string{"-blocks", "99999999999999999"}, "-blocks 99999999999999999: want 0 to"},
		{[]string{"-blocks", "-1"}, "-blocks -1"},
		{[]string{"-iters", "lots"}, "invalid value"},
		// The benchmarks are in their packages and in distbench.
		{[]string{"-bench", "alloc"}, "flag provided but not defined: -bench"},
		{[]string{"-workload", "dense"}, `-workload "dense": want synthetic, sectors or maxm`},
		{[]string{"-m", "0"}, "-m 0: want 1 to 1048576"},
		{[]string{"-m", "2000000"}, "-m 2000000: want 1 to"},
		{[]string{"-big-block", "lots"}, `-big-block "lots": not a size`},
		{[]string{"-big-block", "-1"}, `-big-block "-1"`},
	} {
		_, err := parseFlags(tc.args, io.Discard)
		require.ErrorContains(t, err, tc.want, strings.Join(tc.args, " "))
	}
	cfg, err := parseFlags([]string{"-iters", "7", "-backend", "host", "-policy", "free"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 7, cfg.iters)
	require.Equal(t, "host", cfg.backend)
	require.Equal(t, "free", cfg.policy)
	require.Equal(t, "synthetic", cfg.workload, "the default workload")
	require.Equal(t, defaultM, cfg.m)
	require.EqualValues(t, 1<<20, cfg.bigBlock)
	cfg, err = parseFlags([]string{"-workload", "sectors", "-m", "1000", "-big-block", "64KiB"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "sectors", cfg.workload)
	require.Equal(t, 1000, cfg.m)
	require.EqualValues(t, 64<<10, cfg.bigBlock)
}

// TestEnvironmentUnlessFlagGiven: -backend and -policy override
// DISTBUF_BACKEND and the policy of DISTBUF_ALLOC_CONF only when given.
func TestEnvironmentUnlessFlagGiven(t *testing.T) {
	open := func(args ...string) (*devalloc.Allocator, error) {
		t.Helper()
		cfg, err := parseFlags(args, io.Discard)
		require.NoError(t, err)
		return openAllocator(cfg)
	}
	t.Setenv("DISTBUF_ALLOC_CONF", "policy:free,limit:64MiB")
	t.Setenv("DISTBUF_BACKEND", "host")
	a, err := open()
	require.NoError(t, err)
	require.Equal(t, devalloc.AggressiveFree, a.Info().Config.Policy, "the environment's policy, without -policy")
	require.EqualValues(t, 64<<20, a.Info().Limit, "the rest of the environment's configuration")
	require.Equal(t, devalloc.BackendHost, a.Info().Backend)
	require.NoError(t, a.Close())
	a, err = open("-policy", "retain")
	require.NoError(t, err)
	require.Equal(t, devalloc.Retain, a.Info().Config.Policy, "-policy given")
	require.EqualValues(t, 64<<20, a.Info().Limit)
	require.NoError(t, a.Close())

	// DISTBUF_BACKEND=cuda means CUDA or an error, unless -backend says
	// otherwise. (Where CUDA opens, the allocator is a CUDA one.)
	t.Setenv("DISTBUF_BACKEND", "cuda")
	if a, err = open(); err == nil {
		require.Equal(t, devalloc.BackendCUDA, a.Info().Backend, "DISTBUF_BACKEND=cuda opened %s", allockind.Name(a))
		require.NoError(t, a.Close())
	} else {
		require.ErrorContains(t, err, "cuda")
	}
	a, err = open("-backend", "host")
	require.NoError(t, err)
	require.Equal(t, devalloc.BackendHost, a.Info().Backend)
	require.NoError(t, a.Close())
	t.Setenv("DISTBUF_BACKEND", "tape")
	_, err = open()
	require.ErrorContains(t, err, "tape")
}

func TestSettingsNamePolicyAndBackendAsResolved(t *testing.T) {
	t.Setenv("DISTBUF_ALLOC_CONF", "policy:free,limit:1GiB")
	t.Setenv("DISTBUF_BACKEND", "")
	byName := func(cfg config) map[string]string {
		settings, err := agreedSettings(&cfg)
		require.NoError(t, err)
		out := map[string]string{}
		for _, s := range settings {
			out[s.Name] = s.Shown
		}
		return out
	}
	s := byName(config{iters: 3})
	require.Equal(t, `"free"`, s["-policy"])
	require.Equal(t, `"auto"`, s["-backend"])
	require.Equal(t, "3", s["-iters"])
	s = byName(config{iters: 3, workload: "sectors", m: 512, bigBlock: 4096})
	require.Equal(t, `"sectors"`, s["-workload"], "ranks on other workloads would wait in other collectives")
	require.Equal(t, "512", s["-m"])
	require.Equal(t, "4096", s["-big-block"])
	// Another limit is no other policy.
	t.Setenv("DISTBUF_ALLOC_CONF", "policy:free,limit:2MiB")
	require.Equal(t, `"free"`, byName(config{iters: 3})["-policy"])
	require.Equal(t, `"retain"`, byName(config{policy: "retain"})["-policy"])

	// A flag given at its default agrees with the flag left out.
	require.Equal(t, byName(config{iters: 3}), byName(config{iters: 3, mode: "packed", blocks: 2000, workload: "synthetic", bonds: defaultBonds}))
}

// TestSettingsResolveErrors: a setting this rank cannot resolve is the
// error the agreement then reports on every rank, named; and the
// collectives' bound comes from DISTBUF_MSG_TIMEOUT.
func TestSettingsResolveErrors(t *testing.T) {
	t.Setenv("DISTBUF_ALLOC_CONF", "policy:sometimes")
	cfg := config{iters: 3}
	_, err := agreedSettings(&cfg)
	require.ErrorContains(t, err, `devalloc: DISTBUF_ALLOC_CONF: key "policy": bad value "sometimes"`)
	t.Setenv("DISTBUF_ALLOC_CONF", "")
	cfg = config{iters: 3, policy: "hoard"}
	_, err = agreedSettings(&cfg)
	require.ErrorContains(t, err, `-policy "hoard"`)

	t.Setenv("DISTBUF_MSG_TIMEOUT", "7s")
	cfg = config{iters: 3}
	_, err = agreedSettings(&cfg)
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, cfg.timeout)
	t.Setenv("DISTBUF_MSG_TIMEOUT", "whenever")
	_, err = agreedSettings(&cfg)
	require.ErrorContains(t, err, "DISTBUF_MSG_TIMEOUT")
}
