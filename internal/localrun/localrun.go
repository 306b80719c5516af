// Package localrun is the quick start: a local control plane with the CRD
// installed, the frontdesk manager running against it as a process of its
// own, and sample locks applied, so a user can try frontdesk with nothing but
// Go installed.
package localrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
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
	// ManagerBinary is the manager executable (`go build -o bin/manager .`).
	// Empty means bin/manager under the repository root.
	ManagerBinary string
	// BuildManager builds ManagerBinary from the repository first.
	BuildManager bool
	// ManagerOutput receives the manager's logs (nil: discarded).
	ManagerOutput io.Writer
	// ExitWhenReady stops everything once the samples are Ready, after
	// printing what `kubectl get distributedlocks` shows (used by tests).
	ExitWhenReady bool
}

// Run builds the manager (if asked), starts the control plane, runs the
// manager against it as a child process, applies the samples, waits until
// they are Ready, prints how to look at them and how to stop and restart the
// manager by hand, and then serves until ctx ends (or returns at once with
// ExitWhenReady). The manager may exit, or be killed, and be started again
// while the control plane keeps running. On every way out of Run (ctx
// cancelled, an error, a panic) the manager, kube-apiserver and etcd are
// stopped and their temporary directories removed.
func Run(ctx context.Context, opts Options, out io.Writer) (err error) {
	kubeconfig, err := absKubeconfig(opts.KubeconfigPath)
	if err != nil {
		return err
	}
	managerBin, err := managerBinary(ctx, opts, out)
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "starting etcd and kube-apiserver ...")
	cp, err := startControlPlane(opts.AssetsDir, kubeconfig)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "control plane: etcd data in %s, kube-apiserver certificates in %s\n", cp.etcdDir, cp.apiserverDir)
	// Should this process be killed outright (SIGKILL), the guard stops the
	// control plane; the manager ends by its own parent-death signal.
	stopGuard := startGuard([]string{cp.etcdDir, cp.apiserverDir})
	s := &session{out: out, cp: cp}
	defer func() {
		defer stopGuard()
		if stopErr := s.stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
	}()

	argv := managerArgs(managerBin, kubeconfig, opts.MetricsBindAddress)
	s.mgr, err = startManager(argv, opts.ManagerOutput)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe frontdesk manager runs as its own process (pid %d); the control plane keeps running without it.\n"+
		"To stop it, and to start it again by hand:\n\n  kill %d\n  %s\n\n", s.mgr.pid(), s.mgr.pid(), shellJoin(argv))

	c, names, err := installSamples(ctx, cp, opts, out)
	if err != nil {
		return err
	}
	if err := waitSamplesReady(ctx, c, s.mgr, opts.Namespace, names); err != nil {
		return err
	}
	return s.serve(ctx, opts, kubeconfig, argv, names)
}

// absKubeconfig returns path made absolute, once the directory it goes in
// exists.
func absKubeconfig(path string) (string, error) {
	kubeconfig, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("resolving kubeconfig path: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(kubeconfig), 0o755); err != nil {
		return "", fmt.Errorf("creating kubeconfig directory: %w", err)
	}
	return kubeconfig, nil
}

// session is what Run started and stops on its way out: the control plane,
// and the manager while Run is responsible for it.
type session struct {
	out io.Writer
	cp  *localControlPlane
	// mgr is the manager Run started; nil before it started and once it
	// exited on its own.
	mgr *managerProcess
	// managerExited says the manager Run started exited on its own, so a
	// manager running now was started by hand.
	managerExited bool
}

// stop stops the manager (if Run still owns one), then kube-apiserver and
// etcd, saying on out what it does. It returns why the control plane did
// not stop cleanly, having printed it too.
func (s *session) stop() error {
	if s.mgr != nil {
		fmt.Fprintf(s.out, "stopping the frontdesk manager (pid %d)\n", s.mgr.pid())
		s.mgr.stop(10 * time.Second)
	}
	if s.managerExited {
		fmt.Fprintln(s.out, "a frontdesk manager you started by hand is not stopped here: stop it yourself")
	}
	fmt.Fprintln(s.out, "stopping kube-apiserver and etcd")
	if err := s.cp.stop(); err != nil {
		fmt.Fprintf(s.out, "frontdesk-local: %v\n", err)
		return err
	}
	fmt.Fprintf(s.out, "stopped; removed %s and %s\n", s.cp.etcdDir, s.cp.apiserverDir)
	return nil
}

