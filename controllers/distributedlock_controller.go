// Package controllers reconciles DistributedLocks against the
// coordination.k8s.io/v1 Leases that back them.
package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

const (
	// leaseNameIndex indexes DistributedLocks by the name of their Lease, so
	// a Lease event finds its lock whether or not the Lease is owned yet.
	leaseNameIndex = "locks.frontdesk.dev/lease-name"
	// conflictRetryDelay is how soon a pass that lost a compare-and-swap
	// race runs again, from a fresh read of the cache.
	conflictRetryDelay = 100 * time.Millisecond
	// eventAction is the action recorded on Events this controller emits.
	eventAction = "ObserveLease"
)

// DistributedLockReconciler keeps each DistributedLock's Lease in place and
// mirrors the Lease's holder and fencing token into the lock's status.
type DistributedLockReconciler struct {
	client.Client
	// APIReader reads around the cache, where a stale read could cost a
	// fencing token (the floor a recreated Lease starts from).
	APIReader client.Reader
	// Scheme is used to set owner references on Leases.
	Scheme *runtime.Scheme
	// Recorder records Events on DistributedLocks.
	Recorder events.EventRecorder
	// Clock is the controller's time source; expiry is judged on it.
	Clock clock.PassiveClock
	// MaxConcurrentReconciles bounds parallel reconciles (default 1).
	MaxConcurrentReconciles int
	// SkipNameValidation allows a second controller of this name in the
	// process (several local environments in one tool).
	SkipNameValidation bool

	observations *lease.Observer
	metrics      *lockMetrics
	highWater    *tokenHighWater
}

// +kubebuilder:rbac:groups=locks.frontdesk.dev,resources=distributedlocks,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=locks.frontdesk.dev,resources=distributedlocks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.frontdesk.dev,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile fetches the lock and hands it to reconcile.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := &locksv1alpha1.DistributedLock{}
	if err := r.Get(ctx, req.NamespacedName, lock); err != nil {
		if apierrors.IsNotFound(err) {
			r.observations.Forget(req.NamespacedName.String())
			r.metrics.forget(req.NamespacedName)
			r.highWater.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading distributedlock %s: %w", req.NamespacedName, err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("distributedlock", klog.KObj(lock))
	ctx = ctrl.LoggerInto(ctx, log)

	result, err := r.reconcile(ctx, lock)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		// Someone else wrote first; the watch brings the newer object.
		log.V(1).Info("lost a write race; retrying from a fresh read", "reason", err.Error())
		return ctrl.Result{RequeueAfter: conflictRetryDelay}, nil
	}
	return result, err
}

