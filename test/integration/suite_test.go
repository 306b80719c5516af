// Package integration runs the real frontdesk manager against a real
// kube-apiserver backed by real etcd (built by hack/build-k8s-binaries.sh).
package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

var (
	// cfg is an admin config for the test apiserver.
	cfg *rest.Config
	// k8sClient reads and writes directly against the apiserver (no cache),
	// so assertions see what is stored in etcd.
	k8sClient client.Client
	// clientset is a plain client-go clientset, used to play lock clients.
	clientset kubernetes.Interface
	// kubeconfigPath is an admin kubeconfig for processes the tests start.
	kubeconfigPath string
	// metricsAddr is where the manager under test serves its metrics.
	metricsAddr string
	// assetsDir holds the etcd, kube-apiserver and kubectl the suite runs
	// ($KUBEBUILDER_ASSETS, else bin/k8s): the tests' kubectl is the one
	// built with the apiserver.
	assetsDir string
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		// Re-executed by a test as a separate lock-holding process.
		os.Exit(runWorker())
	}
	if os.Getenv(leaderWorkerEnv) != "" {
		// Re-executed as an operator process electing its leader.
		os.Exit(runLeaderWorker())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("FRONTDESK_TEST_LOGS") != "" {
		managerLog.out = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(managerLog), zap.UseDevMode(true)))

	tmp, err := os.MkdirTemp("", "frontdesk-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	kubeconfigPath = filepath.Join(tmp, "kubeconfig")

	start := time.Now()
	cp, err := controlplane.Start(controlplane.Options{KubeconfigPath: kubeconfigPath})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	fmt.Printf("control plane started in %s\n", time.Since(start).Round(time.Millisecond))
	cfg = cp.Config
	assetsDir = cp.AssetsDir

	if k8sClient, err = client.New(cfg, client.Options{Scheme: manager.NewScheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	if metricsAddr, err = freeLocalAddress(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := startManager(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := stopRunningManager(); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return m.Run()
}

// managerLog is where the manager's logs go (and every other logger's
// that logs through controller-runtime's): to stderr with
// FRONTDESK_TEST_LOGS, and to the tests that watch it.
var managerLog = &logTap{out: io.Discard}

// logTap writes each log entry to out and to its watchers.
type logTap struct {
	mu       sync.Mutex
	out      io.Writer
	watchers map[int]func(entry string)
	next     int
}

func (l *logTap) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.watchers {
		w(string(p))
	}
	return l.out.Write(p)
}

// watch calls fn with every log entry (zap writes one per Write) until
// the returned stop is called.
func (l *logTap) watch(fn func(entry string)) (stop func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watchers == nil {
		l.watchers = map[int]func(string){}
	}
	id := l.next
	l.next++
	l.watchers[id] = fn
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.watchers, id)
	}
}

// running is the manager under test, while it runs.
var running struct {
	cancel  context.CancelFunc
	stopped chan error
}

// startManager starts the real frontdesk manager in this process.
func startManager() error { return startManagerWith(cfg) }

// startManagerWith starts the real frontdesk manager with rc as its client
// config.
func startManagerWith(rc *rest.Config) error {
	ctx, cancel := context.WithCancel(context.Background())
	opts := manager.DefaultOptions()
	opts.MetricsBindAddress = metricsAddr
	opts.SecureMetrics = false
	opts.HealthProbeBindAddress = "0"
	opts.AllowSeveralInProcess = true // restarted by tests that need it down
	mgr, err := manager.New(ctx, rc, opts)
	if err != nil {
		cancel()
		return err
	}
	running.cancel, running.stopped = cancel, make(chan error, 1)
	go func() { running.stopped <- mgr.Start(ctx) }()
	return nil
}

// stopRunningManager stops the manager and waits until it has.
func stopRunningManager() error {
	if running.cancel == nil {
		return nil
	}
	running.cancel()
	err := <-running.stopped
	running.cancel = nil
	return err
}

// withManagerStopped stops the manager for the rest of the test and starts
// a fresh one (empty memory, like a restarted process) when it ends.
func withManagerStopped(t *testing.T) {
	t.Helper()
	if err := stopRunningManager(); err != nil {
		t.Fatalf("stopping the manager: %v", err)
	}
	t.Cleanup(func() {
		if err := startManager(); err != nil {
			t.Fatalf("restarting the manager: %v", err)
		}
	})
}

// withManagerThrough runs, for the rest of the test, a fresh manager whose
// requests go through tap, and the usual one again when the test ends.
func withManagerThrough(t *testing.T, tap *harness.Tap) {
	t.Helper()
	withManagerStopped(t)
	rc := restConfig()
	rc.ContentType = "application/json" // so the test can read what it wrote
	rc.WrapTransport = tap.Wrap
	if err := startManagerWith(rc); err != nil {
		t.Fatalf("starting a manager through a tap: %v", err)
	}
	t.Cleanup(func() {
		if err := stopRunningManager(); err != nil {
			t.Errorf("stopping the tapped manager: %v", err)
		}
	}) // runs before withManagerStopped's cleanup starts the usual one
}

// freeLocalAddress returns a loopback address with a port free right now.
func freeLocalAddress() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// restConfig is a copy of the admin config, for clients a test builds.
func restConfig() *rest.Config {
	return rest.CopyConfig(cfg)
}

// newNamespace creates a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "dlock-test-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}
