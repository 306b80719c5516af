package cli

import (
	"fmt"
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from linux/prctl.h.
const prSetChildSubreaper = 36

// becomeSubreaper marks this process a child subreaper: processes its
// command leaves behind (their parent exited) become its children rather
// than init's, so it can reap them before releasing the lock.
func becomeSubreaper() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", errno)
	}
	return nil
}

// selfExecutable is this very binary, even if its file was replaced or
// removed since it started.
func selfExecutable() (string, error) { return "/proc/self/exe", nil }

// groupMemberAttr starts a process in process group pgid, with SIGKILL as
// its parent-death signal.
func groupMemberAttr(pgid int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pgid: pgid, Pdeathsig: syscall.SIGKILL}
}
