// Package controlplane starts a local etcd and kube-apiserver (the binaries
// hack/build-k8s-binaries.sh builds from Go modules) with the frontdesk CRD
// installed. The integration tests and the local quick-start command use it.
package controlplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Options configure Start.
type Options struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl. Empty means
	// $KUBEBUILDER_ASSETS, else bin/k8s under the repository root.
	AssetsDir string
	// CRDDir holds the CRD manifests. Empty means config/crd/bases under the
	// repository root.
	CRDDir string
	// KubeconfigPath, when set, is where an admin kubeconfig is written.
	KubeconfigPath string
	// Configure, when set, adjusts the environment just before it starts:
	// the fault suite uses it to make etcd one member of a cluster.
	Configure func(*envtest.Environment)
}

// ControlPlane is a running local etcd + kube-apiserver.
type ControlPlane struct {
	// Config is an admin rest.Config for the apiserver.
	Config *rest.Config
	// KubeconfigPath is the admin kubeconfig written by Start, if asked.
	KubeconfigPath string
	// AssetsDir is where the binaries were found.
	AssetsDir string

	env *envtest.Environment
}

// Start launches etcd and kube-apiserver and installs the CRDs. It fails
// with a clear message when the binaries have not been built.
func Start(opts Options) (*ControlPlane, error) {
	assets, err := Assets(opts.AssetsDir)
	if err != nil {
		return nil, err
	}
	crdDir := opts.CRDDir
	if crdDir == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		crdDir = filepath.Join(root, "config", "crd", "bases")
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        []string{crdDir},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	if opts.Configure != nil {
		opts.Configure(env)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting etcd and kube-apiserver from %s: %w", assets, err)
	}
	// Like ctrl.GetConfig: rely on the apiserver's priority and fairness
	// rather than client-side rate limiting.
	cfg.QPS = -1
	cp := &ControlPlane{Config: cfg, AssetsDir: assets, env: env}
	if opts.KubeconfigPath != "" {
		if err := os.WriteFile(opts.KubeconfigPath, env.KubeConfig, 0o600); err != nil {
			_ = env.Stop()
			return nil, fmt.Errorf("writing kubeconfig %s: %w", opts.KubeconfigPath, err)
		}
		cp.KubeconfigPath = opts.KubeconfigPath
	}
	return cp, nil
}

// EtcdURL is the client URL of the etcd behind the apiserver.
func (c *ControlPlane) EtcdURL() string {
	return c.env.ControlPlane.Etcd.URL.String()
}

// Stop shuts the apiserver and etcd down and removes their data.
func (c *ControlPlane) Stop() error {
	if err := c.env.Stop(); err != nil {
		return fmt.Errorf("stopping control plane: %w", err)
	}
	return nil
}

// Assets finds the directory with the control-plane binaries: dir, else
// $KUBEBUILDER_ASSETS, else bin/k8s under the repository root. It fails
// with a clear message when the binaries have not been built.
func Assets(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "k8s")
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("%s not found in %s: build the control-plane binaries with `make k8s-binaries` (hack/build-k8s-binaries.sh): %w",
				bin, dir, err)
		}
	}
	return filepath.Abs(dir)
}

// RepoRoot walks up from the working directory to the directory that holds
// the frontdesk go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "PROJECT")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding repository root: no directory above the working directory holds go.mod and PROJECT")
		}
		dir = parent
	}
}
