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

// TestExchangeJob runs `distbench exchange` under mpirun -n 2 (built with
// the mpi tag) on the host backend, a few repetitions: rank 0 prints one
// line per mode asked for, with the ratios against the baselines of the
// same run. Skipped where there is no Open MPI to build against or to
// launch with.
func TestExchangeJob(t *testing.T) {
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
	args := []string{"--oversubscribe"}
	if os.Getuid() == 0 {
		args = append(args, "--allow-run-as-root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpirun, append(args, "-n", "2", bin, "exchange", "-backend", "host",
		"-mode", "packed,perblock,raw", "-iters", "5", "-blocks", "50", "-block-bytes", "64")...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OMPI_") && !strings.HasPrefix(kv, "PMIX_") && !strings.HasPrefix(kv, "DISTBUF_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
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
