package peermem

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// process_vm_readv's number, which the syscall package lacks on some
// architectures; 0 where this file does not know it, and reads are off.
var sysProcessVMReadv = map[string]uintptr{"amd64": 310, "arm64": 270, "riscv64": 270, "ppc64le": 351, "s390x": 340, "loong64": 270}[runtime.GOARCH]

type iovec struct {
	base uintptr
	len  uint64
}

// Unavailable says why this process cannot read its peers' memory, ""
// when it can try.
func Unavailable() string {
	if sysProcessVMReadv == 0 {
		return "process_vm_readv is not known on " + runtime.GOARCH
	}
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && len(b) > 0 && b[0] >= '2' {
		return "Yama's ptrace_scope is " + string(b[:1]) + ": only an administrator's processes may read others'"
	}
	// One read of this process's own memory: a seccomp filter that
	// refuses the call refuses it here too.
	p := NewProbe()
	defer p.Close()
	if err := CheckProbe(os.Getpid(), p.Addr(), p.Value()); err != nil {
		return fmt.Sprintf("process_vm_readv of this process's own memory: %v", err)
	}
	return ""
}

// AllowReaders lets any process of this user read this one's memory, as
// Open MPI's single-copy transport does: under Yama's ptrace_scope 1 a
// process may otherwise be read only by its ancestors. Without Yama the
// call fails harmlessly.
func AllowReaders() {
	const prSetPtracer, prSetPtracerAny = 0x59616d61, ^uintptr(0)
	_, _, _ = syscall.RawSyscall6(syscall.SYS_PRCTL, prSetPtracer, prSetPtracerAny, 0, 0, 0, 0)
}

// Read copies n bytes at remote in process pid to local, in this process.
// A partial read is continued; a range the peer has not mapped is an
// error matching IsFault. local stays a pointer until the call, so that Go
// memory there is kept and followed if its stack moves.
func Read(pid int, local unsafe.Pointer, remote uintptr, n int64) error {
	if sysProcessVMReadv == 0 {
		return ErrUnavailable
	}
	for done := int64(0); done < n; {
		l := iovec{uintptr(unsafe.Add(local, done)), uint64(n - done)}
		r := iovec{remote + uintptr(done), uint64(n - done)}
		got, _, errno := syscall.Syscall6(sysProcessVMReadv, uintptr(pid), uintptr(unsafe.Pointer(&l)), 1, uintptr(unsafe.Pointer(&r)), 1, 0)
		runtime.KeepAlive(local)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return errno
		case got == 0:
			return errors.New("process_vm_readv read nothing")
		}
		done += int64(got)
	}
	return nil
}

// IsFault reports whether err says the remote range is not mapped in the
// peer (EFAULT): the peer named memory it does not have.
func IsFault(err error) bool { return errors.Is(err, syscall.EFAULT) }
