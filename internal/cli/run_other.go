//go:build !linux

package cli

import (
	"os"
	"syscall"
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
