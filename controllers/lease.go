package controllers

import (
	"context"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// ensureLease reads the lock's Lease and brings it in line: creates it when
// missing (continuing from the highest token recorded for the lock's name),
// adopts an unowned one when that is allowed, and restores the token floor
// when the Lease fell behind it. Every write is an Update carrying the
// resourceVersion that was read, so a concurrent grant makes it fail rather
// than be overwritten.
func (r *DistributedLockReconciler) ensureLease(ctx context.Context, lock *locksv1alpha1.DistributedLock) (leaseState, []lockEvent, error) {
	state, events, err := r.ensureRecordedLease(ctx, lock)
	if err != nil || state.lease == nil || lock.Status.LeaseName == "" || lock.Status.LeaseName == lock.EffectiveLeaseName() {
		return state, events, err
	}
	// The apiserver refuses a change of spec.leaseName; an object that
	// slipped through (an older CRD) keeps being served by its recorded
	// Lease, whose holder may still be acting.
	state.ready, state.reason = false, locksv1alpha1.ReasonLeaseNameChanged
	state.message = fmt.Sprintf("spec.leaseName names Lease %s, but this lock's tokens live on Lease %s, which it keeps using: "+
		"leaseName cannot be changed; delete the lock and create one with the new leaseName", lock.EffectiveLeaseName(), lock.Status.LeaseName)
	return state, events, nil
}

// readLease reads a Lease from the cache, which holds only Leases that
// carry the lock label; one it does not hold (not adopted yet, or just
// created) is read from the apiserver.
func (r *DistributedLockReconciler) readLease(ctx context.Context, key types.NamespacedName) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	err := r.Get(ctx, key, l)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, l)
	}
	return l, err
}

// leaseNameOf is the Lease the lock is served by: the one recorded in its
// status, else the one its spec names.
func leaseNameOf(lock *locksv1alpha1.DistributedLock) string {
	if lock.Status.LeaseName != "" {
		return lock.Status.LeaseName
	}
	return lock.EffectiveLeaseName()
}

func (r *DistributedLockReconciler) ensureRecordedLease(ctx context.Context, lock *locksv1alpha1.DistributedLock) (leaseState, []lockEvent, error) {
	key := types.NamespacedName{Namespace: lock.Namespace, Name: leaseNameOf(lock)}
	current, err := r.readLease(ctx, key)
	// Observed after the read: a Lease read from the apiserver may show a
	// write that committed while the read was on its way, and an
	// observation must never be timed before the record existed.
	now := r.Clock.Now()
	if apierrors.IsNotFound(err) {
		return r.createLease(ctx, lock, key.Name)
	}
	if err != nil {
		return leaseState{}, nil, fmt.Errorf("reading lease %s: %w", key, err)
	}
	if state, events, blocked := r.leaseBlocked(lock, current, now); blocked {
		return state, events, nil
	}
	if current.DeletionTimestamp != nil {
		return leaseState{lease: current, reason: locksv1alpha1.ReasonLeaseTerminating,
			message: fmt.Sprintf("Lease %s is being deleted; it will be recreated with its fencing token preserved", key.Name)}, nil, nil
	}
	updated, events, err := r.syncLease(ctx, lock, current)
	if err != nil {
		return leaseState{}, nil, err
	}
	if lease.Exhausted(updated) {
		return r.endTokenEpoch(ctx, updated, events)
	}
	return leaseState{lease: updated, ready: true, reason: locksv1alpha1.ReasonLeaseReady,
		message: fmt.Sprintf("Lease %s is in sync", key.Name)}, events, nil
}

