package localrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
)

var (
	buildOnce            sync.Once
	buildErr             error
	managerBin, localBin string
)

// binaries builds the manager and frontdesk-local once per test run.
func binaries(t *testing.T) (mgr, local string) {
	t.Helper()
	buildOnce.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "frontdesk-localrun-test-")
		if err != nil {
			buildErr = err
			return
		}
		managerBin, localBin = filepath.Join(dir, "manager"), filepath.Join(dir, "frontdesk-local")
		for _, b := range [][2]string{{managerBin, "."}, {localBin, "./cmd/frontdesk-local"}} {
			cmd := exec.Command("go", "build", "-o", b[0], b[1])
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %w\n%s", b[1], err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return managerBin, localBin
}

func TestMain(m *testing.M) {
	log.SetLogger(logr.Discard())
	code := m.Run()
	if managerBin != "" {
		_ = os.RemoveAll(filepath.Dir(managerBin))
	}
	os.Exit(code)
}

func sample(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "config", "samples", "locks_v1alpha1_distributedlock.yaml")
}

// quickStart is what frontdesk-local printed about the processes it runs.
type quickStart struct {
	etcdDir, apiserverDir string
	managerPID            int
	managerCommand        string
}

var (
	dirsLine    = regexp.MustCompile(`control plane: etcd data in (\S+), kube-apiserver certificates in (\S+)\n`)
	managerLine = regexp.MustCompile(`runs as its own process \(pid (\d+)\).*\n.*\n\n  kill (\d+)\n  (.+)\n`)
)

// parseQuickStart reads the directories, the manager's pid and its command
// line from frontdesk-local's output.
func parseQuickStart(t *testing.T, out string) quickStart {
	t.Helper()
	var q quickStart
	m := dirsLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no control plane directories in the output:\n%s", out)
	}
	q.etcdDir, q.apiserverDir = m[1], m[2]
	m = managerLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no manager process (pid, kill line, command) in the output:\n%s", out)
	}
	q.managerPID, _ = strconv.Atoi(m[1])
	if m[2] != m[1] {
		t.Errorf("kill line names pid %s, the manager is pid %s", m[2], m[1])
	}
	q.managerCommand = m[3]
	return q
}

// processesMentioning lists the pids of processes with dir among their
// arguments (etcd has its data directory, kube-apiserver its certificate one).
func processesMentioning(t *testing.T, dir string) []int {
	t.Helper()
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skipf("no /proc to look for leftover processes: %v", err)
	}
	var pids []int
	for _, pid := range processesWith(dir) {
		if pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// running reports whether a process with pid exists (and is not a zombie).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	// pid (comm) state ...: a zombie has exited.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// leftovers says what is left of a quick start ("" when nothing is).
func leftovers(t *testing.T, q quickStart) string {
	t.Helper()
	var left []string
	for _, dir := range []string{q.etcdDir, q.apiserverDir} {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			left = append(left, fmt.Sprintf("%s is still there (stat: %v)", dir, err))
		}
		if pids := processesMentioning(t, dir); len(pids) > 0 {
			left = append(left, fmt.Sprintf("processes %v still use %s", pids, dir))
		}
	}
	if q.managerPID != 0 && running(q.managerPID) {
		left = append(left, fmt.Sprintf("the manager (pid %d) still runs", q.managerPID))
	}
	return strings.Join(left, "; ")
}

// assertCleanedUp checks that nothing of the quick start is left: no etcd,
// kube-apiserver or manager process, no temporary directories.
func assertCleanedUp(t *testing.T, q quickStart) {
	t.Helper()
	if left := leftovers(t, q); left != "" {
		t.Error(left)
	}
}

