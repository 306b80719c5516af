// Package localrun is the quick start: a local control plane with the CRD
// installed, the frontdesk manager running against it, and sample locks
// applied, so a user can try frontdesk with nothing but Go installed.
package localrun

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/internal/manifests"
)

// Options configure Run.
type Options struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl (see controlplane).
	AssetsDir string
	// SamplePaths are YAML files of objects to apply once the manager runs.
	SamplePaths []string
	// Namespace is where namespaced samples without a namespace go.
	Namespace string
	// KubeconfigPath is where the admin kubeconfig is written.
	KubeconfigPath string
	// MetricsBindAddress serves the manager's metrics (plain HTTP); "0" disables.
	MetricsBindAddress string
	// ExitWhenReady stops everything once the samples are Ready, after
	// printing what `kubectl get distributedlocks` shows (used by tests).
	ExitWhenReady bool
}

// Run starts the control plane and the manager, applies the samples, waits
// until they are Ready, prints how to look at them, and then serves until
// ctx ends (or returns at once with ExitWhenReady).
func Run(ctx context.Context, opts Options, out io.Writer) error {
	kubeconfig, err := filepath.Abs(opts.KubeconfigPath)
	if err != nil {
		return fmt.Errorf("resolving kubeconfig path: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(kubeconfig), 0o755); err != nil {
		return fmt.Errorf("creating kubeconfig directory: %w", err)
	}
	fmt.Fprintln(out, "starting etcd, kube-apiserver and the frontdesk manager ...")
	env, err := StartEnvironment(ctx, EnvironmentOptions{
		AssetsDir: opts.AssetsDir, KubeconfigPath: kubeconfig, MetricsBindAddress: opts.MetricsBindAddress})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping the manager and the control plane")
		_ = env.Stop()
	}()
	cp := env.ControlPlane
	fmt.Fprintln(out, "frontdesk manager running")

	names, err := applySamples(ctx, env.Client, opts.SamplePaths, opts.Namespace)
	if err != nil {
		return err
	}
	if err := env.WaitReady(ctx, opts.Namespace, names); err != nil {
		return err
	}

	kubectl := filepath.Join(cp.AssetsDir, "kubectl")
	getLine := fmt.Sprintf("%s --kubeconfig %s get distributedlocks -n %s", kubectl, cp.KubeconfigPath, opts.Namespace)
	fmt.Fprintf(out, "\nlocks applied and Ready: %v\nlook at them with:\n\n  %s\n\n", names, getLine)
	if opts.ExitWhenReady {
		return printKubectl(ctx, out, kubectl, cp.KubeconfigPath, opts.Namespace)
	}
	fmt.Fprintln(out, "press Ctrl-C to stop")
	select {
	case <-ctx.Done():
		return nil
	case err := <-env.ManagerDone():
		return fmt.Errorf("manager stopped: %w", err)
	}
}

// applySamples creates every object in the YAML files and returns the names
// of the DistributedLocks among them.
func applySamples(ctx context.Context, c client.Client, paths []string, namespace string) ([]string, error) {
	objs, err := manifests.CreateFromFiles(ctx, c, namespace, paths...)
	if err != nil {
		return nil, fmt.Errorf("applying samples: %w", err)
	}
	var locks []string
	for _, obj := range objs {
		if obj.GetKind() == "DistributedLock" {
			locks = append(locks, obj.GetName())
		}
	}
	return locks, nil
}

// printKubectl runs `kubectl get distributedlocks` and copies its output.
func printKubectl(ctx context.Context, out io.Writer, kubectl, kubeconfig, namespace string) error {
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "get", "distributedlocks", "-n", namespace, "-o", "wide")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("running kubectl get distributedlocks: %w", err)
	}
	return nil
}
