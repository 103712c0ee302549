package mpitest

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Stop stops this rank for d, as the stall tests' faulty rank. With
// "sleep" the calling goroutine sleeps: the process runs on, MPI's own
// threads included, but nothing of the caller drives MPI. With "sigstop"
// the whole process stops (SIGSTOP), as a rank whose node stalls would,
// and a watcher process started first resumes it (SIGCONT) after d.
// Failures are reported with t.Errorf, so it may be called from any
// goroutine of the test.
func Stop(t testing.TB, how string, d time.Duration) {
	t.Helper()
	if how == "sleep" {
		time.Sleep(d)
		return
	}
	pid := os.Getpid()
	watcher := exec.Command("sh", "-c", fmt.Sprintf("sleep %.3f; kill -CONT %d", d.Seconds(), pid))
	if err := watcher.Start(); err != nil {
		t.Errorf("starting the watcher that resumes this rank: %v", err)
		return
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Errorf("SIGSTOP: %v", err)
	}
	if err := watcher.Wait(); err != nil {
		t.Errorf("the watcher that resumed this rank: %v", err)
	}
}
