// Package controllers reconciles DistributedLocks against the
// coordination.k8s.io/v1 Leases that back them.
package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

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
	// Principal is what the controller's own grants (candidates mode,
	// admitted pods) and its places for admitted pods record as their
	// principal: "user=<the manager's username>" (lease.Principal, with no
	// pod, so that every replica and restart of the manager writes the
	// same). No participant can write a grant or place bound to it: the
	// lease-guard policy binds each to the principal of its request.
	Principal string
	// MaxConcurrentReconciles bounds parallel reconciles (default 1).
	MaxConcurrentReconciles int
	// SkipNameValidation allows a second controller of this name in the
	// process (several local environments in one tool).
	SkipNameValidation bool
	// HolderPods is a cache of every pod (whatever its labels), kept slim,
	// where the controller finds the pod whose token made a grant, and
	// sees it die (failover on proof, proof.go). Nil: grants are ended by
	// their lease only.
	HolderPods cache.Cache

	// memories is what the process remembers between passes.
	*memories
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
			r.forget(req.NamespacedName)
			if err := r.warnWaitingForMissingLock(ctx, req.NamespacedName); err != nil {
				return ctrl.Result{}, err
			}
			return r.releaseOrphanRecords(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, fmt.Errorf("reading distributedlock %s: %w", req.NamespacedName, err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("distributedlock", klog.KObj(lock))
	ctx = ctrl.LoggerInto(ctx, log)
	if r.written.behind(req.NamespacedName, lock.ResourceVersion) {
		// The cache has not brought this controller's own last write of
		// the lock yet; its event brings the next pass.
		log.V(1).Info("skipping a pass: the cache still shows the lock before this controller's last write")
		return ctrl.Result{}, nil
	}

	result, err := r.reconcile(ctx, lock)
	if lostRace(err) {
		// Someone else wrote first. The pass runs again from a fresh read
		// of the cache, paced by the controller's rate limiter (per-lock
		// exponential backoff); nothing is retried blindly.
		return ctrl.Result{}, fmt.Errorf("lost a write race, retrying from a fresh read: %w", err)
	}
	return result, err
}

// reconcile does one pass over the lock: its Lease in place, the grants on
// it judged, one status write, events after. The steps are numbered as in
// docs/design.md ("One pass of the reconciler"); step 1, reading the lock,
// is Reconcile's. The events of Lease writes of a pass that fails after
// them wait for the next pass (pendingEvents).
func (r *DistributedLockReconciler) reconcile(ctx context.Context, lock *locksv1alpha1.DistributedLock) (_ ctrl.Result, err error) {
	// 2. Deleted: retire or hand back the Lease, clear pod marks, let it go.
	if !lock.DeletionTimestamp.IsZero() {
		return r.finalizeLock(ctx, lock)
	}
	// 3. Ensure the lock's cleanup finalizer.
	if err := r.ensureFinalizer(ctx, lock); err != nil {
		return ctrl.Result{}, err
	}
	// 4. Ensure the Lease; the pass starts from it and a failed pass's events.
	p, err := r.startPass(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer r.keepEventsIfFailed(p, &err)
	// 5. Observe the Lease's record on the controller's clock.
	r.observeLease(p)
	// 6. Repair the queue: entries nobody can read, places of pods gone.
	r.repairQueueStep(ctx, p)
	// 7. Candidates mode: renew, revoke, hand off or grant.
	r.candidatesStep(ctx, p)
	// 8. Lock-admitted pods: tend the grant held for one, queue the waiting,
	//    take the grant for the pod whose turn came, ungate the confirmed.
	r.admissionsStep(ctx, p)
	// 9. End a grant as lapsed; remove the places whose turn passed. A step
	//    of 6 to 9 that lost a write race ends the pass; others fail it later.
	r.lapseStep(ctx, p)
	stepErr := p.stepErr()
	if lostRace(stepErr) {
		return ctrl.Result{}, stepErr
	}
	// 10. A grant landed during the pass (an event showed a newer token):
	//     no status from the older record; that event brings the next pass,
	//     and this pass's events wait for it (a failed pass keeps them).
	if r.judgedStale(ctx, p) {
		if stepErr == nil {
			r.pending.keep(p.key, p.lock.UID, p.events)
		}
		return ctrl.Result{RequeueAfter: time.Second}, stepErr
	}
	// 11. Derive the new status in memory.
	if err := r.passStatus(ctx, p); err != nil {
		return ctrl.Result{}, err
	}
	// 12. One status write, only if something changed.
	if err := r.updateStatus(ctx, lock, p.status.status); err != nil {
		return ctrl.Result{}, err
	}
	// 13. If the Lease is terminating and its token is now recorded,
	//     release its finalizer.
	if err := r.releaseTerminatingLease(ctx, p); err != nil {
		return p.result(), err
	}
	// 14. Mark the holder pod; a failure is only logged (see markHolder).
	r.markHolder(ctx, p)
	// 15. Record events for what changed, after the status write succeeded.
	r.recordPassEvents(p)
	// 16. Come back at the earliest deadline.
	return p.result(), stepErr
}

// keepEventsIfFailed keeps the pass's events for the next pass of the lock
// when the pass ends with an error (*err).
func (r *DistributedLockReconciler) keepEventsIfFailed(p *pass, err *error) {
	if *err != nil {
		r.pending.keep(p.key, p.lock.UID, p.events)
	}
}

// markHolder marks the holder pod as the pass's status names it (see
// markHolderPod). Marks are for workloads' convenience: a failure is
// logged, and must not delay the renewal this pass scheduled; the next
// pass tries again.
func (r *DistributedLockReconciler) markHolder(ctx context.Context, p *pass) {
	if err := r.markHolderPod(ctx, p.lock, p.oldStatus.HolderPod, &p.lock.Status, p.obs.Record.Token); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "marking the holder pod")
	}
}

