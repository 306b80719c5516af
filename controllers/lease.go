package controllers

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// ensureLease reads the lock's Lease and brings it in line: creates it when
// missing (continuing from the recorded token), adopts an unowned one
// without disturbing its holder, and restores the token floor when the Lease
// fell behind it. Every write is an Update carrying the resourceVersion that
// was read, so a concurrent grant makes it fail rather than be overwritten.
func (r *DistributedLockReconciler) ensureLease(ctx context.Context, lock *locksv1alpha1.DistributedLock) (leaseState, []lockEvent, error) {
	lease := &coordinationv1.Lease{}
	key := types.NamespacedName{Namespace: lock.Namespace, Name: lock.EffectiveLeaseName()}
	if err := r.Get(ctx, key, lease); err != nil {
		if !apierrors.IsNotFound(err) {
			return leaseState{}, nil, fmt.Errorf("reading lease %s: %w", key, err)
		}
		return r.createLease(ctx, lock)
	}

	if owner := metav1.GetControllerOf(lease); owner != nil && owner.UID != lock.UID {
		msg := fmt.Sprintf("Lease %s is controlled by %s %s; set spec.leaseName to a Lease no other object controls",
			key.Name, owner.Kind, owner.Name)
		return leaseState{reason: locksv1alpha1.ReasonLeaseOwnedByOther, message: msg},
			[]lockEvent{{corev1.EventTypeWarning, EventLeaseConflict, msg}}, nil
	}

	if lease.DeletionTimestamp != nil {
		return leaseState{lease: lease, reason: locksv1alpha1.ReasonLeaseTerminating,
			message: fmt.Sprintf("Lease %s is being deleted; it will be recreated with its fencing token preserved", key.Name)}, nil, nil
	}

	updated, events, err := r.syncLease(ctx, lock, lease)
	if err != nil {
		return leaseState{}, nil, err
	}
	return leaseState{lease: updated, ready: true, reason: locksv1alpha1.ReasonLeaseReady,
		message: fmt.Sprintf("Lease %s is in sync", key.Name)}, events, nil
}

// createLease creates the lock's Lease with leaseTransitions continuing from
// the highest fencing token the lock has recorded. The floor is read from
// the apiserver, not the cache: the Lease's deletion can reach this pass
// before the status write that recorded its last token reaches the cache,
// and a stale floor would hand that token out again.
func (r *DistributedLockReconciler) createLease(ctx context.Context, lock *locksv1alpha1.DistributedLock) (leaseState, []lockEvent, error) {
	fresh := &locksv1alpha1.DistributedLock{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); err != nil {
		return leaseState{}, nil, fmt.Errorf("reading the recorded fencing token: %w", err)
	}
	if fresh.UID != lock.UID {
		return leaseState{}, nil, apierrors.NewConflict(locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource(),
			lock.Name, fmt.Errorf("the lock was replaced"))
	}
	floor := max(lock.Status.FencingToken, fresh.Status.FencingToken, r.highWater.get(client.ObjectKeyFromObject(lock)))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:       lock.EffectiveLeaseName(),
			Namespace:  lock.Namespace,
			Labels:     map[string]string{locksv1alpha1.LockNameLabel: lock.Name},
			Finalizers: []string{locksv1alpha1.LeaseTokenFinalizer},
		},
		Spec: coordinationv1.LeaseSpec{
			LeaseDurationSeconds: ptr.To(lock.EffectiveLeaseDurationSeconds()),
			LeaseTransitions:     ptr.To(int32(floor)),
		},
	}
	if err := controllerutil.SetControllerReference(lock, lease, r.Scheme); err != nil {
		return leaseState{}, nil, fmt.Errorf("setting owner of lease %s: %w", lease.Name, err)
	}
	if err := r.Create(ctx, lease); err != nil {
		return leaseState{}, nil, fmt.Errorf("creating lease %s: %w", lease.Name, err)
	}
	ev := lockEvent{corev1.EventTypeNormal, EventLeaseCreated, fmt.Sprintf("created Lease %s", lease.Name)}
	if floor > 0 {
		ev = lockEvent{corev1.EventTypeNormal, EventLeaseRecreated,
			fmt.Sprintf("recreated Lease %s with fencing token continuing from %d", lease.Name, floor)}
	}
	return leaseState{lease: lease, ready: true, reason: locksv1alpha1.ReasonLeaseReady,
		message: fmt.Sprintf("Lease %s is in sync", lease.Name)}, []lockEvent{ev}, nil
}

