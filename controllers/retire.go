package controllers

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A deleted lock does not take its fencing tokens with it. Its Lease, if
// frontdesk created it, stays behind as the record of its tokens: retired,
// tied to no lock (the lock-uid annotation gone; frontdesk puts no owner
// reference on a Lease, so the garbage collector leaves it alone whatever
// the deletion propagation), the lock's name in its label and the token
// finalizer on it. A new lock of that name adopts the record and continues
// from its token, so tokens for a lock name in a namespace never go back,
// however often the lock is deleted and created again (GitOps prune and
// re-sync, kubectl replace --force). A Lease frontdesk did not create
// (adopted, such as a leader-election Lease) is handed back as it is, never
// deleted.
//
// Retiring takes three steps, one compare-and-swap Update each, over as many
// passes (the watch of the Lease starts the next one):
//  1. Untie the Lease from the lock, raising its token to the recorded floor
//     in the same write (a Lease wound back while the manager was down must
//     not become a record below a token already handed out). From now on no
//     client grants on the Lease, and a holder's next renewal finds that out
//     and ends its grant. A candidates-mode grant is revoked in the same
//     write, after its pod's marks were removed.
//  2. Wait until the holder has released, or its lease has lapsed as
//     observed on the controller's clock (for a revoked candidate, also the
//     hand-off delay: it has no grant Context).
//  3. Clear the holder fields: the record is free.
// Then the lock's finalizer goes, and the lock with it. If the Lease is
// gone altogether (deleted and not recreated yet), a record is created
// before the lock goes. In a namespace being deleted nothing can be kept:
// the record's finalizer is released instead, so the namespace can go.

// finalizeLock retires or hands back the lock's Lease, then lets the lock go.
func (r *DistributedLockReconciler) finalizeLock(ctx context.Context, lock *locksv1alpha1.DistributedLock) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(lock, locksv1alpha1.LockCleanupFinalizer) {
		return ctrl.Result{}, nil
	}
	l, err := r.leaseOfDeletedLock(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	nsGoing, err := r.namespaceTerminating(ctx, lock.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case l == nil && !nsGoing:
		if err := r.keepRecord(ctx, lock); err != nil {
			return ctrl.Result{}, err
		}
	case l != nil && isLocksLease(lock, l):
		done, wait, err := r.retireOrHandBack(ctx, lock, l, nsGoing)
		if err != nil || !done {
			return ctrl.Result{RequeueAfter: wait}, err
		}
	}
	if err := r.clearAllPodMarks(ctx, lock); err != nil {
		return ctrl.Result{}, err
	}
	controllerutil.RemoveFinalizer(lock, locksv1alpha1.LockCleanupFinalizer)
	if err := r.Update(ctx, lock); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing finalizer: %w", err)
	}
	r.forgetGrants(client.ObjectKeyFromObject(lock))
	return ctrl.Result{}, nil
}

// leaseOfDeletedLock reads the lock's Lease; nil when it does not exist, as
// the apiserver (not only the cache, which may not have seen a Lease created
// a moment ago) confirms.
func (r *DistributedLockReconciler) leaseOfDeletedLock(ctx context.Context, lock *locksv1alpha1.DistributedLock) (*coordinationv1.Lease, error) {
	key := types.NamespacedName{Namespace: lock.Namespace, Name: leaseNameOf(lock)}
	l, err := r.readLease(ctx, key)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading lease %s: %w", key.Name, err)
	}
	return l, nil
}

// keepRecord creates the record of a deleted lock whose Lease is gone (it
// was deleted, and the lock before it was recreated): a Lease of the lock's
// name, tied to no lock, at the recorded floor.
func (r *DistributedLockReconciler) keepRecord(ctx context.Context, lock *locksv1alpha1.DistributedLock) error {
	floor, _, err := r.recordedFloor(ctx, lock)
	if err != nil {
		return err
	}
	record, err := newRecordLease(lock, leaseNameOf(lock), floor)
	if err != nil {
		return err
	}
	if err := r.Create(ctx, record); err != nil {
		return fmt.Errorf("keeping the record of lease %s: %w", record.Name, err)
	}
	r.event(lock, record, corev1.EventTypeNormal, EventRetired, fmt.Sprintf(
		"Lease %s was gone: created it as the record of fencing token %d, for a new DistributedLock %s to continue from", record.Name, floor, lock.Name))
	return nil
}

// isLocksLease reports whether l is the lock's to retire or hand back: tied
// to it, or carrying its name (a retirement under way, or the Lease of an
// earlier lock of this name).
func isLocksLease(lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease) bool {
	if lease.ForeignController(l) != nil {
		return false
	}
	return lease.ControllerUID(l) == lock.UID || l.Labels[locksv1alpha1.LockNameLabel] == lock.Name
}