// endTokenEpoch starts the next token epoch on l, whose leaseTransitions is
// at its maximum, once no live grant holds it (free, or its grant marked
// lapsed): every later token is then above every token of the epoch that
// ended. While a live grant holds it, the lock is not Ready and says so.
func (r *DistributedLockReconciler) endTokenEpoch(ctx context.Context, l *coordinationv1.Lease, events []lockEvent) (leaseState, []lockEvent, error) {
	if lease.Holder(l) != "" {
		return leaseState{lease: l, reason: locksv1alpha1.ReasonTokensExhausted, message: fmt.Sprintf(
			"Lease %s is at the last fencing token of its epoch (%d): no further grant can be made until %s releases it "+
				"or its grant lapses; the controller then starts a new token epoch and tokens continue from %d",
			l.Name, lease.Token(l), lease.Holder(l), (lease.Epoch(l)+1)*lease.EpochSize+1)}, events, nil
	}
	next := lease.NewEpoch(l)
	if err := r.Update(ctx, next); err != nil {
		return leaseState{}, nil, fmt.Errorf("starting a new token epoch on lease %s: %w", l.Name, err)
	}
	events = append(events, lockEvent{corev1.EventTypeNormal, EventTokenEpochStarted, fmt.Sprintf(
		"the fencing tokens of Lease %s's epoch %d are used up (%d): started epoch %d; the next grant carries token %d",
		l.Name, lease.Epoch(l), lease.Token(l), lease.Epoch(next), lease.Token(next)+1)})
	return leaseState{lease: next, ready: true, reason: locksv1alpha1.ReasonLeaseReady,
		message: fmt.Sprintf("Lease %s is in sync", l.Name)}, events, nil
}

// leaseBlocked reports whether the lock may not use the existing Lease (yet):
// another object controls it, it keeps the tokens of another deleted lock,
// or frontdesk did not create it and it is held (adopted once it is free,
// unless spec.leaseAdoption says WhileHeld). A Lease that names a lock of
// this very name with another UID was that lock's: the lock was deleted
// since (two locks of one name cannot exist at once), so it is this name's
// record.
func (r *DistributedLockReconciler) leaseBlocked(lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease, now time.Time) (leaseState, []lockEvent, bool) {
	conflict := func(msg string) (leaseState, []lockEvent, bool) {
		return leaseState{reason: locksv1alpha1.ReasonLeaseOwnedByOther, message: msg},
			[]lockEvent{{corev1.EventTypeWarning, EventLeaseConflict, msg}}, true
	}
	recordOf := l.Labels[locksv1alpha1.LockNameLabel]
	if owner := lease.ForeignController(l); owner != nil {
		return conflict(fmt.Sprintf("Lease %s is controlled by %s %s, so this lock cannot use it; spec.leaseName cannot be changed: "+
			"delete this lock and create it again with a leaseName no other object controls", l.Name, owner.Kind, owner.Name))
	}
	switch uid := lease.ControllerUID(l); {
	case uid == lock.UID, uid != "" && recordOf == lock.Name:
		return leaseState{}, nil, false
	case uid != "":
		return conflict(fmt.Sprintf("Lease %s is controlled by DistributedLock %s, so this lock cannot use it; spec.leaseName cannot be changed: "+
			"delete this lock and create it again with a leaseName no other lock uses", l.Name, orNobody(recordOf)))
	case recordOf == lock.Name:
		return leaseState{}, nil, false
	case recordOf != "":
		msg := fmt.Sprintf("Lease %s keeps the fencing tokens of the deleted DistributedLock %s; this lock may not take them over. "+
			"Create %s again to continue its tokens, or delete this lock and create it with another spec.leaseName", l.Name, recordOf, recordOf)
		return leaseState{reason: locksv1alpha1.ReasonLeaseRetiredByOther, message: msg},
			[]lockEvent{{corev1.EventTypeWarning, EventLeaseConflict, msg}}, true
	}
	if lock.Spec.LeaseAdoption == locksv1alpha1.LeaseAdoptionWhileHeld || l.DeletionTimestamp != nil {
		return leaseState{}, nil, false
	}
	obs := r.observations.Observe(client.ObjectKeyFromObject(lock).String(), lease.RecordOf(l), now)
	deadline := obs.Deadline(lockDuration(lock))
	if obs.Record.Holder == "" || !now.Before(deadline) {
		return leaseState{}, nil, false
	}
	msg := fmt.Sprintf("Lease %s exists, was not created by frontdesk and is held by %s; the lock adopts it once it is free "+
		"(released, or unrenewed for its lease duration, ~%s), or at once with spec.leaseAdoption: WhileHeld",
		l.Name, obs.Record.Holder, deadline.UTC().Format(time.RFC3339))
	return leaseState{reason: locksv1alpha1.ReasonLeaseInUse, message: msg, retryIn: deadline.Sub(now)},
		[]lockEvent{{corev1.EventTypeWarning, EventLeaseConflict, msg}}, true
}