// serve prints how to look at the Ready samples named names. With
// ExitWhenReady it then prints what `kubectl get distributedlocks` shows
// and returns; otherwise it waits until ctx ends, telling the user how to
// start the manager (argv) again should it exit meanwhile.
func (s *session) serve(ctx context.Context, opts Options, kubeconfig string, argv, names []string) error {
	kubectl := filepath.Join(s.cp.AssetsDir, "kubectl")
	getLine := fmt.Sprintf("%s --kubeconfig %s get distributedlocks -n %s", kubectl, kubeconfig, opts.Namespace)
	fmt.Fprintf(s.out, "locks applied and Ready: %v\nlook at them with:\n\n  %s\n\n", names, getLine)
	fmt.Fprint(s.out, notRunHere)
	if opts.ExitWhenReady {
		return printKubectl(ctx, s.out, kubectl, kubeconfig, opts.Namespace)
	}
	fmt.Fprintln(s.out, "press Ctrl-C to stop")
	select {
	case <-ctx.Done():
	case <-s.mgr.done:
		fmt.Fprintf(s.out, "\nthe frontdesk manager (pid %d) exited: %s\nthe control plane keeps running; start the manager again with:\n\n  %s\n\n"+
			"(stop a manager you start by hand yourself; Ctrl-C here stops the control plane)\n", s.mgr.pid(), exitOf(s.mgr.err), shellJoin(argv))
		s.mgr, s.managerExited = nil, true
		<-ctx.Done()
	}
	return nil
}

// installSamples connects to the control plane, installs what config/default
// grants the users of locks (see installAccess), applies the samples, and
// returns the client and the names of the sample locks.
func installSamples(ctx context.Context, cp *localControlPlane, opts Options, out io.Writer) (client.Client, []string, error) {
	c, err := client.New(cp.Config, client.Options{Scheme: manager.NewScheme()})
	if err != nil {
		return nil, nil, fmt.Errorf("creating a client for the local apiserver: %w", err)
	}
	installed, err := installAccess(ctx, c, filepath.Join(cp.AssetsDir, "kubectl"))
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(out, "installed from config/default: %s\n", strings.Join(installed, ", "))
	names, err := applySamples(ctx, c, opts.SamplePaths, opts.Namespace)
	if err != nil {
		return nil, nil, err
	}
	return c, names, nil
}

// waitSamplesReady waits until the locks names in namespace are Ready. The
// samples become Ready only once the manager m reconciles them: should m
// exit first, the error says so.
func waitSamplesReady(ctx context.Context, c client.Client, m *managerProcess, namespace string, names []string) error {
	readyCtx, cancelReady := context.WithCancelCause(ctx)
	defer cancelReady(nil)
	go func() {
		select {
		case <-m.done:
			cancelReady(fmt.Errorf("the frontdesk manager exited (%s) before the samples were Ready; its log says why", exitOf(m.err)))
		case <-readyCtx.Done():
		}
	}()
	if err := waitReady(readyCtx, c, namespace, names); err != nil {
		if cause := context.Cause(readyCtx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause
		}
		return err
	}
	return nil
}

// notRunHere says what this control plane lacks, and what that means for
// what a user may try on it.
const notRunHere = `this control plane is etcd and kube-apiserver only: no kubelet, kube-scheduler or
kube-controller-manager runs. So:
  - pods are stored but never scheduled nor started: they stay Pending. A gated pod
    (annotation locks.frontdesk.dev/runs-holding and the scheduling gate
    locks.frontdesk.dev/admission) is still admitted by the frontdesk manager (gate
    removed, token annotated), and then holds the lock until you delete it: nothing
    runs it to completion.
  - Jobs create no pods and CronJobs no Jobs, so a CronJob of lock-admitted pods
    (config/samples/locks_v1alpha1_admitted_cronjob.yaml) never fires here; create a
    gated pod by hand to watch admission.
  - new namespaces get no default ServiceAccount, and nothing deletes objects by their
    owners (a deleted namespace stays Terminating).
For pods and CronJobs that run, use a real cluster (make test-e2e builds one with kind).

`

// managerBinary returns the manager executable, building it first when asked.
func managerBinary(ctx context.Context, opts Options, out io.Writer) (string, error) {
	root, rootErr := controlplane.RepoRoot()
	bin := opts.ManagerBinary
	if bin == "" {
		if rootErr != nil {
			return "", fmt.Errorf("locating bin/manager: %w", rootErr)
		}
		bin = filepath.Join(root, "bin", "manager")
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		return "", fmt.Errorf("resolving manager path: %w", err)
	}
	if opts.BuildManager {
		if rootErr != nil {
			return "", fmt.Errorf("building the manager: %w", rootErr)
		}
		fmt.Fprintf(out, "building the manager: go build -o %s .\n", bin)
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
		build.Dir = root
		if msg, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("building the manager (go build -o %s . in %s): %w\n%s", bin, root, err, msg)
		}
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("manager binary: %w (build it with `go build -o %s .`)", err, bin)
	}
	return bin, nil
}

