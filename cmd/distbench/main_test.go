package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/distbuf/distbuf/internal/ranksettings"
	"github.com/stretchr/testify/require"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "name a benchmark first"},
		{[]string{"-iters", "3"}, "name a benchmark first"},
		{[]string{"alloc"}, `unknown benchmark "alloc"`},
		{[]string{"exchange", "stray"}, `unexpected argument "stray"`},
		{[]string{"exchange", "-iters", "-1"}, "-iters -1"},
		{[]string{"exchange", "-blocks", "99999999999"}, "-blocks 99999999999"},
		{[]string{"exchange", "-block-bytes", "-8"}, "-block-bytes -8"},
	} {
		_, err := parseArgs(tc.args, io.Discard)
		require.ErrorContains(t, err, tc.want, strings.Join(tc.args, " "))
	}
	cfg, err := parseArgs([]string{"exchange", "-mode", "packed,raw", "-iters", "7", "-blocks", "10", "-block-bytes", "64"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{bench: "exchange", mode: "packed,raw", iters: 7, blocks: 10, blockBytes: 64}, cfg)
}

// TestResolvedSettings: what the ranks compare is what they will run, so
// flags given at their defaults, or spelled otherwise, agree with flags
// left out, and flags that change the run do not.
func TestResolvedSettings(t *testing.T) {
	t.Setenv("DISTBUF_BACKEND", "host")
	t.Setenv("DISTBUF_MSG_TIMEOUT", "90s")
	resolved := func(args ...string) []ranksettings.Setting {
		t.Helper()
		cfg, err := parseArgs(append([]string{"exchange"}, args...), io.Discard)
		require.NoError(t, err)
		_, settings, timeout, err := resolveSettings(cfg)
		require.NoError(t, err, "%v", args)
		require.Equal(t, 90*time.Second, timeout)
		return settings
	}
	base := resolved("-mode", "packed,raw")
	for _, same := range [][]string{
		{"-mode", "packed, raw", "-blocks", "1000", "-block-bytes", "256"},
		{"-mode", "packed,raw", "-iters", "20"},
		{"-mode", "packed,raw", "-iters", "5"},
		{"-mode", "packed,raw", "-backend", " HOST"},
	} {
		require.Equal(t, base, resolved(same...), "%v", same)
	}
	for _, other := range [][]string{
		{"-mode", "raw,packed"},
		{"-mode", "packed,raw", "-iters", "21"},
		{"-mode", "packed,raw", "-blocks", "999"},
		{"-mode", "packed,raw", "-backend", "auto"},
	} {
		require.NotEqual(t, base, resolved(other...), "%v", other)
	}
	// Every host mode and device on the CUDA backend is what no -mode
	// asks for; -blocks then sets the device mode's blocks too.
	all := resolved()
	require.Equal(t, all, resolved("-blocks", "0", "-block-bytes", "0"))
	require.NotEqual(t, all, resolved("-blocks", "1000"))
	require.NotEqual(t, all, resolved("-mode", "packed,packed-cold,persistent,packed-mpi,perblock,raw"))
	require.Equal(t, resolved("-mode", "device"), resolved("-mode", "device", "-blocks", "256", "-block-bytes", "1048576"))
}