// createLease creates the lock's Lease with leaseTransitions continuing from
// the highest fencing token recorded for the lock's name (tokenFloor).
func (r *DistributedLockReconciler) createLease(ctx context.Context, lock *locksv1alpha1.DistributedLock, name string) (leaseState, []lockEvent, error) {
	floor, err := r.tokenFloor(ctx, lock)
	if err != nil {
		return leaseState{}, nil, err
	}
	created, err := newRecordLease(lock, name, floor)
	if err != nil {
		return leaseState{}, nil, err
	}
	lease.SetController(created, lock.UID)
	if err := r.Create(ctx, created); err != nil {
		return leaseState{}, nil, fmt.Errorf("creating lease %s: %w", name, err)
	}
	ev := lockEvent{corev1.EventTypeNormal, EventLeaseCreated, fmt.Sprintf("created Lease %s", name)}
	if floor > 0 {
		ev = lockEvent{corev1.EventTypeNormal, EventLeaseRecreated,
			fmt.Sprintf("created Lease %s with fencing token continuing from %d", name, floor)}
	}
	return leaseState{lease: created, ready: true, reason: locksv1alpha1.ReasonLeaseReady,
		message: fmt.Sprintf("Lease %s is in sync", name)}, []lockEvent{ev}, nil
}

// newRecordLease is a Lease frontdesk creates for the lock's name, at the
// given token, tied to no lock yet: the lock label, the created origin, the
// token finalizer.
func newRecordLease(lock *locksv1alpha1.DistributedLock, name string, token int64) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: lock.Namespace,
			Labels:    map[string]string{locksv1alpha1.LockNameLabel: lock.Name},
			Annotations: map[string]string{locksv1alpha1.LeaseOriginAnnotation: locksv1alpha1.LeaseOriginCreated,
				locksv1alpha1.LeaseDurationAnnotation: strconv.Itoa(int(lock.EffectiveLeaseDurationSeconds()))},
			Finalizers: []string{locksv1alpha1.LeaseTokenFinalizer},
		},
		Spec: coordinationv1.LeaseSpec{
			LeaseDurationSeconds: new(lock.EffectiveLeaseDurationSeconds()),
		},
	}
	return lease.RaiseToFloor(l, token)
}

// tokenFloor is recordedFloor for a lock that is to be served: a lock being
// deleted (as a fresh read shows, whatever the cache says) gets no Lease.
func (r *DistributedLockReconciler) tokenFloor(ctx context.Context, lock *locksv1alpha1.DistributedLock) (int64, error) {
	floor, fresh, err := r.recordedFloor(ctx, lock)
	if err != nil {
		return 0, err
	}
	if fresh.DeletionTimestamp != nil {
		return 0, apierrors.NewConflict(locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource(),
			lock.Name, fmt.Errorf("the lock is being deleted"))
	}
	return floor, nil
}