// ensureFinalizer adds the lock's cleanup finalizer when it is missing, in
// one Update carrying the lock's resourceVersion.
func (r *DistributedLockReconciler) ensureFinalizer(ctx context.Context, lock *locksv1alpha1.DistributedLock) error {
	if !controllerutil.AddFinalizer(lock, locksv1alpha1.LockCleanupFinalizer) {
		return nil
	}
	before := lock.ResourceVersion
	if err := r.Update(ctx, lock); err != nil {
		return fmt.Errorf("adding finalizer: %w", err)
	}
	r.written.wrote(client.ObjectKeyFromObject(lock), before)
	return nil
}

// judgedStale reports whether the record the pass judged is older than a
// token an event of its Lease already showed (a grant landed during the
// pass; see staleness.go). It reads the token high water the status is
// derived with.
func (r *DistributedLockReconciler) judgedStale(ctx context.Context, p *pass) bool {
	p.highWater = r.highWater.get(p.key)
	if p.state.lease == nil || !p.state.ready || p.highWater <= lease.Token(p.state.lease) {
		return false
	}
	ctrl.LoggerFrom(ctx).V(1).Info("skipping the status write: an event already showed a newer token than the record judged",
		"judged", lease.Token(p.state.lease), "seen", p.highWater)
	return true
}

// passStatus derives the lock's new status in memory (deriveStatus, pure),
// with the pods waiting, the queue's length, the Guarded condition and the
// holder pod.
func (r *DistributedLockReconciler) passStatus(ctx context.Context, p *pass) error {
	res := deriveStatus(statusInput{lock: p.lock, lease: p.state, observation: p.obs, now: p.now,
		highWater: p.highWater, provenDead: p.provenDead})
	setGatedPods(&res.status, p.gatedPods)
	res.status.Waiting = 0
	if p.state.lease != nil {
		res.status.Waiting = int32(len(lease.Queue(p.state.lease)))
	}
	grant := grantOwner{token: p.obs.Record.Token, controllers: r.isControllerGrant(p.state.lease, p.obs.Record.Holder)}
	if p.state.lease != nil {
		grant.principal = p.state.lease.Annotations[locksv1alpha1.HolderPrincipalAnnotation]
	}
	guarded, why, err := r.leaseGuardIn(ctx, p.lock.Namespace)
	if err != nil {
		return err
	}
	setGuarded(&res.status, p.lock.Generation, guarded, why)
	var notMarked *lockEvent
	if res.status.HolderPod, notMarked, err = r.holderPodName(ctx, p.lock, &res.status, grant); err != nil {
		return err
	}
	if notMarked != nil {
		res.events = append(res.events, *notMarked)
	}
	p.status = res
	return nil
}

