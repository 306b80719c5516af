// Package chaos runs lock clients as real processes doing fenced increments
// on a ledger while faults are injected: a holder frozen past its lease, the
// manager killed (two replicas with leader election), the Lease deleted and
// edited by hand, a client cut off from the apiserver by a TCP proxy. After
// each scenario it checks the safety properties and a linearizability
// checker over the grant history. `make chaos` runs longer versions
// (FRONTDESK_CHAOS=long); `make test` runs the short ones.
package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
	testutil "github.com/frontdesk-dev/frontdesk/test/util"
)

var (
	cfg            *rest.Config
	k8sClient      client.Client
	clientset      kubernetes.Interface
	kubeconfigPath string
	workDir        string
	managers       [2]*process
	managerBinary  string
	long           = os.Getenv("FRONTDESK_CHAOS") == "long"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(runWorker())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if workDir, err = os.MkdirTemp("", "frontdesk-chaos-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)
	kubeconfigPath = filepath.Join(workDir, "kubeconfig")
	cp, err := controlplane.Start(controlplane.Options{KubeconfigPath: kubeconfigPath})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		stopRestartedAPIServer()
		_ = cp.Stop()
	}()
	cfg = cp.Config
	if k8sClient, err = client.New(cfg, client.Options{Scheme: manager.NewScheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	managerBinary = filepath.Join(workDir, "manager")
	if out, err := exec.Command("go", "build", "-o", managerBinary, root).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the manager: %v\n%s", err, out)
		return 1
	}
	for i := range managers {
		if managers[i], err = startManager(i); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	defer func() {
		for _, p := range managers {
			p.kill()
		}
	}()
	return m.Run()
}

// startManager runs replica i of the real manager binary, with leader
// election tuned so a standby takes over within a few seconds.
func startManager(i int) (*process, error) {
	return startProcess(fmt.Sprintf("manager-%d", i), []string{managerBinary,
		"--kubeconfig", kubeconfigPath, "--leader-elect", "--leader-election-namespace", "default",
		"--leader-election-id", "frontdesk-chaos", "--leader-election-lease-duration", "4s",
		"--leader-election-renew-deadline", "3s", "--leader-election-retry-period", "500ms",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, nil, io.Discard)
}

// process is a child process and the lines it printed.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu    sync.Mutex
	lines []string
}

func startProcess(name string, argv, env []string, stderr io.Writer) (*process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

func (p *process) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// scenario is one fault-injection run.
type scenario struct {
	workers    int
	increments int // accepted increments each worker must make
	perGrant   int
	hold       time.Duration // how long workers keep each grant after their increments
	ttl        int32
	// proxied workers reach the apiserver through a TCP proxy the fault
	// can cut.
	proxied bool
	// inject runs while the workers work; it returns once its faults are
	// over.
	inject func(t *testing.T, r *runState)
}

// runState is a scenario in progress.
type runState struct {
	ns      string
	lock    string
	ledger  *ledger
	workers []*process
	proxies []*proxy
	history *testutil.LeaseHistory
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "chaos-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// holderWorker returns the index of the worker process that holds the lock
// now (by the Lease's holder identity, whose pod part is the worker name),
// or -1.
func (r *runState) holderWorker() (int, int64) {
	lease, err := clientset.CoordinationV1().Leases(r.ns).Get(context.Background(), r.lock, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return -1, 0
	}
	name := locksv1alpha1.PodNameOf(*lease.Spec.HolderIdentity)
	for i, w := range r.workers {
		if w.name == name {
			return i, int64(*lease.Spec.LeaseTransitions)
		}
	}
	return -1, 0
}

// waitFor polls cond every 50ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
}

// parseEvents reads a worker's acquire/release/lost lines.
type workerEvent struct {
	kind         string
	call, ret    int64
	token        int64
	worker       int
	detail       string
	acceptedDone int
}

func parseEvents(worker int, lines []string) []workerEvent {
	var out []workerEvent
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		ev := workerEvent{kind: f[0], worker: worker}
		num := func(i int) int64 {
			if i >= len(f) {
				return 0
			}
			n, _ := strconv.ParseInt(f[i], 10, 64)
			return n
		}
		switch f[0] {
		case "acquire":
			ev.call, ev.ret, ev.token = num(1), num(2), num(3)
		case "release":
			ev.call, ev.ret = num(1), num(2)
		case "end":
			ev.call, ev.ret = num(1), num(1)
			ev.detail = strings.Join(f[2:], " ")
		case "done":
			ev.acceptedDone = int(num(1))
		default:
			continue
		}
		out = append(out, ev)
	}
	return out
}