// recordedFloor is the highest fencing token recorded for the lock's name:
// in its status (read from the apiserver, not the cache: a Lease's deletion
// can reach this pass before the status write that recorded its last token
// reaches the cache), in the Lease events this controller saw, and on every
// Lease that records the tokens of a lock of this name (a deleted lock's
// retired Lease, whatever its name). It also returns the fresh lock.
func (r *DistributedLockReconciler) recordedFloor(ctx context.Context, lock *locksv1alpha1.DistributedLock) (int64, *locksv1alpha1.DistributedLock, error) {
	fresh := &locksv1alpha1.DistributedLock{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); err != nil {
		return 0, nil, fmt.Errorf("reading the recorded fencing token: %w", err)
	}
	if fresh.UID != lock.UID {
		return 0, nil, apierrors.NewConflict(locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource(),
			lock.Name, fmt.Errorf("the lock was replaced"))
	}
	var records coordinationv1.LeaseList
	if err := r.APIReader.List(ctx, &records, client.InNamespace(lock.Namespace),
		client.MatchingLabels{locksv1alpha1.LockNameLabel: lock.Name}); err != nil {
		return 0, nil, fmt.Errorf("listing the Leases that record tokens of lock %s: %w", lock.Name, err)
	}
	floor := max(lock.Status.FencingToken, fresh.Status.FencingToken, r.highWater.get(client.ObjectKeyFromObject(lock)))
	for i := range records.Items {
		floor = max(floor, lease.Token(&records.Items[i]))
	}
	return floor, fresh, nil
}

// syncLease ties the Lease to the lock and repairs it. It never touches a
// live holder's fields, except to void a grant whose token is below the
// recorded floor (such a token may have been handed out before).
func (r *DistributedLockReconciler) syncLease(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	current *coordinationv1.Lease) (*coordinationv1.Lease, []lockEvent, error) {
	l := current.DeepCopy()
	var events []lockEvent
	floor := max(lock.Status.FencingToken, r.highWater.get(client.ObjectKeyFromObject(lock)))

	adopting := lease.ControllerUID(l) != lock.UID
	if adopting {
		adoptFloor, err := r.tokenFloor(ctx, lock)
		if err != nil {
			return nil, nil, err
		}
		floor = max(floor, adoptFloor)
	}
	record := tieLease(l, lock, adopting)

	if lease.Token(l) < floor {
		voided := lease.Holder(l)
		raised, err := lease.RaiseToFloor(l, floor)
		if err != nil {
			return nil, nil, fmt.Errorf("restoring the token floor of lease %s: %w", l.Name, err)
		}
		msg := fmt.Sprintf("Lease %s had fencing token %d, below the recorded %d; raised it to %d", l.Name, lease.Token(l), floor, floor)
		if voided != "" {
			msg += fmt.Sprintf(" and voided the grant to %s made with a reused token", voided)
		}
		events = append(events, lockEvent{corev1.EventTypeWarning, EventTokenFloorRestored, msg})
		l = raised
	}
	if adopting {
		events = append(events, adoptionEvent(lock, current, l, record))
	}
	// Every grant carries the lock's lease duration as the manager last
	// wrote it here; a live grant keeps the one it was made with.
	l.Annotations[locksv1alpha1.LeaseDurationAnnotation] = strconv.Itoa(int(lock.EffectiveLeaseDurationSeconds()))
	if lease.Holder(l) == "" && ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != lock.EffectiveLeaseDurationSeconds() {
		l.Spec.LeaseDurationSeconds = new(lock.EffectiveLeaseDurationSeconds())
	}

	if equality.Semantic.DeepEqual(current, l) {
		return current, nil, nil
	}
	if err := r.Update(ctx, l); err != nil {
		return nil, nil, fmt.Errorf("updating lease %s: %w", l.Name, err)
	}
	return l, events, nil
}

// tieLease ties l, a copy being edited, to the lock: its controller, its
// origin (adopting: the lock did not control it before), the token
// finalizer and the lock's name label. It reports whether l already
// carried the lock's name (a record of this name).
func tieLease(l *coordinationv1.Lease, lock *locksv1alpha1.DistributedLock, adopting bool) (record bool) {
	record = l.Labels[locksv1alpha1.LockNameLabel] == lock.Name
	lease.SetController(l, lock.UID) // also moves an earlier version's owner reference to the annotation
	if record && l.Annotations[locksv1alpha1.LeaseOriginAnnotation] == "" {
		// Earlier versions wrote no origin: a Lease that carries the lock's
		// name is taken as frontdesk's own, the cautious direction (it is
		// kept as a record, never handed back without its finalizer).
		l.Annotations[locksv1alpha1.LeaseOriginAnnotation] = locksv1alpha1.LeaseOriginCreated
	}
	if !record && adopting {
		l.Annotations[locksv1alpha1.LeaseOriginAnnotation] = locksv1alpha1.LeaseOriginAdopted
	}
	controllerutil.AddFinalizer(l, locksv1alpha1.LeaseTokenFinalizer)
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[locksv1alpha1.LockNameLabel] = lock.Name
	return record
}