// recordPassEvents records the pass's events once its status is written:
// the Lease events (less a warning the Ready condition already reported)
// and the status events they do not explain better; it counts the
// transitions and the status write's lag. None are then kept for the next
// pass.
func (r *DistributedLockReconciler) recordPassEvents(p *pass) {
	leaseEvents := newLeaseEvents(p.oldStatus, p.state.reason, p.events)
	statusEvents := statusEventsBesides(leaseEvents, p.status.events)
	r.metrics.statusWritten(p.key, &p.lock.Status, r.Clock.Now())
	r.metrics.observed(p.key, append(candidateTransitions(leaseEvents), statusEvents...), p.now)
	r.recordEvents(p.lock, p.state.lease, append(leaseEvents, statusEvents...))
	p.events = nil // recorded: none kept for the next pass
}

// statusEventsBesides drops the status-derived events that the lease
// events of the same pass already explain better: the TakenOver of a
// candidates-mode hand-off (reported as HandedOff), the Expired of a
// proven-dead holder's grant (reported as HolderProvenDead), and the
// Released or Broken that a recreated Lease or a restored token floor
// looks like.
func statusEventsBesides(leaseEvents, statusEvents []lockEvent) []lockEvent {
	has := func(reason string) bool {
		return slices.ContainsFunc(leaseEvents, func(e lockEvent) bool { return e.reason == reason })
	}
	drop := map[string]bool{}
	if has(EventHandedOff) {
		drop[EventTakenOver] = true
	}
	if has(EventHolderProvenDead) {
		drop[EventExpired] = true
	}
	if has(EventLeaseRecreated) || has(EventTokenFloorRestored) {
		drop[EventReleased], drop[EventBroken] = true, true
	}
	return slices.DeleteFunc(slices.Clone(statusEvents), func(e lockEvent) bool { return drop[e.reason] })
}

// candidateTransitions are the lease events that are lock transitions: a
// candidates-mode hand-off, the end of a proven-dead holder's grant.
func candidateTransitions(leaseEvents []lockEvent) []lockEvent {
	return slices.DeleteFunc(slices.Clone(leaseEvents), func(e lockEvent) bool {
		return e.reason != EventHandedOff && e.reason != EventHolderProvenDead
	})
}

// updateStatus writes status when it changed. The Update carries the lock's
// resourceVersion, so a stale read can never overwrite a newer token.
func (r *DistributedLockReconciler) updateStatus(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	status locksv1alpha1.DistributedLockStatus) error {
	if equality.Semantic.DeepEqual(lock.Status, status) {
		return nil
	}
	lock.Status = status
	before := lock.ResourceVersion
	if err := r.Status().Update(ctx, lock); err != nil {
		return fmt.Errorf("updating status: %w", err)
	}
	r.written.wrote(client.ObjectKeyFromObject(lock), before)
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
	r.memories = newMemories()
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
	if err := indexLeasesByHolderPod(ctx, mgr); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&locksv1alpha1.DistributedLock{}).
		Watches(&coordinationv1.Lease{}, r.leaseEvents()).
		Watches(&corev1.Pod{}, r.podEvents()).
		Watches(&admissionregistrationv1.ValidatingAdmissionPolicy{}, r.allLocks()).
		Watches(&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, r.allLocks())
	if r.HolderPods != nil {
		if err := r.indexPodsByUID(ctx); err != nil {
			return err
		}
		b = b.WatchesRawSource(source.Kind[client.Object](r.HolderPods, &corev1.Pod{}, r.holderPodEvents()))
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1), SkipNameValidation: &r.SkipNameValidation}).
		Named("distributedlock").
		Complete(r)
}
