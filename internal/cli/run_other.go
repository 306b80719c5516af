//go:build !linux

package cli

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// becomeSubreaper: only Linux has child subreapers. Elsewhere a process the
// command left behind in its group is still SIGKILLed, but init reaps it.
func becomeSubreaper() error { return nil }

// selfExecutable is the path this binary was started from.
func selfExecutable() (string, error) { return os.Executable() }

// groupMemberAttr starts a process in process group pgid. There is no
// parent-death signal outside Linux; the watchdog covers it.
func groupMemberAttr(pgid int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
}

// bootNow reads the watchdog's deadline clock: CLOCK_MONOTONIC, shared by
// all processes (there is no CLOCK_BOOTTIME outside Linux).
func bootNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return time.Duration(ts.Nano())
}
