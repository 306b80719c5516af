package localrun

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// managerProcAttr puts the manager in its own process group and has the
// kernel send it SIGTERM if frontdesk-local dies without stopping it.
func managerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// guardScript runs until the kernel signals it that frontdesk-local died
// (SIGKILL, which nothing can catch): then it stops the processes in $1 and
// removes the directories in $2, what frontdesk-local would have done.
const guardScript = `trap 'kill -TERM $1 2>/dev/null
for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 $1 2>/dev/null || break; sleep 1; done
kill -KILL $1 2>/dev/null; rm -rf $2; exit 0' TERM
while :; do sleep 3600 & wait $!; done`

// startGuard starts a watcher that cleans up the control plane if
// frontdesk-local is killed outright. The etcd and kube-apiserver processes
// envtest started are found by the directories on their command lines. The
// returned stop ends the watcher without it doing anything.
func startGuard(dirs []string) (stop func()) {
	var pids []string
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		for _, pid := range processesWith(dir) {
			pids = append(pids, strconv.Itoa(pid))
		}
	}
	started := make(chan *exec.Cmd, 1)
	go func() {
		// The parent-death signal fires when the thread that started the
		// child ends: keep this goroutine on its thread while it runs.
		runtime.LockOSThread()
		cmd := exec.Command("/bin/sh", "-c", guardScript, "frontdesk-local-guard", strings.Join(pids, " "), strings.Join(dirs, " "))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		if cmd.Start() != nil {
			runtime.UnlockOSThread()
			started <- nil
			return
		}
		started <- cmd
		_ = cmd.Wait()
	}()
	cmd := <-started
	if cmd == nil {
		return func() {}
	}
	return func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}

// processesWith lists the processes with dir, or a path in it, among their
// arguments (etcd has --data-dir=DIR, kube-apiserver --cert-dir=DIR).
func processesWith(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && mentions(cmdline, dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mentions reports whether a NUL-separated command line has dir, or a path
// in it, as an argument or a flag's value (and not merely a longer name that
// starts the same).
func mentions(cmdline []byte, dir string) bool {
	for arg := range bytes.SplitSeq(cmdline, []byte{0}) {
		a := string(arg)
		if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") {
			a = v
		}
		if a == dir || strings.HasPrefix(a, dir+"/") {
			return true
		}
	}
	return false
}
