package controllers

import (
	"context"
	"errors"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// pass is what one reconcile of a lock knows, from the read of its Lease to
// the events it records. The steps of reconcile read it and add to it; a
// step's helpers read it as the step began, and the step takes up their
// writes when they return (follow).
type pass struct {
	lock *locksv1alpha1.DistributedLock
	key  types.NamespacedName
	// oldStatus is the lock's status as the pass found it.
	oldStatus *locksv1alpha1.DistributedLockStatus
	// state is the lock's Lease (nil when there is none to mirror) and the
	// Ready condition it implies; state.lease follows each write.
	state leaseState
	// obs is state.lease's record as observed on the controller's clock.
	obs lease.Observation
	// now is when the pass read the Lease: every record it observes
	// existed by then.
	now time.Time

	// events are the events of the Lease's writes (with those a failed pass
	// kept, first), recorded after the status write; kept for the next
	// pass when the pass fails.
	events []lockEvent
	// renewIn is when to act on the Lease again: a renewal, a turn, a
	// lapse, a hand-off, a check (zero for never).
	renewIn time.Duration
	// errs are the errors of the steps on the Lease, in order: a failing
	// step does not keep the lapse and the removal of passed places from
	// being judged, nor the status from being written.
	errs []error
	// candidatesFailed is set when candidates mode failed: admitted pods
	// wait for the next pass.
	candidatesFailed bool
	// selectorErr is set when the candidates selector cannot select pods.
	selectorErr error
	// gatedPods are the pods still waiting, gated, oldest first.
	gatedPods []corev1.Pod

	// highWater is the highest token an event of the Lease showed, read
	// once: the status pairs the record judged with it.
	highWater int64
	// status is the status derived in memory, its events, and when the
	// current grant expires as observed.
	status statusResult
	// lapseIn is how long until a terminating Lease's holder lapses.
	lapseIn time.Duration
	// provenDead is the message of the event of a grant the pass ended on
	// the proof of its holder's death ("" for none).
	provenDead string
}

// startPass ensures the lock's Lease and starts a pass from it: the events
// a failed pass of the lock kept come first, and now is taken after the
// Lease was read (it may come from the apiserver, not the cache).
func (r *DistributedLockReconciler) startPass(ctx context.Context, lock *locksv1alpha1.DistributedLock) (*pass, error) {
	p := &pass{lock: lock, oldStatus: lock.Status.DeepCopy()}
	state, events, err := r.ensureLease(ctx, lock)
	if err != nil {
		return nil, err
	}
	p.state, p.key = state, client.ObjectKeyFromObject(lock)
	p.events = append(r.pending.take(p.key, lock.UID), events...)
	p.now = r.Clock.Now()
	return p, nil
}

// follow takes up written as the pass's Lease when a write replaced
// state.lease, and observes its record as of at.
func (r *DistributedLockReconciler) follow(p *pass, written *coordinationv1.Lease, at time.Time) {
	if written == p.state.lease {
		return
	}
	p.state.lease = written
	p.obs = r.observations.Observe(p.key.String(), lease.RecordOf(written), at)
}

// renewInterval is how often the controller renews a grant it holds: a
// third of the lease duration of the record observed.
func (p *pass) renewInterval() time.Duration {
	return p.obs.Record.Duration(lockDuration(p.lock)) / 3
}

// stepErr is the errors of the steps on the Lease, joined (nil for none).
func (p *pass) stepErr() error {
	return errors.Join(p.errs...)
}

// result asks for the next pass at the earliest deadline: the current
// grant's lapse, a renewal, turn or hand-off, a retry of an unadopted
// Lease, a terminating Lease's holder's lapse.
func (p *pass) result() ctrl.Result {
	return ctrl.Result{RequeueAfter: earliest(p.status.expiresIn, p.renewIn, p.state.retryIn, p.lapseIn)}
}

// lostRace reports whether err is a lost compare-and-swap race: a conflict,
// or AlreadyExists on create.
func lostRace(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
}