// killLeftovers kills whatever a failed test left running of a quick start.
func killLeftovers(t *testing.T, q *quickStart, output string) {
	if q.etcdDir == "" {
		if m := dirsLine.FindStringSubmatch(output); m != nil {
			q.etcdDir, q.apiserverDir = m[1], m[2]
		}
	}
	if q.managerPID == 0 {
		if m := managerLine.FindStringSubmatch(output); m != nil {
			q.managerPID, _ = strconv.Atoi(m[1])
		}
	}
	for _, dir := range []string{q.etcdDir, q.apiserverDir} {
		if dir == "" {
			continue
		}
		for _, pid := range processesMentioning(t, dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = os.RemoveAll(dir)
	}
	if q.managerPID != 0 {
		_ = syscall.Kill(q.managerPID, syscall.SIGKILL)
	}
}

// poll calls fn until it returns nil or timeout passes.
func poll(t *testing.T, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The README's quick start, end to end: a real control plane, the manager
// (a child process), the sample applied and `kubectl get distributedlocks`
// showing it Ready; then everything stopped and removed.
func TestQuickStartShowsSampleLock(t *testing.T) {
	mgr, _ := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := Run(ctx, Options{
		SamplePaths:        []string{sample(t)},
		Namespace:          "default",
		KubeconfigPath:     filepath.Join(t.TempDir(), "kubeconfig"),
		MetricsBindAddress: "0",
		ManagerBinary:      mgr,
		ExitWhenReady:      true,
	}, &out)
	text := out.String()
	if err != nil {
		t.Fatalf("quick start failed: %v\noutput:\n%s", err, text)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`kubectl --kubeconfig /\S+ get distributedlocks -n default`),
		regexp.MustCompile(`NAME\s+HOLDER\s+TOKEN\s+HELD\s+LEASE\s+ACQUIRED\s+WAITING\s+READY\s+LEASENAME\s+POD\s+AGE`),
		regexp.MustCompile(`(?m)^billing\s+0\s+False\s+15\s+True\s+billing\s+\d+s$`), // no holder, token 0, 15s lease, Ready
		regexp.MustCompile(`\n  ` + regexp.QuoteMeta(mgr) + ` --kubeconfig /\S+ --metrics-bind-address=0 `),
		// What config/default installs for the users of locks, accepted by
		// the apiserver.
		regexp.MustCompile(`installed from config/default: .*\bClusterRole frontdesk-lock-user\b`),
		regexp.MustCompile(`installed from config/default: .*\bClusterRole frontdesk-lock-admin\b`),
		regexp.MustCompile(`installed from config/default: .*\bValidatingAdmissionPolicy frontdesk-lease-guard\b`),
		regexp.MustCompile(`installed from config/default: .*\bValidatingAdmissionPolicyBinding frontdesk-lease-guard\b`),
		regexp.MustCompile(`installed from config/default: .*\bValidatingAdmissionPolicy frontdesk-lease-delete-guard\b`),
		regexp.MustCompile(`installed from config/default: .*\bValidatingAdmissionPolicy frontdesk-lease-token-guard\b`),
		// What does not run here, and what that means for pods and CronJobs.
		regexp.MustCompile(`no kubelet, kube-scheduler or\s+kube-controller-manager runs`),
		regexp.MustCompile(`pods are stored but never scheduled nor started: they stay Pending`),
		regexp.MustCompile(`CronJobs no Jobs`),
	} {
		if !want.MatchString(text) {
			t.Errorf("output does not match %s:\n%s", want, text)
		}
	}
	q := parseQuickStart(t, text)
	if q.managerPID == os.Getpid() {
		t.Errorf("the manager runs in the quick start's own process")
	}
	assertCleanedUp(t, q)
}

// localRun is frontdesk-local running as a process, as `make local` runs it.
type localRun struct {
	cmd    *exec.Cmd
	out    *os.File
	exited chan error
}

func startLocal(t *testing.T, args ...string) *localRun {
	t.Helper()
	mgr, local := binaries(t)
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = out.Close() })
	full := append([]string{"--manager", mgr, "--build-manager=false", "--kubeconfig-out", filepath.Join(dir, "kubeconfig"),
		"--metrics-bind-address", "0"}, args...)
	cmd := exec.Command(local, full...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &localRun{cmd: cmd, out: out, exited: make(chan error, 1)}
	go func() { l.exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return l
}

func (l *localRun) output() string {
	b, _ := os.ReadFile(l.out.Name())
	return string(b)
}

func (l *localRun) waitFor(t *testing.T, timeout time.Duration, text string) {
	t.Helper()
	poll(t, timeout, "waiting for "+strconv.Quote(text), func() error {
		if strings.Contains(l.output(), text) {
			return nil
		}
		select {
		case err := <-l.exited:
			l.exited <- err
			return fmt.Errorf("frontdesk-local exited (%v):\n%s", err, l.output()) //nolint:errorlint // err is nil after a clean exit; %w would print %!w(<nil>)
		default:
			return errors.New("not yet")
		}
	})
}

// waitExit waits for frontdesk-local to exit and returns its exit status.
func (l *localRun) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case err := <-l.exited:
		if exit, ok := errors.AsType[*exec.ExitError](err); ok {
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(timeout):
		t.Fatalf("frontdesk-local did not exit within %s:\n%s", timeout, l.output())
		return -1
	}
}