// managerArgs is the command line of the manager against the local
// control plane: plain-HTTP metrics, no health probes, no leader election.
func managerArgs(bin, kubeconfig, metricsAddr string) []string {
	if metricsAddr == "" {
		metricsAddr = "0"
	}
	return []string{bin, "--kubeconfig", kubeconfig, "--metrics-bind-address=" + metricsAddr,
		"--metrics-secure=false", "--health-probe-bind-address=0", "--leader-elect=false"}
}

// localControlPlane is a started control plane and where its data lives.
type localControlPlane struct {
	*controlplane.ControlPlane
	env                   *envtest.Environment
	etcdDir, apiserverDir string
}

// startControlPlane starts etcd and kube-apiserver; if starting fails
// halfway, what did start is stopped again.
func startControlPlane(assets, kubeconfig string) (*localControlPlane, error) {
	var env *envtest.Environment
	cp, err := controlplane.Start(controlplane.Options{
		AssetsDir: assets, KubeconfigPath: kubeconfig,
		Configure: func(e *envtest.Environment) {
			env = e
			// Once its requests in flight are done, the apiserver gives open
			// connections 2 s, instead of its request timeout (60 s), to
			// close: a manager the user started by hand keeps watches open,
			// and would otherwise hold up Ctrl-C past the stop timeout,
			// which ends in SIGKILL and an error.
			e.ControlPlane.GetAPIServer().Configure().Set("shutdown-send-retry-after", "true")
		},
	})
	if err != nil {
		if env != nil {
			_ = env.Stop() // etcd may be up although the apiserver or the CRD failed
		}
		return nil, err
	}
	l := &localControlPlane{ControlPlane: cp, env: env}
	if cpl := env.ControlPlane; cpl.Etcd != nil && cpl.APIServer != nil {
		l.etcdDir, l.apiserverDir = cpl.Etcd.DataDir, cpl.APIServer.CertDir
	}
	return l, nil
}

// stop stops kube-apiserver and etcd and makes sure their directories are
// gone, even when stopping one of them failed.
func (l *localControlPlane) stop() error {
	err := l.Stop()
	for _, dir := range []string{l.etcdDir, l.apiserverDir} {
		if dir != "" {
			if rmErr := os.RemoveAll(dir); rmErr != nil {
				err = errors.Join(err, fmt.Errorf("removing %s: %w", dir, rmErr))
			}
		}
	}
	return err
}

// exitOf says how a process ended, from exec.Cmd.Wait's error.
func exitOf(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// shellJoin renders argv as a line to paste into a POSIX shell.
func shellJoin(argv []string) string {
	quoted := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("-_./=:,+@%", r)
		}) < 0 {
			quoted[i] = a
			continue
		}
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(quoted, " ")
}

// installAccess creates what config/default installs for the users of
// locks, as it renders them: the ClusterRoles frontdesk-lock-user and
// frontdesk-lock-admin, and the Lease guard (config/lease-policy's
// admission policies and bindings). It returns their kinds and names. The
// apiserver enforces new policies some moments after they are created.
func installAccess(ctx context.Context, c client.Client, kubectl string) ([]string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, fmt.Errorf("locating config/default: %w", err)
	}
	rendered, err := exec.CommandContext(ctx, kubectl, "kustomize", filepath.Join(root, "config", "default")).Output()
	if err != nil {
		return nil, fmt.Errorf("rendering config/default (kubectl kustomize): %w", err)
	}
	objs, err := manifests.Decode(rendered)
	if err != nil {
		return nil, fmt.Errorf("decoding config/default: %w", err)
	}
	var installed []string
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		role := gvk.Kind == "ClusterRole" && (obj.GetName() == "frontdesk-lock-user" || obj.GetName() == "frontdesk-lock-admin")
		if !role && gvk.Group != "admissionregistration.k8s.io" {
			continue
		}
		if err := c.Create(ctx, obj); err != nil {
			return installed, fmt.Errorf("creating %s %s from config/default: %w", gvk.Kind, obj.GetName(), err)
		}
		installed = append(installed, gvk.Kind+" "+obj.GetName())
	}
	return installed, nil
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
