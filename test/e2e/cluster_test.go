//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kind/pkg/cluster"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// kindCluster is the cluster of this run and the clients to reach it.
type kindCluster struct {
	root       string
	provider   *cluster.Provider
	kubeconfig string
	logDir     string

	restConfig *rest.Config
	cs         kubernetes.Interface
	cl         client.Client
}

func (c *kindCluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", c.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	c.restConfig = cfg
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c.cl, err = client.New(cfg, client.Options{Scheme: scheme})
	return err
}

func (c *kindCluster) tearDown() {
	if os.Getenv("FRONTDESK_E2E_KEEP") != "" {
		logf("keeping kind cluster %s (FRONTDESK_E2E_KEEP): kubectl --kubeconfig %s", clusterName, c.kubeconfig)
		return
	}
	logf("deleting kind cluster %s", clusterName)
	_ = c.provider.Delete(clusterName, c.kubeconfig)
}

// exportLogs writes the logs of every node (kind's export: journal,
// kubelet, containerd, every container) and the cluster's objects into
// bin/e2e-logs/NAME.
func (c *kindCluster) exportLogs(name string) {
	dir := filepath.Join(c.logDir, regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(name, "_"))
	_ = os.RemoveAll(dir)
	logf("exporting the logs of every node to %s", dir)
	if err := c.provider.CollectLogs(clusterName, dir); err != nil {
		logf("exporting logs: %v", err)
	}
	if out, err := c.kubectl("get", "nodes,all,dlock,lease,events", "-A", "-o", "wide"); err == nil || out != "" {
		_ = os.WriteFile(filepath.Join(dir, "objects.txt"), []byte(out), 0o644)
	}
}

// kubectl runs bin/k8s/kubectl against the cluster.
func (c *kindCluster) kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.root, "bin", "k8s", "kubectl"), append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	cmd.Dir = c.root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// servesMutatingPolicies reports whether the cluster serves
// admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.36
// and later).
func (c *kindCluster) servesMutatingPolicies() (bool, error) {
	resources, err := c.cs.Discovery().ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1")
	if err != nil {
		return false, fmt.Errorf("discovering admissionregistration.k8s.io/v1: %w", err)
	}
	return slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Kind == "MutatingAdmissionPolicy" }), nil
}

// bundles are the install bundles of dist/ this cluster takes, as paths
// from the repository root: install.yaml, and install-mutating.yaml where
// the cluster serves MutatingAdmissionPolicy.
func (c *kindCluster) bundles() ([]string, error) {
	bundles := []string{"dist/install.yaml"}
	mutating, err := c.servesMutatingPolicies()
	if mutating {
		bundles = append(bundles, "dist/install-mutating.yaml")
	}
	return bundles, err
}

// applyBundle applies a bundle of dist/ with kubectl apply --server-side,
// the manager's image replaced with this run's.
func (c *kindCluster) applyBundle(path string) (string, error) {
	data, err := os.ReadFile(filepath.Join(c.root, path))
	if err != nil {
		return "", err
	}
	manifests := string(data)
	if strings.Contains(manifests, "kind: Deployment\n") {
		if !strings.Contains(manifests, "image: "+bundleImage+"\n") {
			return "", fmt.Errorf("%s does not name image %s: run make build-installer", path, bundleImage)
		}
		manifests = strings.ReplaceAll(manifests, "image: "+bundleImage+"\n", "image: "+managerImage+"\n        imagePullPolicy: Never\n")
	}
	return c.applyString(manifests)
}

func (c *kindCluster) applyString(manifests string) (string, error) {
	cmd := exec.Command(filepath.Join(c.root, "bin", "k8s", "kubectl"), "--kubeconfig", c.kubeconfig, "apply", "--server-side", "-f", "-")
	cmd.Dir = c.root
	cmd.Stdin = strings.NewReader(manifests)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// tc is one test's view of the cluster: its own namespace, and the logs of
// every node exported when it fails.
type tc struct {
	*testing.T
	*kindCluster
	ns  string
	ctx context.Context
}

// start gives a test its namespace (deleted at the end unless the test
// failed) and registers the log export.
func start(t *testing.T, prefix string) *tc {
	t.Helper()
	if kc == nil {
		t.Skip("no kind cluster")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ns, err := kc.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			kc.exportLogs(t.Name())
			return
		}
		_ = kc.cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	logf("%s: namespace %s", t.Name(), ns.Name)
	return &tc{T: t, kindCluster: kc, ns: ns.Name, ctx: ctx}
}

// stepf logs what the test is doing, with the time.
func (t *tc) stepf(format string, args ...any) {
	t.Logf("[%s] %s", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// apply applies manifests with NAMESPACE replaced by the test's namespace and
// the image placeholders by this run's images.
func (t *tc) apply(manifests string) {
	t.Helper()
	r := strings.NewReplacer("NAMESPACE", t.ns, "DEMO_IMAGE", demoImage, "PLUGIN_IMAGE", pluginImage)
	if out, err := t.applyString(r.Replace(manifests)); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

func (t *tc) applyFile(name string, replace ...string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(t.root, "test", "e2e", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.apply(strings.NewReplacer(replace...).Replace(string(data)))
}

func (t *tc) kubectlOK(args ...string) string {
	t.Helper()
	out, err := t.kubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// lock reads a DistributedLock of the test's namespace.
func (t *tc) lock(name string) (*locksv1alpha1.DistributedLock, error) {
	l := &locksv1alpha1.DistributedLock{}
	err := t.cl.Get(t.ctx, client.ObjectKey{Namespace: t.ns, Name: name}, l)
	return l, err
}

// pods lists the pods of the test's namespace with the label selector.
func (t *tc) pods(selector string) ([]corev1.Pod, error) {
	l, err := t.cs.CoreV1().Pods(t.ns).List(t.ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// exec runs a command in a pod's first container.
func (t *tc) exec(pod string, command ...string) (string, error) {
	return t.kubectl(append([]string{"-n", t.ns, "exec", pod, "--"}, command...)...)
}

// waitRollout waits for a deployment of the test's namespace.
func (t *tc) waitRollout(name string, timeout time.Duration) {
	t.Helper()
	t.kubectlOK("-n", t.ns, "rollout", "status", "deployment/"+name, "--timeout="+timeout.String())
}