func clientFor(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: manager.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func lockReady(c client.Client, name string) error {
	lock := &locksv1alpha1.DistributedLock{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, lock); err != nil {
		return err
	}
	if !meta.IsStatusConditionTrue(lock.Status.Conditions, locksv1alpha1.ConditionReady) {
		return fmt.Errorf("lock %s not Ready: %+v", name, lock.Status.Conditions)
	}
	return nil
}

// `make local`: the manager is a process of its own. Killed, it takes
// nothing with it: the control plane keeps serving, the command printed to
// restart it works, and Ctrl-C then stops the control plane and removes its
// directories at once, also while the manager started by hand still runs
// (its open watches held kube-apiserver's shutdown for its request timeout,
// 60 s, until the stop timeout SIGKILLed it and frontdesk-local exited 1).
func TestLocalManagerCanBeKilledAndRestarted(t *testing.T) {
	l := startLocal(t, "--sample", sample(t))
	q := &quickStart{}
	t.Cleanup(func() { killLeftovers(t, q, l.output()) })
	l.waitFor(t, 3*time.Minute, "press Ctrl-C to stop")
	*q = parseQuickStart(t, l.output())
	kubeconfig := regexp.MustCompile(`--kubeconfig (\S+)`).FindStringSubmatch(q.managerCommand)[1]

	if err := syscall.Kill(q.managerPID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the manager: %v", err)
	}
	l.waitFor(t, 30*time.Second, fmt.Sprintf("the frontdesk manager (pid %d) exited: signal: killed", q.managerPID))
	select {
	case err := <-l.exited:
		t.Fatalf("frontdesk-local exited with its manager (%v):\n%s", err, l.output())
	default:
	}
	c := clientFor(t, kubeconfig)
	if err := lockReady(c, "billing"); err != nil {
		t.Fatalf("the control plane does not serve after the manager was killed: %v", err)
	}
	for _, dir := range []string{q.etcdDir, q.apiserverDir} {
		if pids := processesMentioning(t, dir); len(pids) == 0 {
			t.Errorf("nothing runs with %s after the manager was killed", dir)
		}
	}

	// Start it again, by hand, with the printed command.
	restarted := exec.Command("sh", "-c", "exec "+q.managerCommand)
	var logs bytes.Buffer
	restarted.Stdout, restarted.Stderr = &logs, &logs
	restarted.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := restarted.Start(); err != nil {
		t.Fatalf("running the printed command %q: %v", q.managerCommand, err)
	}
	restartedDone := make(chan struct{})
	var restartedErr error
	go func() { restartedErr = restarted.Wait(); close(restartedDone) }()
	defer func() {
		_ = syscall.Kill(-restarted.Process.Pid, syscall.SIGKILL)
		<-restartedDone
	}()
	lock := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "after-restart", Namespace: "default"}}
	if err := c.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the restarted manager reconciling a new lock", func() error {
		select {
		case <-restartedDone:
			return fmt.Errorf("the restarted manager exited (%v):\n%s", restartedErr, logs.String()) //nolint:errorlint // nil after a clean exit; %w would print %!w(<nil>)
		default:
		}
		return lockReady(c, "after-restart")
	})
	// Ctrl-C, with the manager started by hand still running.
	ctrlC := time.Now()
	if err := l.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := l.waitExit(t, time.Minute); code != 0 {
		t.Errorf("frontdesk-local exited %d after Ctrl-C:\n%s", code, l.output())
	}
	took := time.Since(ctrlC)
	t.Logf("Ctrl-C with a manager started by hand running: frontdesk-local exited after %s", took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("Ctrl-C took %s to stop the control plane (a manager started by hand was connected):\n%s", took, l.output())
	}
	for _, want := range []string{"stopped; removed " + q.etcdDir + " and " + q.apiserverDir,
		"a frontdesk manager you started by hand is not stopped here: stop it yourself"} {
		if !strings.Contains(l.output(), want) {
			t.Errorf("no word of %q:\n%s", want, l.output())
		}
	}
	assertCleanedUp(t, *q)
	_ = syscall.Kill(-restarted.Process.Pid, syscall.SIGTERM)
	select {
	case <-restartedDone:
	case <-time.After(30 * time.Second):
		t.Errorf("the restarted manager did not stop on SIGTERM")
	}
}

