package bench

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/frontdesk-dev/frontdesk/internal/localrun"
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
)

// leaseGuardProbe is the lock whose Lease tells when the guard is in force.
const leaseGuardProbe = "lease-guard-probe"

// installLeaseGuard applies config/lease-policy as shipped (config/default
// installs it on every cluster), so that every Lease write measured passes
// through it, and returns once the apiserver enforces it: it picks new
// policies up asynchronously. The probe lock's Lease must exist.
func installLeaseGuard(ctx context.Context, env *localrun.Environment, cs kubernetes.Interface) error {
	if err := manifests.CreateShippedPolicy(ctx, env.Client, "lease-policy"); err != nil {
		return fmt.Errorf("installing the lease guard policy: %w", err)
	}
	leases := cs.CoordinationV1().Leases(namespace)
	// The bench's clients are cluster admins, whom lease-guard's
	// matchConditions skip; lease-token-guard judges them: it refuses a
	// lower token (403). The probe's token is raised to 1 first (allowed),
	// then a dry run of 0 is sent until it is refused, on a lock nobody uses.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, leaseGuardProbe, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("reading the probe's lease: %w", err)
		}
		if l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions < 1 {
			l.Spec.LeaseTransitions = new(int32(1))
			if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
				return false, fmt.Errorf("raising the probe's token: %w", err)
			}
			return false, nil
		}
		l.Spec.LeaseTransitions = new(int32(0))
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case apierrors.IsForbidden(err):
			return true, nil
		case err == nil || apierrors.IsConflict(err):
			return false, nil
		default:
			return false, fmt.Errorf("probing the lease guard: %w", err)
		}
	})
	if err != nil {
		return fmt.Errorf("waiting for the apiserver to enforce the lease guard policy: %w", err)
	}
	return nil
}