// retireOrHandBack does the next step for the Lease of a deleted lock. done
// is true once nothing is left to do; otherwise wait is how long until the
// next step may be due (zero: the watch brings it). A Lease whose origin is
// unknown (written by an earlier version) is taken as created: it is kept
// as a record, the cautious direction.
func (r *DistributedLockReconciler) retireOrHandBack(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	l *coordinationv1.Lease, nsGoing bool) (done bool, wait time.Duration, err error) {
	if l.Annotations[locksv1alpha1.LeaseOriginAnnotation] == locksv1alpha1.LeaseOriginAdopted {
		return true, 0, r.handBack(ctx, lock, l)
	}
	now := r.Clock.Now()
	if lease.ControllerUID(l) != "" {
		return false, 0, r.untie(ctx, lock, l, now)
	}
	obs := r.observations.Observe(client.ObjectKeyFromObject(lock).String(), lease.RecordOf(l), now)
	if lapse := holderLapse(lock, l, obs); now.Before(lapse) {
		if err := r.setDeletingStatus(ctx, lock, fmt.Sprintf(
			"the lock is being deleted: waiting for holder %s (fencing token %d) to release or lapse (~%s), "+
				"then Lease %s stays as the record of its fencing tokens", obs.Record.Holder, obs.Record.Token,
			lapse.UTC().Format(time.RFC3339), l.Name)); err != nil {
			return false, 0, err
		}
		return false, lapse.Sub(now), nil
	}
	if lease.Holder(l) != "" || l.Annotations[locksv1alpha1.CandidateGrantAnnotation] != "" || l.Annotations[locksv1alpha1.RevokedAnnotation] != "" {
		retired := lease.Release(l)
		delete(retired.Annotations, locksv1alpha1.CandidateGrantAnnotation)
		delete(retired.Annotations, locksv1alpha1.RevokedAnnotation)
		if err := r.Update(ctx, retired); err != nil {
			return false, 0, fmt.Errorf("clearing the lapsed holder of retired lease %s: %w", l.Name, err)
		}
		return false, 0, nil
	}
	if nsGoing {
		return true, 0, r.letRecordGo(ctx, lock, l)
	}
	r.event(lock, l, corev1.EventTypeNormal, EventRetired, fmt.Sprintf(
		"kept Lease %s as the record of fencing token %d: a new DistributedLock %s continues from it", l.Name, lease.Token(l), lock.Name))
	return true, 0, nil
}

// untie is step 1 of a retirement: the pod marks of a candidates-mode grant
// removed first, then one write that unties the Lease from the lock, raises
// its token to the recorded floor (voiding a grant made below it) and
// revokes a candidates-mode grant.
func (r *DistributedLockReconciler) untie(ctx context.Context, lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease, now time.Time) error {
	floor, _, err := r.recordedFloor(ctx, lock)
	if err != nil {
		return err
	}
	if err := r.clearAllPodMarks(ctx, lock); err != nil {
		return err
	}
	retiring := l.DeepCopy()
	lease.ClearController(retiring)
	var raised bool
	if lease.Token(retiring) < floor {
		if retiring, err = lease.RaiseToFloor(retiring, floor); err != nil {
			return fmt.Errorf("raising retired lease %s to the recorded floor: %w", l.Name, err)
		}
		raised = true
	}
	revoked := revokeCandidateGrant(retiring, now)
	if err := r.Update(ctx, retiring); err != nil {
		return fmt.Errorf("retiring lease %s: %w", l.Name, err)
	}
	if raised {
		r.event(lock, l, corev1.EventTypeWarning, EventTokenFloorRestored, fmt.Sprintf(
			"the lock is being deleted: Lease %s had fencing token %d, below the recorded %d; raised it before keeping it as the record",
			l.Name, lease.Token(l), floor))
	}
	if revoked {
		r.event(lock, l, corev1.EventTypeNormal, EventRevoked, fmt.Sprintf(
			"the lock is being deleted: revoked the grant of candidate %s (fencing token %d)", locksv1alpha1.PodNameOf(lease.Holder(l)), lease.Token(l)))
	}
	return nil
}

// letRecordGo releases the token finalizer of a record in a namespace being
// deleted: nothing can be kept there, and the namespace must be able to go.
func (r *DistributedLockReconciler) letRecordGo(ctx context.Context, lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease) error {
	if !controllerutil.ContainsFinalizer(l, locksv1alpha1.LeaseTokenFinalizer) {
		return nil
	}
	released := l.DeepCopy()
	controllerutil.RemoveFinalizer(released, locksv1alpha1.LeaseTokenFinalizer)
	if err := r.Update(ctx, released); err != nil {
		return fmt.Errorf("releasing the record %s in a namespace being deleted: %w", l.Name, err)
	}
	if lock != nil {
		r.event(lock, l, corev1.EventTypeNormal, EventRetired, fmt.Sprintf(
			"namespace %s is being deleted: released Lease %s (fencing token %d) rather than keeping it as a record", l.Namespace, l.Name, lease.Token(l)))
	}
	return nil
}

