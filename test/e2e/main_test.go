//go:build e2e

// Package e2e runs frontdesk in a real Kubernetes cluster: a 3-node kind
// cluster (one control plane, two workers) created through the
// sigs.k8s.io/kind Go API from the node image that hack/kind builds with no
// container registry, with frontdesk's images assembled from its Go binaries
// (hack/kind/build-images.sh) and loaded into the nodes. TestMain builds the
// images (cached), creates the cluster once, deploys config/default and runs
// the tests; each test works in its own namespace and exports the logs of
// every node when it fails. Without a container engine it skips, with one
// line. Run it with `make test-e2e`; see docs/kind.md.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/kind/pkg/cluster"
	"sigs.k8s.io/kind/pkg/cmd"
	load "sigs.k8s.io/kind/pkg/cmd/kind/load/docker-image"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
)

const (
	clusterName = "frontdesk-e2e"
	managerNS   = "frontdesk-system"
	managerName = "frontdesk-controller-manager"
)

// Images, overridable for a run against images built elsewhere (for
// example by `make docker-build` where a registry is reachable).
var (
	nodeImage    = envOr("FRONTDESK_KIND_NODE_IMAGE", "")
	managerImage = envOr("FRONTDESK_E2E_MANAGER_IMAGE", "frontdesk-controller:e2e")
	// bundleImage is the manager's image in the committed dist/install.yaml.
	bundleImage = "frontdesk-controller:latest"
	pluginImage = envOr("FRONTDESK_E2E_PLUGIN_IMAGE", "frontdesk-kubectl-dlock:e2e")
	demoImage   = envOr("FRONTDESK_E2E_DEMO_IMAGE", "frontdesk-demo:e2e")
)

// The cluster every test uses; set up by TestMain.
var kc *kindCluster

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		fmt.Printf("skipping the kind e2e tests: no container engine (docker info: %v: %s)\n", err, errorLine(out))
		os.Exit(0)
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c, err := setUp(root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "setting up the kind cluster: %v\n", err)
		if c != nil {
			c.exportLogs("setup")
			c.tearDown()
		}
		os.Exit(1)
	}
	kc = c
	code := m.Run()
	c.tearDown()
	os.Exit(code)
}

// setUp builds the images (cached; cheap when nothing changed), creates the
// cluster, loads frontdesk's images into it and installs the bundles of
// dist/.
func setUp(root string) (*kindCluster, error) {
	logf("building the node image and frontdesk's images (cached under bin/kind)")
	args := []string{}
	if nodeImage != "" {
		args = append(args, nodeImage)
	}
	if err := runScript(root, "hack/kind/build-node-image.sh", nil, args...); err != nil {
		return nil, err
	}
	if nodeImage == "" {
		out, err := exec.Command("go", "list", "-C", filepath.Join(root, "hack", "kind"), "-m", "-f", "{{.Version}}", "k8s.io/kubernetes").Output()
		if err != nil {
			return nil, fmt.Errorf("reading the Kubernetes version of hack/kind: %w", err)
		}
		nodeImage = "frontdesk-kind-node:" + strings.TrimSpace(string(out))
	}
	if os.Getenv("FRONTDESK_E2E_MANAGER_IMAGE") == "" {
		if err := runScript(root, "hack/kind/build-images.sh", nil, managerImage, pluginImage, demoImage); err != nil {
			return nil, err
		}
	}

	if err := usePrivilegedShimIfNeeded(root); err != nil {
		return nil, err
	}

	c := &kindCluster{
		root:       root,
		provider:   cluster.NewProvider(),
		kubeconfig: filepath.Join(root, "bin", "e2e", "kubeconfig"),
		logDir:     filepath.Join(root, "bin", "e2e-logs"),
	}
	if err := os.MkdirAll(filepath.Dir(c.kubeconfig), 0o755); err != nil {
		return nil, err
	}
	// A cluster left behind by an interrupted run is deleted first.
	_ = c.provider.Delete(clusterName, c.kubeconfig)

	logf("creating kind cluster %s (%s): 1 control plane, 2 workers", clusterName, nodeImage)
	start := time.Now()
	if err := c.provider.Create(clusterName,
		cluster.CreateWithV1Alpha4Config(clusterConfig()),
		cluster.CreateWithNodeImage(nodeImage),
		cluster.CreateWithKubeconfigPath(c.kubeconfig),
		cluster.CreateWithWaitForReady(5*time.Minute),
		cluster.CreateWithDisplayUsage(false),
		cluster.CreateWithDisplaySalutation(false),
	); err != nil {
		return c, fmt.Errorf("creating kind cluster: %w", err)
	}
	logf("cluster up in %s", time.Since(start).Round(time.Second))
	if err := c.connect(); err != nil {
		return c, err
	}

	logf("loading %s, %s, %s into the nodes", managerImage, pluginImage, demoImage)
	if err := loadImages(managerImage, pluginImage, demoImage); err != nil {
		return c, err
	}

	// The install bundles are config/default in one file, and config/mutating
	// in another where the cluster serves MutatingAdmissionPolicy (make
	// verify checks both are current); only the manager's image is this
	// run's.
	bundles, err := c.bundles()
	if err != nil {
		return c, err
	}
	for _, b := range bundles {
		logf("installing %s", b)
		if out, err := c.applyBundle(b); err != nil {
			return c, fmt.Errorf("kubectl apply --server-side -f %s: %w\n%s", b, err, out)
		}
	}
	if out, err := c.kubectl("-n", managerNS, "rollout", "status", "deployment/"+managerName, "--timeout=3m"); err != nil {
		return c, fmt.Errorf("waiting for the manager: %w\n%s", err, out)
	}
	logf("setup done in %s", time.Since(start).Round(time.Second))
	return c, nil
}