// TestUnresolvedSettings: a rank whose flags or environment cannot be
// resolved still has settings of the same names, to take part in the
// agreement with its failure reported.
func TestUnresolvedSettings(t *testing.T) {
	unsetenv(t, "DISTBUF_MSG_TIMEOUT")
	unsetenv(t, "DISTBUF_BACKEND")
	names := func(s []ranksettings.Setting) []string {
		var n []string
		for _, x := range s {
			n = append(n, x.Name)
		}
		return n
	}
	cfg, err := parseArgs([]string{"exchange"}, io.Discard)
	require.NoError(t, err)
	_, good, _, err := resolveSettings(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-mode", "pakced"}, nil, `-mode "pakced"`},
		{[]string{"-block-bytes", "12"}, nil, "-block-bytes 12: want a multiple of 8"},
		{[]string{"-backend", "gpu"}, nil, `-backend "gpu": want auto, cuda or host`},
		{nil, map[string]string{"DISTBUF_BACKEND": "tpu"}, `DISTBUF_BACKEND "tpu"`},
		{nil, map[string]string{"DISTBUF_MSG_TIMEOUT": "soon"}, "DISTBUF_MSG_TIMEOUT"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		cfg, err := parseArgs(append([]string{"exchange"}, tc.args...), io.Discard)
		require.NoError(t, err)
		_, bad, _, err := resolveSettings(cfg)
		require.ErrorContains(t, err, tc.want)
		require.Equal(t, names(good), names(bad))
		for k := range tc.env {
			unsetenv(t, k)
		}
	}
}

// unsetenv removes name from the environment until the test ends.
func unsetenv(t *testing.T, name string) {
	t.Setenv(name, "")
	require.NoError(t, os.Unsetenv(name))
}

// mpiJob builds distbench with the mpi tag and returns a maker of mpirun
// commands (arguments "%bin" become the binary), with a two-minute limit
// and without the environment of an enclosing MPI job or DISTBUF_
// settings. It skips the test where there is no Open MPI to build against
// or to launch with.
func mpiJob(t *testing.T) func(args ...string) (*exec.Cmd, context.CancelFunc) {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("no mpirun on PATH")
	}
	if err := exec.Command("pkg-config", "--exists", "mpi").Run(); err != nil {
		t.Skip("pkg-config finds no MPI to build against")
	}
	if version, _ := exec.Command(mpirun, "--version").CombinedOutput(); !bytes.Contains(version, []byte("Open MPI")) {
		t.Skip("the job uses Open MPI's mpirun flags")
	}
	bin := filepath.Join(t.TempDir(), "distbench")
	out, err := exec.Command("go", "build", "-tags", "mpi", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	flags := []string{"--oversubscribe"}
	if os.Getuid() == 0 {
		flags = append(flags, "--allow-run-as-root")
	}
	return func(args ...string) (*exec.Cmd, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		full := append([]string(nil), flags...)
		for _, a := range args {
			if a == "%bin" {
				a = bin
			}
			full = append(full, a)
		}
		cmd := exec.CommandContext(ctx, mpirun, full...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "OMPI_") && !strings.HasPrefix(kv, "PMIX_") && !strings.HasPrefix(kv, "DISTBUF_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		return cmd, cancel
	}
}

// TestSettingsJob: ranks started with flags that resolve alike (one given
// -blocks, -block-bytes and -iters at what the other's defaults resolve
// to, and -backend where the other has DISTBUF_BACKEND) run together;
// ranks that resolve other repetitions fail alike, naming the setting; a
// rank whose -mode cannot be resolved is named by the other, which does
// not wait for it.
func TestSettingsJob(t *testing.T) {
	job := mpiJob(t)
	run := func(args ...string) (string, error) {
		cmd, cancel := job(args...)
		defer cancel()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("-n", "1", "%bin", "exchange", "-mode", "packed", "-backend", "host", "-blocks", "1000", "-block-bytes", "256", "-iters", "5", ":",
		"-n", "1", "-x", "DISTBUF_BACKEND=host", "%bin", "exchange", "-mode", "packed")
	require.NoError(t, err, out)
	require.Contains(t, out, `"mode":"packed"`)

	out, err = run("-n", "1", "%bin", "exchange", "-mode", "packed", "-backend", "host", ":",
		"-n", "1", "%bin", "exchange", "-mode", "packed", "-backend", "host", "-iters", "30")
	require.Error(t, err, out)
	require.Contains(t, out, "the ranks disagree on repetitions (-iters, at least 20): rank 0 has repetitions (-iters, at least 20) 20, rank 1 has repetitions (-iters, at least 20) 30")

	out, err = run("-n", "1", "%bin", "exchange", "-mode", "packed", "-backend", "host", ":",
		"-n", "1", "%bin", "exchange", "-mode", "pakced", "-backend", "host")
	require.Error(t, err, out)
	require.Contains(t, out, "distbench: rank 0: ranksettings: rank 1 could not resolve their settings")
	require.Contains(t, out, `distbench: rank 1: -mode "pakced"`)
}

// TestExchangeJob runs `distbench exchange` under mpirun -n 2 (built with
// the mpi tag) on the host backend, a few repetitions: rank 0 prints one
// line per mode asked for, with the ratios against the baselines of the
// same run. Skipped where there is no Open MPI to build against or to
// launch with.
func TestExchangeJob(t *testing.T) {
	job := mpiJob(t)
	cmd, cancel := job("-n", "2", "%bin", "exchange", "-backend", "host",
		"-mode", "packed,perblock,raw", "-iters", "5", "-blocks", "50", "-block-bytes", "64")
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr:\n%s\nstdout:\n%s", stderr.String(), stdout.String())
	byMode := map[string]benchResult{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var r benchResult
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "line %q", sc.Text())
		require.Equal(t, "exchange", r.Bench)
		byMode[r.Mode] = r
	}
	require.Len(t, byMode, 3, "one line per mode, from rank 0 alone:\n%s", stdout.String())
	packed := byMode["packed"]
	require.Equal(t, 50, packed.N)
	require.EqualValues(t, 50*64, packed.Bytes)
	require.Positive(t, packed.MedianUS)
	for _, k := range []string{"perblock_over_packed", "packed_over_raw", "agreement_alltoall_us", "route"} {
		require.Contains(t, packed.Extra, k)
	}
	require.EqualValues(t, 50, byMode["perblock"].Extra["mpi_messages_per_exchange"])
	require.Contains(t, byMode["raw"].Extra, "raw_payload_us")
}