// adoptionEvent says how the lock came to control the Lease: a record of a
// deleted lock of its name taken over, or a Lease frontdesk did not create
// adopted (free, or held as spec.leaseAdoption allows).
func adoptionEvent(lock *locksv1alpha1.DistributedLock, before, after *coordinationv1.Lease, record bool) lockEvent {
	if record {
		return lockEvent{corev1.EventTypeNormal, EventLeaseAdopted, fmt.Sprintf(
			"took over Lease %s, the record of a deleted lock of this name, continuing from fencing token %d", after.Name, lease.Token(after))}
	}
	how := "free"
	if holder := lease.Holder(before); holder != "" {
		how = "held by " + holder
		if lock.Spec.LeaseAdoption == locksv1alpha1.LeaseAdoptionWhileHeld {
			how += ", as spec.leaseAdoption: WhileHeld allows"
		} else {
			how += ", whose lease had lapsed as observed"
		}
	}
	return lockEvent{corev1.EventTypeNormal, EventLeaseAdopted, fmt.Sprintf(
		"adopted existing Lease %s (%s) at fencing token %d; it is handed back, not deleted, when the lock is deleted", after.Name, how, lease.Token(after))}
}

// releaseTerminatingLease removes the token finalizer from a Lease being
// deleted, once the lock's recorded token covers the Lease's and no live
// holder remains, as observed on the controller's clock: a holder still
// inside its lease must not see a fresh Lease granted to someone else (it
// stops renewing a terminating Lease, so its grant lapses within one lease
// duration), and a revoked candidate keeps its hand-off delay. The Update
// carries the resourceVersion the token was read from: a grant in between
// makes it conflict, and the next pass records that grant first. While
// the holder is still live, it sets the pass's lapseIn to how long until
// the holder lapses.
func (r *DistributedLockReconciler) releaseTerminatingLease(ctx context.Context, p *pass) error {
	lock, l := p.lock, p.state.lease
	if l == nil || l.DeletionTimestamp == nil || !controllerutil.ContainsFinalizer(l, locksv1alpha1.LeaseTokenFinalizer) {
		return nil
	}
	if lapse := holderLapse(lock, l, p.obs); p.now.Before(lapse) {
		p.lapseIn = lapse.Sub(p.now)
		return nil
	}
	if lease.Token(l) > lock.Status.FencingToken {
		return fmt.Errorf("lease %s has token %d not yet recorded in status", l.Name, lease.Token(l))
	}
	l = l.DeepCopy()
	controllerutil.RemoveFinalizer(l, locksv1alpha1.LeaseTokenFinalizer)
	if err := r.Update(ctx, l); err != nil {
		return fmt.Errorf("releasing finalizer of terminating lease %s: %w", l.Name, err)
	}
	return nil
}

// holderLapse is when the Lease's holder is gone as the controller observes
// it: at once for no holder; a lease duration after the record was first
// seen; for a revoked candidate grant, not before the hand-off delay since
// then either.
func holderLapse(lock *locksv1alpha1.DistributedLock, l *coordinationv1.Lease, obs lease.Observation) time.Time {
	if obs.Record.Holder == "" {
		return time.Time{}
	}
	lapse := obs.Deadline(lockDuration(lock))
	if handOff := obs.ObservedAt.Add(handOffDelay(lock)); l.Annotations[locksv1alpha1.RevokedAnnotation] == obs.Record.Holder &&
		handOff.After(lapse) {
		return handOff
	}
	return lapse
}
