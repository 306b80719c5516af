package controllers

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// grantPass is what a pass's writes on the lock's Lease leave behind: the
// record as last observed, when to look again for a renewal or a turn, the
// gated pods waiting, and the events of the writes.
type grantPass struct {
	obs       lease.Observation
	renewIn   time.Duration
	gatedPods []corev1.Pod
	events    []lockEvent
}

// syncGrants makes the pass's writes on state.lease, in order: the
// candidates-mode grant, the grants of admitted pods, the lapse mark of a
// grant left unrenewed, and the removal of queue places whose turn passed.
// state.lease follows each write, and each written record is observed on
// the controller's clock. now is when the pass read the Lease. On an error
// the result still holds the events of the writes already made.
func (r *DistributedLockReconciler) syncGrants(ctx context.Context, lock *locksv1alpha1.DistributedLock, state *leaseState,
	now time.Time) (grantPass, error) {
	lockKey := client.ObjectKeyFromObject(lock)
	key := lockKey.String()
	var pass grantPass
	pass.obs = r.observations.Observe(key, lease.RecordOf(state.lease), now)
	cand, err := r.reconcileCandidates(ctx, lock, state.lease, pass.obs, now)
	if err != nil {
		return pass, err
	}
	// Observed when the write was answered, not at the start of the pass:
	// a hand-off delay counts from the revocation's write.
	r.follow(key, state, &pass, cand.lease, r.Clock.Now())
	pass.events, pass.renewIn = cand.events, cand.renewIn
	adm, err := r.reconcileAdmissions(ctx, lock, state.lease, pass.obs, now)
	if err != nil {
		return pass, err
	}
	r.follow(key, state, &pass, adm.lease, r.Clock.Now())
	pass.events, pass.renewIn = append(pass.events, adm.events...), earliest(pass.renewIn, adm.renewIn)
	pass.gatedPods = adm.gated
	marked, markIn, err := r.markLapsed(ctx, lock, state.lease, pass.obs, now)
	if err != nil {
		return pass, err
	}
	r.follow(key, state, &pass, marked, now)
	pruneIn, err := r.removePassedPlaces(ctx, lockKey, state.lease, pass.obs, lease.TurnLength(lockDuration(lock)), now)
	if err != nil {
		return pass, err
	}
	pass.renewIn = earliest(pass.renewIn, markIn, pruneIn)
	if cand.selectorErr != nil && state.ready {
		state.ready, state.reason = false, locksv1alpha1.ReasonInvalidSelector
		state.message = fmt.Sprintf("candidates mode grants nothing: %v; fix spec.candidates.podSelector", cand.selectorErr)
		pass.events = append(pass.events, lockEvent{corev1.EventTypeWarning, EventSelectorInvalid, state.message})
	}
	return pass, nil
}

// follow takes up written as the pass's Lease when a write replaced
// state.lease, and observes its record as of at.
func (r *DistributedLockReconciler) follow(key string, state *leaseState, pass *grantPass, written *coordinationv1.Lease, at time.Time) {
	if written == state.lease {
		return
	}
	state.lease = written
	pass.obs = r.observations.Observe(key, lease.RecordOf(written), at)
}

// isControllerGrant reports whether holder's grant on l is one the
// controller holds on a pod's behalf: a candidates-mode grant or an
// admitted pod's.
func isControllerGrant(l *coordinationv1.Lease, holder string) bool {
	return l != nil && holder != "" &&
		(l.Annotations[locksv1alpha1.CandidateGrantAnnotation] == holder ||
			isAdmittedGrant(l) && lease.Holder(l) == holder)
}
