// Package chaos runs lock clients as real processes doing fenced increments
// on a ledger while faults are injected: a holder frozen past its lease, the
// manager killed (two replicas with leader election), the Lease deleted and
// edited by hand, a client cut off from the apiserver by a TCP proxy. After
// each scenario it checks the safety properties and a linearizability
// checker over the grant history. `make chaos` runs longer versions
// (FRONTDESK_CHAOS=long); `make test` runs the short ones.
package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

var (
	// suite is the control plane most scenarios run on: one etcd, one
	// kube-apiserver, two manager replicas.
	suite         *cluster
	workDir       string
	managerBinary string
	long          = os.Getenv("FRONTDESK_CHAOS") == "long"
)

// cluster is a control plane, clients of it, and two replicas of the
// manager binary running against it.
type cluster struct {
	// name tells the manager replicas of different clusters apart.
	name string
	// kubeconfigPath is the admin kubeconfig managers, workers and the
	// checks use; it may point at a load balancer rather than an apiserver.
	kubeconfigPath string
	cfg            *rest.Config
	k8sClient      client.Client
	clientset      kubernetes.Interface
	managers       [2]*harness.Process
}

// newCluster builds the clients for the kubeconfig and starts the managers.
func newCluster(name, kubeconfig string) (*cluster, error) {
	c := &cluster{name: name, kubeconfigPath: kubeconfig}
	var err error
	if c.cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	c.cfg.QPS = -1
	if c.k8sClient, err = client.New(c.cfg, client.Options{Scheme: manager.NewScheme()}); err != nil {
		return nil, fmt.Errorf("client for %s: %w", kubeconfig, err)
	}
	if c.clientset, err = kubernetes.NewForConfig(c.cfg); err != nil {
		return nil, fmt.Errorf("clientset for %s: %w", kubeconfig, err)
	}
	for i := range c.managers {
		if c.managers[i], err = c.startManager(i); err != nil {
			c.stopManagers()
			return nil, fmt.Errorf("starting manager %d of cluster %s: %w", i, name, err)
		}
	}
	return c, nil
}

func (c *cluster) stopManagers() {
	for _, p := range c.managers {
		if p != nil {
			p.Kill()
		}
	}
}

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
	kubeconfig := filepath.Join(workDir, "kubeconfig")
	cp, err := controlplane.Start(controlplane.Options{KubeconfigPath: kubeconfig})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		killStarted() // a restarted kube-apiserver goes before envtest stops etcd
		_ = cp.Stop()
	}()
	root, err := controlplane.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	managerBinary = filepath.Join(workDir, "manager")
	build := exec.Command("go", "build", "-o", managerBinary, ".")
	build.Dir = root // with the root module's dependencies, as `make build`
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the manager: %v\n%s", err, out)
		return 1
	}
	if suite, err = newCluster("suite", kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer suite.stopManagers()
	return m.Run()
}

// startManager runs replica i of the real manager binary, with leader
// election tuned so a standby takes over within a few seconds.
func (c *cluster) startManager(i int) (*harness.Process, error) {
	return harness.StartProcess(fmt.Sprintf("%s-manager-%d", c.name, i), []string{managerBinary,
		"--kubeconfig", c.kubeconfigPath, "--leader-elect", "--leader-election-namespace", "default",
		"--leader-election-id", "frontdesk-chaos", "--leader-election-lease-duration", "4s",
		"--leader-election-renew-deadline", "3s", "--leader-election-retry-period", "500ms",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, nil, io.Discard)
}

// scenario is one fault-injection run.
type scenario struct {
	workers    int
	increments int // accepted increments each worker must make
	perGrant   int
	hold       time.Duration // how long workers keep each grant after their increments
	ttl        int32
	// cluster is where the scenario runs; nil means the suite's.
	cluster *cluster
	// tune, when set, adjusts worker i before it starts. By default every
	// worker gets the scenario's increments and hold and the cluster's
	// kubeconfig.
	tune func(t *testing.T, r *runState, i int, w *workerSpec)
	// inject runs while the workers work; it returns once its faults are
	// over.
	inject func(t *testing.T, r *runState)
}

// workerSpec is what one worker process is asked to do, and how it reaches
// the apiserver.
type workerSpec struct {
	kubeconfig string
	increments int
	hold       time.Duration
}

// runState is a scenario in progress.
type runState struct {
	c       *cluster
	ns      string
	lock    string
	ledger  *ledger
	workers []*harness.Process
	specs   []workerSpec
	proxies []*proxy
	history *harness.LeaseHistory
}

func newNamespace(t *testing.T, c *cluster) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "chaos-"}}
	if err := c.k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// createLockWithHistory creates the lock name in ns with a lease of ttl
// seconds, waits for the controller to create its Lease, and starts
// recording the Lease's history of grants. The caller stops the history.
func createLockWithHistory(t *testing.T, c *cluster, ns, name string, ttl int32) *harness.LeaseHistory {
	t.Helper()
	ctx := context.Background()
	if err := c.k8sClient.Create(ctx, testutil.MakeLock(name, ns).LeaseDuration(ttl).Obj()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the lock's Lease", func() bool {
		_, err := c.clientset.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil
	})
	history, err := harness.WatchLeaseHistory(ctx, c.clientset, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return history
}

// holderWorker returns the index of the worker process that holds the lock
// now (by the Lease's holder identity, whose pod part is the worker name),
// or -1.
func (r *runState) holderWorker() (int, int64) {
	lease, err := r.c.clientset.CoordinationV1().Leases(r.ns).Get(context.Background(), r.lock, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return -1, 0
	}
	name := locksv1alpha1.PodNameOf(*lease.Spec.HolderIdentity)
	for i, w := range r.workers {
		if w.Name == name {
			return i, int64(*lease.Spec.LeaseTransitions)
		}
	}
	return -1, 0
}

// waitFor polls cond every 50ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// poll is waitFor without the failure: it reports whether cond came true
// within timeout.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	return true
}

// finished reports whether worker i has made all its increments.
func (r *runState) finished(i int) bool {
	for _, ev := range parseEvents(i, r.workers[i].Output()) {
		if ev.kind == "done" {
			return true
		}
	}
	return false
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
			ev.call, ev.ret, ev.token = num(1), num(1), num(2)
			ev.detail = strings.Join(f[3:], " ")
		case "done":
			ev.acceptedDone = int(num(1))
		default:
			continue
		}
		out = append(out, ev)
	}
	return out
}
