//go:build !linux

package localrun

import "syscall"

// managerProcAttr puts the manager in its own process group. (Without
// Linux's parent-death signal, a manager whose frontdesk-local was killed
// with SIGKILL keeps running: stop it with the kill line printed at start.)
func managerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// startGuard does nothing here: without a parent-death signal, a
// frontdesk-local killed outright leaves etcd and kube-apiserver running,
// with the directories it printed at start.
func startGuard(dirs []string) (stop func()) { return func() {} }

// processesWith finds nothing without /proc.
func processesWith(dir string) []int { return nil }
