package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
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
	"k8s.io/client-go/kubernetes"
)

var (
	startedMu sync.Mutex
	// started are the control-plane processes this suite started itself
	// (restarted and second kube-apiservers, etcd members); TestMain kills
	// them before envtest stops its own.
	started []*exec.Cmd
)

// startTracked starts a control-plane process that killStarted will end.
// Its output is appended to <name>.log in the suite's work directory.
func startTracked(name string, argv []string) (*exec.Cmd, error) {
	log, err := os.OpenFile(filepath.Join(workDir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	defer log.Close() // the child holds its own descriptor
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(argv[0]), err)
	}
	startedMu.Lock()
	started = append(started, cmd)
	startedMu.Unlock()
	return cmd, nil
}

// killStarted kills and reaps every process startTracked started.
func killStarted() {
	startedMu.Lock()
	defer startedMu.Unlock()
	for _, cmd := range started {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	started = nil
}

// apiServer is a kube-apiserver process the suite can kill and start again
// with the same command line.
type apiServer struct {
	pid  int
	argv []string
	cmd  *exec.Cmd // nil while it is envtest's process
}

// portOf returns the port of an https://host:port address.
func portOf(host string) (string, error) {
	u, err := url.Parse(host)
	if err != nil {
		return "", fmt.Errorf("parsing apiserver address %q: %w", host, err)
	}
	return u.Port(), nil
}

// findAPIServer finds the kube-apiserver child of this process that serves
// on port.
func findAPIServer(port string) (*apiServer, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
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
		if filepath.Base(argv[0]) != "kube-apiserver" || parentOf(pid) != self || securePort(argv) != port {
			continue
		}
		a := &apiServer{pid: pid, argv: argv}
		startedMu.Lock()
		for _, cmd := range started {
			if cmd.Process.Pid == pid {
				a.cmd = cmd
			}
		}
		startedMu.Unlock()
		return a, nil
	}
	return nil, fmt.Errorf("no kube-apiserver child of process %d serves on port %s", self, port)
}

// securePortArg finds --secure-port in a kube-apiserver command line:
// argv[i] is prefix followed by the port, in either flag form. i is -1 if
// the flag is missing.
func securePortArg(argv []string) (i int, prefix string) {
	for i, a := range argv {
		if strings.HasPrefix(a, "--secure-port=") {
			return i, "--secure-port="
		}
		if a == "--secure-port" && i+1 < len(argv) {
			return i + 1, ""
		}
	}
	return -1, ""
}

// securePort reads --secure-port from a kube-apiserver command line.
func securePort(argv []string) string {
	i, prefix := securePortArg(argv)
	if i < 0 {
		return ""
	}
	return strings.TrimPrefix(argv[i], prefix)
}

// withPort is the same command line serving on another port: a second
// kube-apiserver sharing the first one's etcd, certificates and keys.
func (a *apiServer) withPort(port string) (*apiServer, error) {
	i, prefix := securePortArg(a.argv)
	if i < 0 {
		return nil, fmt.Errorf("no --secure-port in the kube-apiserver command line %q", a.argv)
	}
	argv := append([]string(nil), a.argv...)
	argv[i] = prefix + port
	return &apiServer{argv: argv}, nil
}

// kill SIGKILLs the apiserver and waits until it is gone.
func (a *apiServer) kill(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(a.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing kube-apiserver %d: %v", a.pid, err)
	}
	if a.cmd != nil {
		_ = a.cmd.Wait()
		return
	}
	waitFor(t, 30*time.Second, "kube-apiserver to die", func() bool { return syscall.Kill(a.pid, 0) != nil || isZombie(a.pid) })
}

// start runs the command line (again) and waits until it answers cs.
func (a *apiServer) start(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	cmd, err := startTracked("kube-apiserver-"+securePort(a.argv), a.argv)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd, a.pid = cmd, cmd.Process.Pid
	waitFor(t, time.Minute, "kube-apiserver to answer", func() bool {
		_, err := cs.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil
	})
}

// restartAPIServer SIGKILLs the cluster's kube-apiserver and starts it again
// with the same command line, then waits until it answers.
func restartAPIServer(t *testing.T, c *cluster) {
	t.Helper()
	port, err := portOf(c.cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	a, err := findAPIServer(port)
	if err != nil {
		t.Fatal(err)
	}
	old := a.pid
	a.kill(t)
	time.Sleep(time.Second) // stay down a moment, as a crashed apiserver does; recovery is checked below
	a.start(t, c.clientset)
	t.Logf("kube-apiserver %d SIGKILLed and restarted as %d", old, a.pid)
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
