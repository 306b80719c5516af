package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

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
	defer func() { _ = env.Stop() }()
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
	fmt.Fprintf(out, "DistributedLock %s/%s is Ready; watch it from another terminal while the demo runs\n"+
		"(the control plane and this kubeconfig are removed when the demo ends) with:\n  %s --kubeconfig %s get distributedlocks -n %s -w\n\n",
		demoNamespace, lockName, filepath.Join(env.ControlPlane.AssetsDir, "kubectl"), env.ControlPlane.KubeconfigPath, demoNamespace)

	var res Result
	var lastToken int64 // the last grant of the previous round
	for _, fenced := range opts.Rounds {
		lease, err := cs.CoordinationV1().Leases(demoNamespace).Get(ctx, lockName, metav1.GetOptions{})
		if err != nil {
			return res, fmt.Errorf("reading lease %s: %w", lockName, err)
		}
		before := int64(ptr.Deref(lease.Spec.LeaseTransitions, 0))
		if len(res.Rounds) > 0 && before > lastToken {
			fmt.Fprintf(out, "\nthe lock's fencing token is %d: %s went to workers of the previous round that took the lock on their way out,\n"+
				"after its job was done (not counted in it); this round's grants continue from token %d, as tokens never go back\n",
				before, tokenSpan(lastToken+1, before), before+1)
		}
		r := &round{opts: opts, fenced: fenced, cs: cs, kubeconfig: env.ControlPlane.KubeconfigPath,
			kubectl: filepath.Join(env.ControlPlane.AssetsDir, "kubectl"), out: out}
		rr, err := r.run(ctx)
		if err != nil {
			return res, fmt.Errorf("running the scenario (fencing %v): %w", fenced, err)
		}
		rr.TokenBefore = before
		if n := len(rr.Grants); n > 0 {
			lastToken = rr.Grants[n-1].Token
		}
		fmt.Fprintf(out, "\n$ kubectl get dlock %s\n%s\n", lockName, rr.KubectlGet)
		res.Rounds = append(res.Rounds, rr)
	}
	printReport(out, opts, res)
	return res, nil
}

// tokenSpan names the tokens from through to.
func tokenSpan(from, to int64) string {
	if from == to {
		return fmt.Sprintf("token %d", from)
	}
	return fmt.Sprintf("tokens %d to %d", from, to)
}