// clusterConfig is one control plane and two workers; kube-proxy in
// nftables mode (its image carries nft, not iptables); the node lifecycle
// controller notices a lost node after 20s instead of 50s.
func clusterConfig() *v1alpha4.Cluster {
	cfg := &v1alpha4.Cluster{
		Nodes: []v1alpha4.Node{
			{Role: v1alpha4.ControlPlaneRole},
			{Role: v1alpha4.WorkerRole},
			{Role: v1alpha4.WorkerRole},
		},
		Networking: v1alpha4.Networking{KubeProxyMode: v1alpha4.NFTablesProxyMode},
		KubeadmConfigPatches: []string{`kind: ClusterConfiguration
controllerManager:
  extraArgs:
  - name: node-monitor-grace-period
    value: 20s
`},
	}
	v1alpha4.SetDefaultsCluster(cfg)
	return cfg
}

// usePrivilegedShimIfNeeded puts hack/kind/docker-shim first in PATH when
// this engine cannot start a privileged container (kind's nodes are
// privileged); see the shim for what it does instead.
func usePrivilegedShimIfNeeded(root string) error {
	out, err := exec.Command("docker", "run", "--rm", "--privileged", "--entrypoint", "/bin/true", nodeImage).CombinedOutput()
	if err == nil {
		return nil
	}
	if !strings.Contains(string(out), "unable to apply caps") {
		return fmt.Errorf("docker run --privileged %s: %w: %s", nodeImage, err, out)
	}
	shim := filepath.Join(root, "hack", "kind", "docker-shim")
	logf("this engine cannot start privileged containers (%s); kind's docker commands go through %s", errorLine(out), shim)
	return os.Setenv("PATH", shim+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// loadImages loads images from the engine into every node of the cluster.
func loadImages(images ...string) error {
	loader := load.NewCommand(cmd.NewLogger(), cmd.StandardIOStreams())
	loader.SetArgs(append(images, "--name", clusterName))
	if err := loader.Execute(); err != nil {
		return fmt.Errorf("loading images into kind: %w", err)
	}
	return nil
}

// runScript runs a script of the repository, with env added to the
// environment ("KEY=value").
func runScript(root, script string, env []string, args ...string) error {
	c := exec.Command(filepath.Join(root, script), args...)
	c.Dir = root
	c.Env = append(os.Environ(), env...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("%s: %w", script, err)
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func logf(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// errorLine picks the line of docker's output that says what is wrong.
func errorLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		if strings.Contains(strings.ToLower(l), "error") || strings.Contains(l, "Cannot connect") {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}
