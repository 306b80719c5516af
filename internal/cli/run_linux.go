package cli

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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

// bootNow reads the watchdog's deadline clock: CLOCK_BOOTTIME, which,
// unlike the Go runtime's monotonic clock, keeps counting while the
// machine is suspended.
func bootNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_BOOTTIME): %v", err))
	}
	return time.Duration(ts.Nano())
}
