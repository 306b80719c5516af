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
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

const (
	// leaseNameIndex indexes DistributedLocks by the name of their Lease, so
	// a Lease event finds its lock whether or not the Lease is owned yet.
	leaseNameIndex = "locks.frontdesk.dev/lease-name"
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
	pending      *pendingEvents
	passed       *passedPlaces
	podNotes     *podNotes
}

// +kubebuilder:rbac:groups=locks.frontdesk.dev,resources=distributedlocks,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=locks.frontdesk.dev,resources=distributedlocks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.frontdesk.dev,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get

// Reconcile fetches the lock and hands it to reconcile.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := &locksv1alpha1.DistributedLock{}
	if err := r.Get(ctx, req.NamespacedName, lock); err != nil {
		if apierrors.IsNotFound(err) {
			r.observations.Forget(req.String())
			r.metrics.forget(req.NamespacedName)
			r.highWater.forget(req.NamespacedName)
			r.pending.forget(req.NamespacedName)
			r.passed.forget(req.NamespacedName)
			if err := r.warnWaitingForMissingLock(ctx, req.NamespacedName); err != nil {
				return ctrl.Result{}, err
			}
			return r.releaseOrphanRecords(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, fmt.Errorf("reading distributedlock %s: %w", req.NamespacedName, err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("distributedlock", klog.KObj(lock))
	ctx = ctrl.LoggerInto(ctx, log)

	result, err := r.reconcile(ctx, lock)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		// Someone else wrote first. The pass runs again from a fresh read
		// of the cache, paced by the controller's rate limiter (per-lock
		// exponential backoff); nothing is retried blindly.
		return ctrl.Result{}, fmt.Errorf("lost a write race, retrying from a fresh read: %w", err)
	}
	return result, err
}

// reconcile does one pass: lease in place, one status write, events after.
// The events of Lease writes of a pass that fails after them wait for the
// next pass (pendingEvents).
func (r *DistributedLockReconciler) reconcile(ctx context.Context, lock *locksv1alpha1.DistributedLock) (_ ctrl.Result, err error) {
	if !lock.DeletionTimestamp.IsZero() {
		return r.finalizeLock(ctx, lock)
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
	lockKey := client.ObjectKeyFromObject(lock)
	leaseEvents = append(r.pending.take(lockKey, lock.UID), leaseEvents...)
	defer func() {
		if err != nil {
			r.pending.keep(lockKey, lock.UID, leaseEvents)
		}
	}()
	// Taken after the Lease was read (it may come from the apiserver, not
	// the cache): every record observed in this pass existed by now.
	now := r.Clock.Now()

	var pass grantPass
	if state.lease != nil {
		pass, err = r.syncGrants(ctx, lock, &state, now)
		// The events of the writes made are kept for the next pass if this
		// one fails.
		leaseEvents = append(leaseEvents, pass.events...)
		if err != nil {
			return ctrl.Result{}, err
		}
	}
	obs := pass.obs

	res := deriveStatus(statusInput{lock: lock, lease: state, observation: obs, now: now,
		highWater: r.highWater.get(lockKey)})
	setGatedPods(&res.status, pass.gatedPods)
	grantToken := obs.Record.Token
	controllerGrant := isControllerGrant(state.lease, obs.Record.Holder)
	if res.status.HolderPod, err = r.holderPodName(ctx, lock, &res.status, grantToken, controllerGrant); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.updateStatus(ctx, lock, res.status); err != nil {
		return ctrl.Result{}, err
	}
	lapseIn, err := r.releaseTerminatingLease(ctx, lock, state.lease, obs, now)
	result := ctrl.Result{RequeueAfter: earliest(res.expiresIn, pass.renewIn, state.retryIn, lapseIn)}
	if err != nil {
		return result, err
	}
	if err := r.markHolderPod(ctx, lock, oldStatus.HolderPod, &lock.Status, grantToken); err != nil {
		// Marks are for workloads' convenience; a failure must not delay
		// the renewal this pass scheduled. The next pass tries again.
		ctrl.LoggerFrom(ctx).Error(err, "marking the holder pod")
	}
	leaseEvents = newLeaseEvents(oldStatus, state.reason, leaseEvents)
	statusEvents := statusEventsBesides(leaseEvents, res.events)
	r.metrics.statusWritten(lockKey, &lock.Status, r.Clock.Now())
	r.metrics.observed(lockKey, append(candidateTransitions(leaseEvents), statusEvents...), now)
	r.recordEvents(lock, state.lease, append(leaseEvents, statusEvents...))
	return result, nil
}

// statusEventsBesides drops the status-derived events that the lease
// events of the same pass already explain better: the TakenOver of a
// candidates-mode hand-off (reported as HandedOff), and the Released or
// Broken that a recreated Lease or a restored token floor looks like.
func statusEventsBesides(leaseEvents, statusEvents []lockEvent) []lockEvent {
	has := func(reason string) bool {
		return slices.ContainsFunc(leaseEvents, func(e lockEvent) bool { return e.reason == reason })
	}
	drop := map[string]bool{}
	if has(EventHandedOff) {
		drop[EventTakenOver] = true
	}
	if has(EventLeaseRecreated) || has(EventTokenFloorRestored) {
		drop[EventReleased], drop[EventBroken] = true, true
	}
	return slices.DeleteFunc(slices.Clone(statusEvents), func(e lockEvent) bool { return drop[e.reason] })
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

// newLeaseEvents drops a warning (LeaseConflict, SelectorInvalid) that the
// lock's Ready condition already reported for the same reason, so every
// pass over a foreign Lease or a bad selector does not repeat it.
func newLeaseEvents(old *locksv1alpha1.DistributedLockStatus, readyReason string, evs []lockEvent) []lockEvent {
	ready := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionReady)
	repeated := ready != nil && ready.Reason == readyReason
	return slices.DeleteFunc(slices.Clone(evs), func(ev lockEvent) bool {
		return repeated && recurringWarning(ev.reason)
	})
}

// recurringWarning reports whether a lease event is a warning every pass
// repeats while its cause lasts (a foreign Lease, a bad selector), not the
// report of a write.
func recurringWarning(reason string) bool {
	return reason == EventLeaseConflict || reason == EventSelectorInvalid
}

func (r *DistributedLockReconciler) recordEvents(lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease, evs []lockEvent) {
	for _, ev := range evs {
		var related runtime.Object
		if l != nil {
			related = l
		}
		r.Recorder.Eventf(lock, related, ev.eventType, ev.reason, eventAction, "%s", ev.note)
	}
}

// locksForLease maps a Lease event to the locks backed by that Lease, and
// notes the event for the status-lag metric and the token high-water mark.
func (r *DistributedLockReconciler) locksForLease(ctx context.Context, obj client.Object) []reconcile.Request {
	locks, err := r.locksBackedBy(ctx, obj)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing locks for lease", "lease", klog.KObj(obj))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(locks)+1)
	now := r.Clock.Now()
	leaseObj, isLease := obj.(*coordinationv1.Lease)
	for i := range locks {
		key := types.NamespacedName{Namespace: locks[i].Namespace, Name: locks[i].Name}
		r.metrics.leaseChanged(key, now)
		if isLease && ownedBy(leaseObj, &locks[i]) {
			r.highWater.observe(key, leaseObj)
		}
		reqs = append(reqs, reconcile.Request{NamespacedName: key})
	}
	// A record (tied to no lock) being deleted: the lock of its name, if
	// there is none, lets it go when its namespace is going.
	if name := obj.GetLabels()[locksv1alpha1.LockNameLabel]; isLease && name != "" && obj.GetDeletionTimestamp() != nil && lease.ControllerUID(leaseObj) == "" {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}})
	}
	return reqs
}

