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
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		// Re-executed by a test as a separate lock-holding process.
		os.Exit(runWorker())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var logOut io.Writer = io.Discard
	if os.Getenv("FRONTDESK_TEST_LOGS") != "" {
		logOut = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logOut), zap.UseDevMode(true)))

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

	if k8sClient, err = client.New(cfg, client.Options{Scheme: manager.NewScheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	ctx, cancel := context.WithCancel(context.Background())
	opts := manager.DefaultOptions()
	if metricsAddr, err = freeLocalAddress(); err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts.MetricsBindAddress = metricsAddr
	opts.SecureMetrics = false
	opts.HealthProbeBindAddress = "0"
	mgr, err := manager.New(ctx, cfg, opts)
	if err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-stopped; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return m.Run()
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
