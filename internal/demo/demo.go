package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/localrun"
)

// Result is the whole demo: one RoundResult per run.
type Result struct {
	Rounds []RoundResult
}

// Run starts a local control plane and the manager, applies the billing
// lock, runs the scenario once per entry of opts.Rounds (false: the ledger
// trusts every write; true: it checks fencing tokens), and prints progress
// and the final tables to out.
func Run(ctx context.Context, opts Options, out io.Writer) (Result, error) {
	if err := opts.Validate(); err != nil {
		return Result{}, err
	}
	fmt.Fprintf(out, "billing scenario: %d customers, %d workers, lock TTL %s, job ~%s, holder frozen at %.0f%% until the lease passes on\n",
		opts.Customers, opts.Workers, opts.LeaseDuration, opts.JobDuration, 100*opts.PauseAt)
	fmt.Fprintln(out, "starting etcd, kube-apiserver and the frontdesk manager ...")
	env, err := localrun.StartEnvironment(ctx, localrun.EnvironmentOptions{
		AssetsDir: opts.AssetsDir, KubeconfigPath: opts.KubeconfigPath, MetricsBindAddress: "0"})
	if err != nil {
		return Result{}, err
	}
	defer env.Stop()
	cs, err := kubernetes.NewForConfig(env.ControlPlane.Config)
	if err != nil {
		return Result{}, fmt.Errorf("creating client: %w", err)
	}
	billing := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: lockName, Namespace: demoNamespace},
		Spec:       locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: int32(opts.LeaseDuration.Seconds())},
	}
	if err := env.Client.Create(ctx, billing); err != nil {
		return Result{}, fmt.Errorf("applying DistributedLock %s: %w", lockName, err)
	}
	if err := env.WaitReady(ctx, demoNamespace, []string{lockName}); err != nil {
		return Result{}, err
	}
	fmt.Fprintf(out, "DistributedLock %s/%s is Ready; watch it with:\n  %s --kubeconfig %s get distributedlocks -w\n\n",
		demoNamespace, lockName, filepath.Join(env.ControlPlane.AssetsDir, "kubectl"), env.ControlPlane.KubeconfigPath)

	var res Result
	for _, fenced := range opts.Rounds {
		r := &round{opts: opts, fenced: fenced, cs: cs, kubeconfig: env.ControlPlane.KubeconfigPath,
			kubectl: filepath.Join(env.ControlPlane.AssetsDir, "kubectl"), out: out}
		rr, err := r.run(ctx)
		if err != nil {
			return res, fmt.Errorf("running the scenario (fencing %v): %w", fenced, err)
		}
		fmt.Fprintf(out, "\n$ kubectl get dlock %s\n%s\n", lockName, rr.KubectlGet)
		res.Rounds = append(res.Rounds, rr)
	}
	printReport(out, opts, res)
	return res, nil
}
