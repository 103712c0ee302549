package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// These tests launch whole jobs of ranktest under Open MPI's mpirun (built
// with the mpi tag), as a user would; they are skipped where there is no
// MPI to build against or to launch with.

// mpiJob builds ranktest with the mpi tag, once per test binary.
var mpiJob struct {
	bin, skip string
	flags     []string
}

func buildMPIRanktest(t *testing.T) (string, []string) {
	t.Helper()
	if mpiJob.bin == "" && mpiJob.skip == "" {
		mpiJob.skip = prepareMPIJob()
	}
	if mpiJob.skip != "" {
		t.Skip(mpiJob.skip)
	}
	return mpiJob.bin, mpiJob.flags
}

func prepareMPIJob() string {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		return "no mpirun on PATH"
	}
	if err := exec.Command("pkg-config", "--exists", "mpi").Run(); err != nil {
		return "pkg-config finds no MPI to build against"
	}
	version, _ := exec.Command(mpirun, "--version").CombinedOutput()
	if !bytes.Contains(version, []byte("Open MPI")) {
		return "the jobs use Open MPI's mpirun syntax (per-rank -x in MPMD form)"
	}
	dir, err := os.MkdirTemp("", "ranktest-job")
	if err != nil {
		return err.Error()
	}
	bin := filepath.Join(dir, "ranktest")
	if out, err := exec.Command("go", "build", "-tags", "mpi", "-o", bin, ".").CombinedOutput(); err != nil {
		return "go build -tags mpi: " + err.Error() + ": " + string(out)
	}
	mpiJob.bin = bin
	if os.Getuid() == 0 {
		mpiJob.flags = append(mpiJob.flags, "--allow-run-as-root")
	}
	mpiJob.flags = append(mpiJob.flags, "--oversubscribe")
	return ""
}

// runJob runs mpirun with args, under a limit, with the environment of this
// process minus what a launcher put there (a test binary may itself run
// under mpirun). It returns the output, the exit status and how long it
// took.
func runJob(t *testing.T, limit time.Duration, args ...string) (string, int, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mpirun", args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OMPI_") && !strings.HasPrefix(kv, "PMIX_") && !strings.HasPrefix(kv, "ORTE_") && !strings.HasPrefix(kv, "DISTBUF_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	require.NoError(t, ctx.Err(), "the job did not end within %v:\n%s", limit, out)
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return string(out), code, took
}

// TestJobEndsWhenOneRankFails: rank 2 of 4 runs out of its budget in its
// first solve while the others wait for it in an exchange. The job must end
// within seconds, non-zero, with rank 2's error.
func TestJobEndsWhenOneRankFails(t *testing.T) {
	bin, flags := buildMPIRanktest(t)
	args := append(append([]string(nil), flags...),
		"-n", "2", bin, "-iters", "3", ":",
		"-n", "1", "-x", "DISTBUF_ALLOC_CONF=limit:2MiB", bin, "-iters", "3", ":",
		"-n", "1", bin, "-iters", "3")
	out, code, took := runJob(t, 90*time.Second, args...)
	require.NotZero(t, code, "exit status of the job:\n%s", out)
	require.Less(t, took, 30*time.Second, "the job took %v to end:\n%s", took, out)
	require.Contains(t, out, "ranktest: rank 2: ", "the failing rank's error, naming it:\n%s", out)
	require.Contains(t, out, "out of memory", out)
	t.Logf("the job ended with status %d after %v", code, took.Round(time.Millisecond))
}

// TestJobRejectsDifferentSettings: ranks started with different -iters
// would wait for each other in different collectives; every rank reports
// the disagreement instead.
func TestJobRejectsDifferentSettings(t *testing.T) {
	bin, flags := buildMPIRanktest(t)
	args := append(append([]string(nil), flags...),
		"-n", "1", bin, "-iters", "3", ":", "-n", "1", bin, "-iters", "5")
	out, code, took := runJob(t, 90*time.Second, args...)
	require.NotZero(t, code, out)
	require.Less(t, took, 30*time.Second, out)
	require.Contains(t, out, "the ranks disagree on -iters: rank 0 has -iters 3, rank 1 has -iters 5", out)

	args = append(append([]string(nil), flags...),
		"-n", "1", bin, "-iters", "3", "-mode", "perblock", ":", "-n", "1", bin, "-iters", "3")
	out, code, _ = runJob(t, 90*time.Second, args...)
	require.NotZero(t, code, out)
	require.Contains(t, out, "the ranks disagree on -mode: rank 0 and rank 1 were started with different -mode", out)
}