// reconcile does one pass: lease in place, one status write, events after.
func (r *DistributedLockReconciler) reconcile(ctx context.Context, lock *locksv1alpha1.DistributedLock) (ctrl.Result, error) {
	if !lock.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalizeLock(ctx, lock)
	}
	if controllerutil.AddFinalizer(lock, locksv1alpha1.LockCleanupFinalizer) {
		if err := r.Update(ctx, lock); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
	}

	oldStatus := lock.Status.DeepCopy()
	state, leaseEvents, err := r.ensureLease(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}

	now := r.Clock.Now()
	key := client.ObjectKeyFromObject(lock).String()
	var obs lease.Observation
	var renewIn time.Duration
	if state.lease != nil {
		obs = r.observations.Observe(key, lease.RecordOf(state.lease), now)
		cand, err := r.reconcileCandidates(ctx, lock, state.lease, obs, now)
		if err != nil {
			return ctrl.Result{}, err
		}
		if cand.lease != state.lease {
			state.lease = cand.lease
			obs = r.observations.Observe(key, lease.RecordOf(cand.lease), now)
		}
		leaseEvents, renewIn = append(leaseEvents, cand.events...), cand.renewIn
	}

	res := deriveStatus(statusInput{lock: lock, lease: state, observation: obs, now: now,
		highWater: r.highWater.get(client.ObjectKeyFromObject(lock))})
	grantToken := int64(obs.Record.Transitions)
	if res.status.HolderPod, err = r.holderPodName(ctx, lock, &res.status, grantToken); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.updateStatus(ctx, lock, res.status); err != nil {
		return ctrl.Result{}, err
	}
	result := ctrl.Result{RequeueAfter: earliest(res.expiresIn, renewIn)}
	if err := r.releaseTerminatingLease(ctx, lock, state.lease); err != nil {
		return result, err
	}
	if err := r.markHolderPod(ctx, lock, oldStatus.HolderPod, &lock.Status, grantToken); err != nil {
		// Marks are for workloads' convenience; a failure must not delay
		// the renewal this pass scheduled. The next pass tries again.
		ctrl.LoggerFrom(ctx).Error(err, "marking the holder pod")
	}
	statusEvents := handedOffOverTakenOver(leaseEvents, res.events)
	lockKey := client.ObjectKeyFromObject(lock)
	r.metrics.statusWritten(lockKey, &lock.Status, r.Clock.Now())
	r.metrics.observed(lockKey, append(candidateTransitions(leaseEvents), statusEvents...), now)
	r.recordEvents(lock, state.lease, append(newLeaseEvents(oldStatus, leaseEvents), statusEvents...))
	return result, nil
}

// handedOffOverTakenOver drops the TakenOver the status derives for a grant
// the controller itself made in candidates mode (reported as HandedOff).
func handedOffOverTakenOver(leaseEvents, statusEvents []lockEvent) []lockEvent {
	if !slices.ContainsFunc(leaseEvents, func(e lockEvent) bool { return e.reason == EventHandedOff }) {
		return statusEvents
	}
	return slices.DeleteFunc(slices.Clone(statusEvents), func(e lockEvent) bool { return e.reason == EventTakenOver })
}

// candidateTransitions are the lease events that are lock transitions.
func candidateTransitions(leaseEvents []lockEvent) []lockEvent {
	return slices.DeleteFunc(slices.Clone(leaseEvents), func(e lockEvent) bool { return e.reason != EventHandedOff })
}

// updateStatus writes status when it changed. The Update carries the lock's
// resourceVersion, so a stale read can never overwrite a newer token.
func (r *DistributedLockReconciler) updateStatus(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	status locksv1alpha1.DistributedLockStatus) error {
	if equality.Semantic.DeepEqual(lock.Status, status) {
		return nil
	}
	lock.Status = status
	if err := r.Status().Update(ctx, lock); err != nil {
		return fmt.Errorf("updating status: %w", err)
	}
	return nil
}

// finalizeLock deletes the lock's Lease and then lets the lock go.
func (r *DistributedLockReconciler) finalizeLock(ctx context.Context, lock *locksv1alpha1.DistributedLock) error {
	if !controllerutil.ContainsFinalizer(lock, locksv1alpha1.LockCleanupFinalizer) {
		return nil
	}
	if err := r.deleteLease(ctx, lock); err != nil {
		return err
	}
	controllerutil.RemoveFinalizer(lock, locksv1alpha1.LockCleanupFinalizer)
	if err := r.Update(ctx, lock); err != nil {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	r.observations.Forget(client.ObjectKeyFromObject(lock).String())
	r.metrics.forget(client.ObjectKeyFromObject(lock))
	r.highWater.forget(client.ObjectKeyFromObject(lock))
	return nil
}

// earliest is the smallest positive duration, or zero if none is.
func earliest(ds ...time.Duration) time.Duration {
	var out time.Duration
	for _, d := range ds {
		if d > 0 && (out == 0 || d < out) {
			out = d
		}
	}
	return out
}

// newLeaseEvents drops a LeaseConflict the lock already reports, so a
// foreign Lease's every change does not repeat the warning.
func newLeaseEvents(old *locksv1alpha1.DistributedLockStatus, evs []lockEvent) []lockEvent {
	ready := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionReady)
	out := evs[:0:0]
	for _, ev := range evs {
		if ev.reason == EventLeaseConflict && ready != nil && ready.Reason == locksv1alpha1.ReasonLeaseOwnedByOther {
			continue
		}
		out = append(out, ev)
	}
	return out
}

