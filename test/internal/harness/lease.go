package harness

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// These helpers play the part of a lock client with plain client-go calls:
// each is one Update carrying the resourceVersion that was read, so a
// concurrent writer makes it fail with a Conflict instead of being
// overwritten. They do not retry; callers decide what a lost race means.

// Grant takes the Lease for holder: it sets the holder and times and
// increments leaseTransitions in one compare-and-swap write, and returns the
// new fencing token. It grants regardless of the current holder (the tests
// decide when a takeover is due).
func Grant(ctx context.Context, cs kubernetes.Interface, namespace, name, holder string) (int32, error) {
	lease, err := cs.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("reading lease %s/%s: %w", namespace, name, err)
	}
	now := metav1.NewMicroTime(time.Now())
	token := ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1
	lease.Spec.HolderIdentity = new(holder)
	lease.Spec.LeaseTransitions = new(token)
	lease.Spec.AcquireTime = &now
	lease.Spec.RenewTime = &now
	if _, err := cs.CoordinationV1().Leases(namespace).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return 0, fmt.Errorf("granting lease %s/%s to %s: %w", namespace, name, holder, err)
	}
	return token, nil
}

// Renew moves renewTime forward if holder still holds the Lease.
func Renew(ctx context.Context, cs kubernetes.Interface, namespace, name, holder string) error {
	return updateHeld(ctx, cs, namespace, name, holder, func(l *coordinationv1.Lease) {
		l.Spec.RenewTime = new(metav1.NewMicroTime(time.Now()))
	})
}

// Release clears the holder if holder still holds the Lease.
func Release(ctx context.Context, cs kubernetes.Interface, namespace, name, holder string) error {
	return updateHeld(ctx, cs, namespace, name, holder, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = nil
		l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
	})
}

func updateHeld(ctx context.Context, cs kubernetes.Interface, namespace, name, holder string, mutate func(*coordinationv1.Lease)) error {
	lease, err := cs.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading lease %s/%s: %w", namespace, name, err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != holder {
		return fmt.Errorf("lease %s/%s is held by %q, not %q", namespace, name, got, holder)
	}
	mutate(lease)
	if _, err := cs.CoordinationV1().Leases(namespace).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating lease %s/%s for %s: %w", namespace, name, holder, err)
	}
	return nil
}
