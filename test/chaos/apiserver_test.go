package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	restartedMu sync.Mutex
	// restarted is the kube-apiserver this suite started in place of the
	// one envtest started; TestMain kills it before stopping etcd.
	restarted *exec.Cmd
)

// restartAPIServer SIGKILLs the running kube-apiserver and starts it again
// with the same command line, then waits until it answers.
func restartAPIServer(t *testing.T) {
	t.Helper()
	pid, argv, err := findAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing kube-apiserver %d: %v", pid, err)
	}
	waitFor(t, 30*time.Second, "kube-apiserver to die", func() bool { return syscall.Kill(pid, 0) != nil || isZombie(pid) })
	time.Sleep(time.Second) // stay down a moment, as a crashed apiserver does; recovery is checked below
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	restartedMu.Lock()
	if restarted != nil {
		_ = restarted.Wait()
	}
	restarted = cmd
	restartedMu.Unlock()
	waitFor(t, time.Minute, "the restarted kube-apiserver to answer", func() bool {
		_, err := clientset.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil
	})
	t.Logf("kube-apiserver %d SIGKILLed and restarted as %d", pid, cmd.Process.Pid)
}

// stopRestartedAPIServer is called by TestMain before envtest stops etcd.
func stopRestartedAPIServer() {
	restartedMu.Lock()
	defer restartedMu.Unlock()
	if restarted != nil {
		_ = restarted.Process.Kill()
		_ = restarted.Wait()
	}
}

// findAPIServer finds the kube-apiserver process serving this suite: a
// child of this process (envtest's) or the one started by restartAPIServer.
func findAPIServer() (int, []string, error) {
	restartedMu.Lock()
	if restarted != nil {
		defer restartedMu.Unlock()
		return restarted.Process.Pid, restarted.Args, nil
	}
	restartedMu.Unlock()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, nil, err
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(argv[0]) != "kube-apiserver" || parentOf(pid) != self {
			continue
		}
		return pid, argv, nil
	}
	return 0, nil, fmt.Errorf("no kube-apiserver child of process %d found", self)
}

func parentOf(pid int) int {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name is in parentheses and may hold spaces; fields follow.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 2 {
		return -1
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

func isZombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}