func (r *DistributedLockReconciler) recordEvents(lock *locksv1alpha1.DistributedLock, lease *coordinationv1.Lease, evs []lockEvent) {
	for _, ev := range evs {
		var related runtime.Object
		if lease != nil {
			related = lease
		}
		r.Recorder.Eventf(lock, related, ev.eventType, ev.reason, eventAction, "%s", ev.note)
	}
}

// locksForLease maps a Lease event to the locks backed by that Lease.
func (r *DistributedLockReconciler) locksForLease(ctx context.Context, obj client.Object) []reconcile.Request {
	var locks locksv1alpha1.DistributedLockList
	if err := r.List(ctx, &locks, client.InNamespace(obj.GetNamespace()),
		client.MatchingFields{leaseNameIndex: obj.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing locks for lease", "lease", klog.KObj(obj))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(locks.Items))
	now := r.Clock.Now()
	leaseObj, isLease := obj.(*coordinationv1.Lease)
	for i := range locks.Items {
		key := types.NamespacedName{Namespace: locks.Items[i].Namespace, Name: locks.Items[i].Name}
		r.metrics.leaseChanged(key, now)
		if isLease && ownedBy(leaseObj, &locks.Items[i]) {
			r.highWater.observe(key, leaseObj)
		}
		reqs = append(reqs, reconcile.Request{NamespacedName: key})
	}
	return reqs
}

// ownedBy reports whether the Lease is controlled by the lock (tokens of a
// Lease the lock does not control are not the lock's).
func ownedBy(l *coordinationv1.Lease, lock *locksv1alpha1.DistributedLock) bool {
	owner := metav1.GetControllerOf(l)
	return owner != nil && owner.UID == lock.UID
}

// locksForPod maps a Pod event to the locks it may matter to: locks whose
// candidates it may be, and locks it holds or is marked as holding.
func (r *DistributedLockReconciler) locksForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	var locks locksv1alpha1.DistributedLockList
	if err := r.List(ctx, &locks, client.InNamespace(obj.GetNamespace())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing locks for pod", "pod", klog.KObj(obj))
		return nil
	}
	var reqs []reconcile.Request
	for i := range locks.Items {
		l := &locks.Items[i]
		_, marked := obj.GetLabels()[locksv1alpha1.HolderLabelKey(l.Name)]
		if marked || l.Status.HolderPod == obj.GetName() || candidateOf(l, obj) {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: l.Namespace, Name: l.Name}})
		}
	}
	return reqs
}

// candidateOf reports whether the lock's candidate selector picks obj.
func candidateOf(l *locksv1alpha1.DistributedLock, obj client.Object) bool {
	if l.Spec.Candidates == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(&l.Spec.Candidates.PodSelector)
	return err == nil && sel.Matches(labels.Set(obj.GetLabels()))
}

// SetupWithManager registers the controller, its index and its watches.
func (r *DistributedLockReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	r.observations = lease.NewObserver()
	r.metrics = newLockMetrics()
	r.highWater = newTokenHighWater()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &locksv1alpha1.DistributedLock{}, leaseNameIndex,
		func(o client.Object) []string {
			return []string{o.(*locksv1alpha1.DistributedLock).EffectiveLeaseName()}
		}); err != nil {
		return fmt.Errorf("indexing distributedlocks by lease name: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&locksv1alpha1.DistributedLock{}).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(r.locksForLease)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.locksForPod)).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1), SkipNameValidation: &r.SkipNameValidation}).
		Named("distributedlock").
		Complete(r)
}