// TestJobWarnsOfSharedGPUWithoutMPS: two ranks on the one device of the
// fake runtime are told that they share it without MPS, with what to do;
// where the device says MPS is on, nothing is said.
func TestJobWarnsOfSharedGPUWithoutMPS(t *testing.T) {
	bin, flags := buildMPIRanktest(t)
	nvrtc, cublas := cudarttest.BuildNVRTC(t), cudarttest.BuildCUBLAS(t)
	const warning = "ranktest: ranks 0, 1 share CUDA device 0 without MPS"
	for _, tc := range []struct {
		name    string
		defines []string
		warned  bool
	}{
		{"without MPS", nil, true},
		{"under MPS", []string{"FAKE_MPS_ENABLED=1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cudart := cudarttest.Build(t, tc.defines...)
			args := append(append([]string(nil), flags...), "-n", "2",
				"-x", "DISTBUF_CUDART="+cudart, "-x", "DISTBUF_NVRTC="+nvrtc, "-x", "DISTBUF_CUBLAS="+cublas,
				bin, "-backend", "cuda", "-iters", "2", "-blocks", "50")
			out, code, _ := runJob(t, 90*time.Second, args...)
			require.Zero(t, code, out)
			require.Equal(t, tc.warned, strings.Contains(out, warning), out)
			if tc.warned {
				require.Contains(t, out, "nvidia-cuda-mps-control -d", out)
				require.Equal(t, 1, strings.Count(out, "without MPS"), "once per node:\n%s", out)
			}
		})
	}
}

// TestJobSectors: the sectors workload under mpirun at 2 and 4 ranks, with
// the default threshold (every block in the tails at this m) and with big
// blocks: every H·psi block right, T2 exchanged between the ranks.
func TestJobSectors(t *testing.T) {
	bin, flags := buildMPIRanktest(t)
	for _, tc := range []struct {
		ranks int
		big   string
	}{{2, "1MiB"}, {4, "1MiB"}, {4, "2KiB"}} {
		t.Run(fmt.Sprintf("ranks=%d,big=%s", tc.ranks, tc.big), func(t *testing.T) {
			args := append(append([]string(nil), flags...), "-n", fmt.Sprint(tc.ranks), bin,
				"-backend", "host", "-workload", "sectors", "-m", "96", "-big-block", tc.big, "-iters", "6", "-bonds", "2", "-json")
			out, code, _ := runJob(t, 120*time.Second, args...)
			require.Zero(t, code, out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			var sum summary
			require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), out)
			require.True(t, sum.OK, out)
			require.Equal(t, tc.ranks, sum.Ranks)
			require.Zero(t, sum.VerifyFailures)
			require.Equal(t, "sectors", sum.Workload)
			require.Equal(t, 96, sum.M)
			require.Positive(t, sum.Messages, "T2 blocks travel between the ranks")
			require.Contains(t, out, "verification: 0 block(s) wrong")
		})
	}
}

// TestJobSectorsOutOfMemory: one rank of four cannot fit its first solve;
// the ranks agree on it before the exchange, and the job ends within
// seconds, non-zero, saying which rank ran out of memory.
func TestJobSectorsOutOfMemory(t *testing.T) {
	bin, flags := buildMPIRanktest(t)
	run := []string{"-backend", "host", "-workload", "sectors", "-m", "256", "-iters", "3"}
	args := append(append([]string(nil), flags...), "-n", "2", bin)
	args = append(append(args, run...), ":", "-n", "1", "-x", "DISTBUF_ALLOC_CONF=limit:256KiB", bin)
	args = append(append(args, run...), ":", "-n", "1", bin)
	args = append(args, run...)
	out, code, took := runJob(t, 90*time.Second, args...)
	require.NotZero(t, code, out)
	require.Less(t, took, 30*time.Second, "the job took %v to end:\n%s", took, out)
	require.Contains(t, out, "out of memory", out)
	require.Regexp(t, `ranktest: rank 2: solve 0: .*out of memory|rank 2 ran out of memory in this solve`, out)
}