// locksBackedBy lists the locks whose Lease obj is (by name, whether or not
// the Lease is owned yet).
func (r *DistributedLockReconciler) locksBackedBy(ctx context.Context, obj client.Object) ([]locksv1alpha1.DistributedLock, error) {
	var locks locksv1alpha1.DistributedLockList
	if err := r.List(ctx, &locks, client.InNamespace(obj.GetNamespace()),
		client.MatchingFields{leaseNameIndex: obj.GetName()}); err != nil {
		return nil, err
	}
	return locks.Items, nil
}

// ownedBy reports whether the Lease is controlled by the lock (tokens of a
// Lease the lock does not control are not the lock's).
func ownedBy(l *coordinationv1.Lease, lock *locksv1alpha1.DistributedLock) bool {
	return lease.ControllerUID(l) == lock.UID
}

// locksForPod maps a Pod event to the locks it may matter to: locks whose
// candidates it may be, locks it holds or is marked as holding, and the
// lock it runs holding (locks.frontdesk.dev/runs-holding), existing or not.
func (r *DistributedLockReconciler) locksForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	var locks locksv1alpha1.DistributedLockList
	if err := r.List(ctx, &locks, client.InNamespace(obj.GetNamespace())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing locks for pod", "pod", klog.KObj(obj))
		return nil
	}
	runsHolding := obj.GetAnnotations()[locksv1alpha1.RunsHoldingAnnotation]
	var reqs []reconcile.Request
	for i := range locks.Items {
		l := &locks.Items[i]
		_, marked := obj.GetLabels()[locksv1alpha1.HolderLabelKey(l.Name)]
		holds := l.Status.HolderPod == obj.GetName() || locksv1alpha1.PodNameOf(l.Status.Holder) == obj.GetName()
		if marked || holds || candidateOf(l, obj) || runsHolding == l.Name {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: l.Namespace, Name: l.Name}})
		}
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		r.warnOptInMistakes(pod, locks.Items)
	}
	return reqs
}

// candidateOf reports whether the lock's candidate selector picks obj.
func candidateOf(l *locksv1alpha1.DistributedLock, obj client.Object) bool {
	if l.Spec.Candidates == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(l.Spec.Candidates.PodSelector.LabelSelector())
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
	r.pending = newPendingEvents()
	r.passed = newPassedPlaces()
	r.podNotes = newPodNotes()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &locksv1alpha1.DistributedLock{}, leaseNameIndex,
		func(o client.Object) []string {
			l := o.(*locksv1alpha1.DistributedLock)
			if recorded := leaseNameOf(l); recorded != l.EffectiveLeaseName() {
				return []string{recorded, l.EffectiveLeaseName()}
			}
			return []string{l.EffectiveLeaseName()}
		}); err != nil {
		return fmt.Errorf("indexing distributedlocks by lease name: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&locksv1alpha1.DistributedLock{}).
		Watches(&coordinationv1.Lease{}, r.leaseEvents()).
		Watches(&corev1.Pod{}, r.podEvents()).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1), SkipNameValidation: &r.SkipNameValidation}).
		Named("distributedlock").
		Complete(r)
}