// SIGTERM while everything runs stops the manager, kube-apiserver and etcd,
// and removes their directories.
func TestLocalStopsEverythingOnSIGTERM(t *testing.T) {
	l := startLocal(t, "--sample", sample(t))
	q := &quickStart{}
	t.Cleanup(func() { killLeftovers(t, q, l.output()) })
	l.waitFor(t, 3*time.Minute, "press Ctrl-C to stop")
	*q = parseQuickStart(t, l.output())
	if !running(q.managerPID) {
		t.Fatalf("the manager (pid %d) does not run", q.managerPID)
	}
	if err := l.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := l.waitExit(t, time.Minute); code != 0 {
		t.Errorf("frontdesk-local exited %d after SIGTERM:\n%s", code, l.output())
	}
	assertCleanedUp(t, *q)
}

// An error after the control plane started (here a sample the apiserver
// refuses) stops it all too, and exits non-zero saying why.
func TestLocalStopsEverythingOnError(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(`apiVersion: locks.frontdesk.dev/v1alpha1
kind: DistributedLock
metadata:
  name: bad
spec:
  leaseDurationSeconds: 0
`), 0o600); err != nil {
		t.Fatal(err)
	}
	l := startLocal(t, "--sample", bad)
	q := &quickStart{}
	t.Cleanup(func() { killLeftovers(t, q, l.output()) })
	code := l.waitExit(t, 3*time.Minute)
	out := l.output()
	*q = parseQuickStart(t, out)
	if code != 1 {
		t.Errorf("exit status %d, want 1:\n%s", code, out)
	}
	if !strings.Contains(out, "frontdesk-local: applying samples:") {
		t.Errorf("the error does not say what failed:\n%s", out)
	}
	assertCleanedUp(t, *q)
}

// Killed outright (SIGKILL: no handler runs), frontdesk-local still leaves
// nothing behind: the manager ends by its parent-death signal, and a guard
// process stops etcd and kube-apiserver and removes their directories.
func TestLocalKilledOutrightLeavesNothingBehind(t *testing.T) {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("the parent-death signal this relies on is Linux-only")
	}
	l := startLocal(t, "--sample", sample(t))
	q := &quickStart{}
	t.Cleanup(func() { killLeftovers(t, q, l.output()) })
	l.waitFor(t, 3*time.Minute, "press Ctrl-C to stop")
	*q = parseQuickStart(t, l.output())
	if err := l.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if code := l.waitExit(t, 10*time.Second); code != -1 {
		t.Fatalf("frontdesk-local was not killed (exit status %d)", code)
	}
	poll(t, 30*time.Second, "cleaning up after a killed frontdesk-local", func() error {
		if left := leftovers(t, *q); left != "" {
			return errors.New(left)
		}
		return nil
	})
}

func TestMentionsMatchesWholeDirectories(t *testing.T) {
	etcd := []byte("/bin/etcd\x00--data-dir=/tmp/k8s_test_framework_12\x00--unsafe-no-fsync=true\x00")
	apiserver := []byte("/bin/kube-apiserver\x00--cert-dir=/tmp/k8s_test_framework_7\x00--client-ca-file=/tmp/k8s_test_framework_7/ca.crt\x00")
	for _, tc := range []struct {
		cmdline []byte
		dir     string
		want    bool
	}{
		{etcd, "/tmp/k8s_test_framework_12", true},
		{etcd, "/tmp/k8s_test_framework_1", false}, // another control plane's directory
		{etcd, "/tmp/k8s_test_framework_123", false},
		{apiserver, "/tmp/k8s_test_framework_7", true},
		{apiserver, "/tmp/k8s_test_framework_", false},
	} {
		if got := mentions(tc.cmdline, tc.dir); got != tc.want {
			t.Errorf("mentions(%q, %q) = %v, want %v", tc.cmdline, tc.dir, got, tc.want)
		}
	}
}

func TestShellJoinQuotesWhatAShellWouldSplit(t *testing.T) {
	got := shellJoin([]string{"/work/bin/manager", "--kubeconfig", "/home/a b/kc", "--metrics-bind-address=127.0.0.1:8080", "it's", ""})
	want := `/work/bin/manager --kubeconfig '/home/a b/kc' --metrics-bind-address=127.0.0.1:8080 'it'\''s' ''`
	if got != want {
		t.Errorf("shellJoin = %s, want %s", got, want)
	}
	out, err := exec.Command("sh", "-c", "printf '%s|' "+got).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "/work/bin/manager|--kubeconfig|/home/a b/kc|--metrics-bind-address=127.0.0.1:8080|it's||" {
		t.Errorf("a shell splits it as %q", out)
	}
}
