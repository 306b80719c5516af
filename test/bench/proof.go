package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/internal/localrun"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Failover on proof (controllers/proof.go; docs/design.md, "Failover on
// proof"): a grant made with a token bound to a pod records the pod's UID
// in its principal, and the controller ends it as soon as that pod is
// proven dead instead of after the lease. It is measured as the peers'
// crash failover is, on locks of the same TTL: a holder process takes the
// lock with a token bound to a pod of its own (ServiceAccount proofSA,
// bound to the shipped frontdesk-lock-user), a waiter queues, the holder
// is SIGKILLed, and once it has exited the bench writes the pod's status
// as its kubelet would (no kubelet runs here): Failed, its container
// terminated with exit code 137. Measured from the start of that status
// write to the waiter's grant (its Acquire returning); how long a kubelet
// takes to notice and report a death is not part of it. Every trial checks
// that the grant made was the pod's (its principal names the pod) and that
// the controller ended it on the proof (the event HolderProvenDead), not
// after the lease.

// proofSA is the ServiceAccount of the proof trials' holder pods.
const proofSA = "proof-holder"

// proofLock is the lock of proof trial i.
func proofLock(i int) string { return fmt.Sprintf("proof-failover-%d", i) }

// setupProofHolders creates the shipped frontdesk-lock-user ClusterRole and
// proofSA bound to it in the bench's namespace, and returns once RBAC lets
// proofSA write the Leases there.
func setupProofHolders(ctx context.Context, env *localrun.Environment, cs kubernetes.Interface) error {
	if err := createLockUserRole(ctx, env); err != nil {
		return err
	}
	if err := bindLockUser(ctx, cs, namespace, proofSA); err != nil {
		return err
	}
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + namespace + ":" + proofSA,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "patch", Group: "coordination.k8s.io", Resource: "leases"}}}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed, err
	})
	if err != nil {
		return fmt.Errorf("waiting for frontdesk-lock-user to let %s write Leases: %w", proofSA, err)
	}
	return nil
}

// proofFailover measures frontdesk's failover on proof opts.ProofTrials
// times, each on a lock and a holder pod of its own.
func proofFailover(ctx context.Context, pe *peersEnv, opts PeersOptions, holderArgs []string) (Row, error) {
	// Proofs apply where the lease guard does (it binds each grant to the
	// principal that made it); installed here, after the rows that measure
	// the apiserver without it.
	if err := installLeaseGuard(ctx, pe.env, pe.cs); err != nil {
		return Row{}, err
	}
	samples := make([]time.Duration, 0, opts.ProofTrials)
	for trial := range opts.ProofTrials {
		d, err := proofFailoverOnce(ctx, pe, proofLock(trial), opts, holderArgs)
		if err != nil {
			return Row{}, fmt.Errorf("failover on proof, trial %d: %w", trial, err)
		}
		samples = append(samples, d)
	}
	return sorted(Row{Samples: samples}), nil
}

// proofFailoverOnce is one trial on lock key: from the holder pod's status
// write to the waiter's grant.
func proofFailoverOnce(ctx context.Context, pe *peersEnv, key string, opts PeersOptions, holderArgs []string) (time.Duration, error) {
	pod, token, err := createBoundPod(ctx, pe.cs, namespace, proofSA, key+"-holder")
	if err != nil {
		return 0, err
	}
	tokenFile := filepath.Join(pe.dir, pod.Name+".token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return 0, err
	}
	sys := frontdeskSystem{cs: pe.cs, dyn: pe.dyn}
	holder, err := startHolder(sys, key, opts, append(slices.Clone(holderArgs), "--token-file", tokenFile))
	if err != nil {
		return 0, err
	}
	defer stopHolder(holder)
	if err := expectPodsGrant(ctx, pe.cs, key, pod); err != nil {
		return 0, err
	}
	next, err := awaitNext(ctx, sys, key, opts)
	if err != nil {
		return 0, err
	}
	if err := waitQueued(ctx, pe.cs, key); err != nil {
		return 0, err
	}
	stopHolder(holder) // SIGKILL, and the process gone: what its kubelet then reports
	died, err := reportFinished(ctx, pe.cs, pod.Name, corev1.PodFailed,
		corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", FinishedAt: metav1.Now()})
	if err != nil {
		return 0, err
	}
	r := <-next
	if r.err != nil {
		return 0, r.err
	}
	if err := expectProvenDead(ctx, pe.cs, key); err != nil {
		return 0, err
	}
	return r.held.Sub(died), nil
}

// expectPodsGrant checks that the grant on the Lease of lock key was made
// with a token bound to pod: its principal names the pod's UID.
func expectPodsGrant(ctx context.Context, cs kubernetes.Interface, key string, pod *corev1.Pod) error {
	l, err := cs.CoordinationV1().Leases(namespace).Get(ctx, key, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading lease %s: %w", key, err)
	}
	principal := l.Annotations[locksv1alpha1.HolderPrincipalAnnotation]
	if lease.PrincipalPodUID(principal) != string(pod.UID) {
		return fmt.Errorf("the grant on lease %s has principal %q, not one of pod %s (UID %s)", key, principal, pod.Name, pod.UID)
	}
	return nil
}

// waitQueued waits until the Lease of lock key has a waiter in its queue.
func waitQueued(ctx context.Context, cs kubernetes.Interface, key string) error {
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := cs.CoordinationV1().Leases(namespace).Get(ctx, key, metav1.GetOptions{})
		return err == nil && len(lease.Queue(l)) > 0, err
	})
	if err != nil {
		return fmt.Errorf("waiting for the waiter's place on lease %s: %w", key, err)
	}
	return nil
}

// expectProvenDead waits, up to 10 s, for the event that says the
// controller ended the grant on lock key on a proof of its holder's death,
// not after the lease.
func expectProvenDead(ctx context.Context, cs kubernetes.Interface, key string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		events, err := cs.EventsV1().Events(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(events.Items, func(ev eventsv1.Event) bool {
			return ev.Regarding.Kind == "DistributedLock" && ev.Regarding.Name == key && ev.Reason == controllers.EventHolderProvenDead
		}), nil
	})
	if err != nil {
		return fmt.Errorf("lock %s changed hands without the event %s: not on proof (the lease ran out first?): %w",
			key, controllers.EventHolderProvenDead, err)
	}
	return nil
}

// reportFinished writes the status of pod name, in the bench's namespace,
// as its kubelet does once every container ended (field manager kubelet):
// phase, and each
// container terminated as given. It returns when the status write started.
func reportFinished(ctx context.Context, cs kubernetes.Interface, name string, phase corev1.PodPhase,
	terminated corev1.ContainerStateTerminated) (time.Time, error) {
	pods := cs.CoreV1().Pods(namespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("reading pod %s: %w", name, err)
	}
	pod.Status.Phase = phase
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, State: corev1.ContainerState{Terminated: terminated.DeepCopy()}})
	}
	started := time.Now()
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
		return started, fmt.Errorf("reporting pod %s %s: %w", name, phase, err)
	}
	return started, nil
}

// printProofFailover prints the failover on proof's line.
func printProofFailover(out io.Writer, r Row, opts PeersOptions) {
	fmt.Fprintf(out, "frontdesk failover on proof (holder SIGKILLed, its pod reported Failed → next holder holds), lease %s: p50 %s, p99 %s, max %s, n %d\n",
		opts.TTL, ms(r.Percentile(50)), ms(r.Percentile(99)), ms(r.Percentile(100)), len(r.Samples))
}