// syncLease adopts the Lease and repairs it. It never touches a live
// holder's fields, except to void a grant whose token is below the recorded
// floor (such a token may have been handed out before).
func (r *DistributedLockReconciler) syncLease(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	current *coordinationv1.Lease) (*coordinationv1.Lease, []lockEvent, error) {
	lease := current.DeepCopy()
	var events []lockEvent

	if metav1.GetControllerOf(lease) == nil {
		if err := controllerutil.SetControllerReference(lock, lease, r.Scheme); err != nil {
			return nil, nil, fmt.Errorf("adopting lease %s: %w", lease.Name, err)
		}
		events = append(events, lockEvent{corev1.EventTypeNormal, EventLeaseAdopted,
			fmt.Sprintf("adopted existing Lease %s", lease.Name)})
	}
	controllerutil.AddFinalizer(lease, locksv1alpha1.LeaseTokenFinalizer)
	if lease.Labels[locksv1alpha1.LockNameLabel] != lock.Name {
		if lease.Labels == nil {
			lease.Labels = map[string]string{}
		}
		lease.Labels[locksv1alpha1.LockNameLabel] = lock.Name
	}

	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	floor := max(lock.Status.FencingToken, r.highWater.get(client.ObjectKeyFromObject(lock)))
	if int64(ptr.Deref(lease.Spec.LeaseTransitions, 0)) < floor {
		events = append(events, lockEvent{corev1.EventTypeWarning, EventTokenFloorRestored,
			fmt.Sprintf("Lease %s had fencing token %d, below the recorded %d; raised it to %d and voided the grant to %q",
				lease.Name, ptr.Deref(lease.Spec.LeaseTransitions, 0), floor, floor, holder)})
		lease.Spec.LeaseTransitions = ptr.To(int32(floor))
		lease.Spec.HolderIdentity = nil
		lease.Spec.AcquireTime, lease.Spec.RenewTime = nil, nil
		holder = ""
	}
	if holder == "" && ptr.Deref(lease.Spec.LeaseDurationSeconds, 0) != lock.EffectiveLeaseDurationSeconds() {
		lease.Spec.LeaseDurationSeconds = ptr.To(lock.EffectiveLeaseDurationSeconds())
	}

	if equality.Semantic.DeepEqual(current, lease) {
		return current, nil, nil
	}
	if err := r.Update(ctx, lease); err != nil {
		return nil, nil, fmt.Errorf("updating lease %s: %w", lease.Name, err)
	}
	return lease, events, nil
}

// releaseTerminatingLease removes the token finalizer from a Lease being
// deleted, once the lock's recorded token covers the Lease's and no live
// holder remains: a holder still inside its lease must not see a fresh Lease
// granted to someone else (it stops renewing a terminating Lease, so its
// grant lapses within one lease duration, and the pass requeued at that
// deadline lets the Lease go). The Update carries the resourceVersion the
// token was read from: a grant in between makes it conflict, and the next
// pass records that grant first.
func (r *DistributedLockReconciler) releaseTerminatingLease(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	lease *coordinationv1.Lease) error {
	if lease == nil || lease.DeletionTimestamp == nil || !controllerutil.ContainsFinalizer(lease, locksv1alpha1.LeaseTokenFinalizer) {
		return nil
	}
	if meta.IsStatusConditionTrue(lock.Status.Conditions, locksv1alpha1.ConditionHeld) {
		return nil
	}
	if int64(ptr.Deref(lease.Spec.LeaseTransitions, 0)) > lock.Status.FencingToken {
		return fmt.Errorf("lease %s has token %d not yet recorded in status", lease.Name, ptr.Deref(lease.Spec.LeaseTransitions, 0))
	}
	lease = lease.DeepCopy()
	controllerutil.RemoveFinalizer(lease, locksv1alpha1.LeaseTokenFinalizer)
	if err := r.Update(ctx, lease); err != nil {
		return fmt.Errorf("releasing finalizer of terminating lease %s: %w", lease.Name, err)
	}
	return nil
}

// deleteLease removes the lock's Lease when the lock is deleted. Leases
// controlled by another object are left alone.
func (r *DistributedLockReconciler) deleteLease(ctx context.Context, lock *locksv1alpha1.DistributedLock) error {
	lease := &coordinationv1.Lease{}
	key := types.NamespacedName{Namespace: lock.Namespace, Name: lock.EffectiveLeaseName()}
	if err := r.Get(ctx, key, lease); err != nil {
		return client.IgnoreNotFound(err)
	}
	if owner := metav1.GetControllerOf(lease); owner == nil || owner.UID != lock.UID {
		return nil
	}
	if controllerutil.ContainsFinalizer(lease, locksv1alpha1.LeaseTokenFinalizer) {
		lease = lease.DeepCopy()
		controllerutil.RemoveFinalizer(lease, locksv1alpha1.LeaseTokenFinalizer)
		if err := r.Update(ctx, lease); err != nil {
			return fmt.Errorf("removing finalizer of lease %s: %w", key.Name, err)
		}
	}
	if lease.DeletionTimestamp != nil {
		return nil
	}
	err := r.Delete(ctx, lease, client.Preconditions{UID: &lease.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting lease %s: %w", key.Name, err)
	}
	return nil
}