// releaseOrphanRecords lets the records of lock name go in a namespace
// being deleted, when no lock of that name is left to do it: the namespace
// controller deletes every Lease, and a record's token finalizer would hold
// the namespace forever. A record deleted while its namespace stays is kept
// (terminating, a new lock of its name takes its token over) and looked at
// again now and then, in case the namespace goes later.
func (r *DistributedLockReconciler) releaseOrphanRecords(ctx context.Context, key types.NamespacedName) (ctrl.Result, error) {
	var records coordinationv1.LeaseList
	if err := r.List(ctx, &records, client.InNamespace(key.Namespace), client.MatchingLabels{locksv1alpha1.LockNameLabel: key.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the records of lock %s: %w", key.Name, err)
	}
	var orphans []*coordinationv1.Lease
	for i := range records.Items {
		if l := &records.Items[i]; lease.ControllerUID(l) == "" && l.DeletionTimestamp != nil {
			orphans = append(orphans, l)
		}
	}
	if len(orphans) == 0 {
		return ctrl.Result{}, nil
	}
	going, err := r.namespaceTerminating(ctx, key.Namespace)
	if err != nil || !going {
		return ctrl.Result{RequeueAfter: orphanRecheck}, err
	}
	for _, l := range orphans {
		if err := r.letRecordGo(ctx, nil, l); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// orphanRecheck is how often a deleted record with no lock is looked at
// again, in case its namespace is being deleted.
const orphanRecheck = time.Minute

// namespaceTerminating reports whether the namespace is being deleted (read
// from the apiserver: the manager caches no namespaces).
func (r *DistributedLockReconciler) namespaceTerminating(ctx context.Context, name string) (bool, error) {
	ns := &corev1.Namespace{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Name: name}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("reading namespace %s: %w", name, err)
	}
	return ns.DeletionTimestamp != nil, nil
}

// handBack returns a Lease the lock adopted to the state it found it in:
// no finalizer, label or annotations of frontdesk's, but its token epoch
// (its tokens never go back). Its holder, if any, is left alone.
func (r *DistributedLockReconciler) handBack(ctx context.Context, lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease) error {
	back := l.DeepCopy()
	lease.ClearController(back)
	controllerutil.RemoveFinalizer(back, locksv1alpha1.LeaseTokenFinalizer)
	delete(back.Labels, locksv1alpha1.LockNameLabel)
	lease.DropFrontLabels(back)
	for key := range back.Annotations {
		if lease.IsFrontdeskAnnotation(key) {
			delete(back.Annotations, key)
		}
	}
	if err := r.Update(ctx, back); err != nil {
		return fmt.Errorf("handing back lease %s: %w", l.Name, err)
	}
	r.event(lock, l, corev1.EventTypeNormal, EventLeaseHandedBack, fmt.Sprintf(
		"handed Lease %s back as it was before the lock adopted it (frontdesk did not create it, so it is not deleted)", l.Name))
	return nil
}

// setDeletingStatus reports on a lock being deleted why it is still there.
func (r *DistributedLockReconciler) setDeletingStatus(ctx context.Context, lock *locksv1alpha1.DistributedLock, message string) error {
	st := *lock.Status.DeepCopy()
	setCondition(&st, statusInput{lock: lock, now: r.Clock.Now()}, locksv1alpha1.ConditionReady, metav1.ConditionFalse,
		locksv1alpha1.ReasonDeleting, message)
	return r.updateStatus(ctx, lock, st)
}

// event records an Event on the lock at once (for steps that write no
// status first).
func (r *DistributedLockReconciler) event(lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease, eventType, reason, note string) {
	r.recordEvents(lock, l, []lockEvent{{eventType, reason, note}})
}

// revokeCandidateGrant marks the controller's own candidates-mode grant on
// l as revoked and moves its renewTime to now, so that every observer's
// expiry clock restarts from the revocation. It reports whether there was
// such a grant to revoke.
func revokeCandidateGrant(l *coordinationv1.Lease, now time.Time) bool {
	holder := lease.Holder(l)
	if holder == "" || l.Annotations[locksv1alpha1.CandidateGrantAnnotation] != holder || l.Annotations[locksv1alpha1.RevokedAnnotation] == holder {
		return false
	}
	l.Annotations[locksv1alpha1.RevokedAnnotation] = holder
	l.Spec.RenewTime = new(metav1.NewMicroTime(now))
	return true
}