// TestJobAgreesOnResolvedSettings: a rank given flags at their defaults
// agrees with ranks that left them out.
func TestJobAgreesOnResolvedSettings(t *testing.T) {
	bin, flags := buildMPIRanktest(t)
	args := append(append([]string(nil), flags...),
		"-n", "1", bin, "-iters", "2", "-mode", "packed", "-blocks", "2000", "-workload", "synthetic", ":",
		"-n", "1", bin, "-iters", "2")
	out, code, _ := runJob(t, 90*time.Second, args...)
	require.Zero(t, code, out)
	require.Contains(t, out, "0 block(s) wrong", out)
}

// stallJob runs a 4-rank job of ranktest with run's flags and
// DISTBUF_MSG_TIMEOUT=timeout on every rank, rank 2 started through a
// shell that writes its process id, and stops rank 2 (SIGSTOP) after
// once its process id has been known for after: for ever when resume is
// 0, else for resume. It
// returns the job's output and exit status, and how long the job ran on
// after the stop. Rank 2 is killed at the end of the test whatever
// happened, so that no stopped process outlives it.
func stallJob(t *testing.T, run []string, timeout, after, resume time.Duration) (string, int, time.Duration) {
	bin, flags := buildMPIRanktest(t)
	pidFile := filepath.Join(t.TempDir(), "rank2.pid")
	env := []string{"-x", "DISTBUF_MSG_TIMEOUT=" + timeout.String()}
	ctx := func(n int, cmd ...string) []string {
		return append(append(append([]string{"-n", strconv.Itoa(n)}, env...), cmd...), run...)
	}
	args := append(append([]string(nil), flags...), ctx(2, bin)...)
	args = append(append(args, ":"), ctx(1, "sh", "-c", `echo $$ > "$0"; exec "$@"`, pidFile, bin)...)
	args = append(append(args, ":"), ctx(1, bin)...)
	stopped := make(chan time.Time, 1)
	go func() {
		defer close(stopped)
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			b, err := os.ReadFile(pidFile)
			pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || perr != nil {
				continue
			}
			t.Cleanup(func() { killRank(pid, bin) })
			time.Sleep(after)
			if syscall.Kill(pid, syscall.SIGSTOP) != nil {
				return
			}
			stopped <- time.Now()
			if resume > 0 {
				time.Sleep(resume)
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
			return
		}
	}()
	out, code, _ := runJob(t, 120*time.Second, args...)
	end := time.Now()
	at, ok := <-stopped
	require.True(t, ok, "rank 2 was never stopped (the job ended first?):\n%s", out)
	return out, code, end.Sub(at)
}

// killRank kills process pid if it is still the rank that ran bin (a
// stopped process does not end by itself; a process id of one that ended
// may belong to another process by now).
func killRank(pid int, bin string) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err == nil && bytes.Contains(cmdline, []byte(bin)) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// TestJobEndsWhenOneRankStalls: rank 2 of 4 stops (SIGSTOP) for good in
// the middle of the solves, as a rank whose driver call hangs or whose
// node is lost would. With DISTBUF_MSG_TIMEOUT=T every collective and
// exchange the others wait in gives up within T and the agreement's
// grace: the job ends within T + 5 s of the stop, non-zero, with a
// message naming rank 2.
func TestJobEndsWhenOneRankStalls(t *testing.T) {
	const timeout = 3 * time.Second
	out, code, after := stallJob(t, []string{"-iters", "1000000", "-blocks", "200"}, timeout, 2*time.Second, 0)
	require.NotZero(t, code, out)
	require.Less(t, after, timeout+5*time.Second, "the job ran %v after rank 2 stopped:\n%s", after, out)
	require.Regexp(t, `not heard from ranks? (\d+, )*2( \(world [\d, ]+\))? of 4|message (from|to) rank 2 tag`, out, "the stalled rank is named")
	require.Regexp(t, "timed out|timeout|none for", out)
	t.Logf("the job ended with status %d, %v after the stop:\n%s", code, after.Round(time.Millisecond), out)
}

// TestJobSurvivesAShortStall: rank 2 of 4 stops for less than the
// timeout, early in the job; the job runs to its end as if nothing had
// happened.
func TestJobSurvivesAShortStall(t *testing.T) {
	out, code, after := stallJob(t, []string{"-iters", "6000", "-blocks", "200"}, 5*time.Second, 500*time.Millisecond, 2*time.Second)
	require.Zero(t, code, out)
	require.Greater(t, after, 2*time.Second, "the job outlived the stall:\n%s", out)
	require.Contains(t, out, "verification: 0 block(s) wrong", out)
}
