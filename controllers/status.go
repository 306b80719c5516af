package controllers

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// leaseState is what the reconciler established about a lock's Lease before
// deriving status: the Lease to mirror (nil when there is none to mirror) and
// the Ready condition it implies.
type leaseState struct {
	lease   *coordinationv1.Lease
	ready   bool
	reason  string
	message string
}

// lockEvent is an Event to record on the lock once its status is written.
type lockEvent struct {
	eventType string
	reason    string
	note      string
}

// statusInput is everything deriveStatus needs; it does no I/O.
type statusInput struct {
	lock  *locksv1alpha1.DistributedLock
	lease leaseState
	// observation is when the controller first saw the Lease's current
	// record; only meaningful when lease.lease is set.
	observation lease.Observation
	now         time.Time
	// highWater is the highest token seen in any event of the lock's Lease.
	highWater int64
}

// statusResult is the derived status, the events the change implies, and
// how long until the current grant expires as observed (zero when there is
// no live grant to watch).
type statusResult struct {
	status    locksv1alpha1.DistributedLockStatus
	events    []lockEvent
	expiresIn time.Duration
}

// deriveStatus computes a lock's new status from its Lease and the
// controller's own observation of it. The fencing token never decreases:
// it is the highest of the recorded token and the Lease's leaseTransitions.
func deriveStatus(in statusInput) statusResult {
	old := in.lock.Status
	st := *old.DeepCopy()
	st.LeaseName = in.lock.EffectiveLeaseName()
	st.ObservedGeneration = in.lock.Generation
	setCondition(&st, in, locksv1alpha1.ConditionReady, boolStatus(in.lease.ready), in.lease.reason, in.lease.message)

	current := in.lease.lease
	if current == nil {
		st.Holder, st.AcquireTime, st.RenewTime, st.ExpireTime = "", nil, nil, nil
		setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonLeaseUnavailable,
			"the lock's Lease is unavailable: "+in.lease.message)
		return statusResult{status: st}
	}

	rec := in.observation.Record
	st.FencingToken = max(old.FencingToken, int64(rec.Transitions), in.highWater)
	st.Holder = rec.Holder
	st.AcquireTime = current.Spec.AcquireTime.DeepCopy()
	st.RenewTime = current.Spec.RenewTime.DeepCopy()
	st.ExpireTime = nil

	var expiresIn time.Duration
	switch {
	case rec.Holder == "":
		setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNotHeld, "nobody holds the lock")
	default:
		duration := rec.Duration(lockDuration(in.lock))
		deadline := in.observation.Deadline(lockDuration(in.lock))
		st.ExpireTime = &metav1.Time{Time: deadline.Truncate(time.Second)}
		if remaining := deadline.Sub(in.now); remaining > 0 {
			expiresIn = remaining
			setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonHeld,
				fmt.Sprintf("held by %s with fencing token %d", rec.Holder, rec.Transitions))
		} else {
			setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonExpired,
				fmt.Sprintf("holder %s (fencing token %d) has not renewed within %s, as observed by the controller; any client may take the lock over",
					rec.Holder, rec.Transitions, duration))
		}
	}
	return statusResult{status: st, events: transitionEvents(old, st, rec), expiresIn: expiresIn}
}

// transitionEvents names what changed between the recorded status and the
// new one. Routine renewals produce no event.
func transitionEvents(old, cur locksv1alpha1.DistributedLockStatus, rec lease.Record) []lockEvent {
	oldHeld := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionHeld)
	newHeld := meta.FindStatusCondition(cur.Conditions, locksv1alpha1.ConditionHeld)
	oldExpired := oldHeld != nil && oldHeld.Reason == locksv1alpha1.ReasonExpired
	newExpired := newHeld != nil && newHeld.Reason == locksv1alpha1.ReasonExpired

	switch {
	case rec.Holder != "" && int64(rec.Transitions) > old.FencingToken:
		if old.Holder != "" && old.Holder != rec.Holder {
			return []lockEvent{{corev1.EventTypeNormal, EventTakenOver,
				fmt.Sprintf("%s took the lock over from %s with fencing token %d", rec.Holder, old.Holder, rec.Transitions)}}
		}
		return []lockEvent{{corev1.EventTypeNormal, EventAcquired,
			fmt.Sprintf("%s acquired the lock with fencing token %d", rec.Holder, rec.Transitions)}}
	case rec.Holder == "" && old.Holder != "":
		return []lockEvent{{corev1.EventTypeNormal, EventReleased,
			fmt.Sprintf("%s released the lock (fencing token %d)", old.Holder, cur.FencingToken)}}
	case rec.Holder == "" || rec.Holder != old.Holder:
		return nil
	case newExpired && !oldExpired:
		return []lockEvent{{corev1.EventTypeWarning, EventExpired,
			fmt.Sprintf("%s stopped renewing; its lease (fencing token %d) lapsed", rec.Holder, rec.Transitions)}}
	case !newExpired && oldExpired:
		return []lockEvent{{corev1.EventTypeWarning, EventRenewed,
			fmt.Sprintf("%s renewed after its lease had lapsed (fencing token %d); writes it made meanwhile must be fenced", rec.Holder, rec.Transitions)}}
	case isFirstRenewal(old, cur):
		return []lockEvent{{corev1.EventTypeNormal, EventRenewed,
			fmt.Sprintf("%s is renewing the lock (fencing token %d); further renewals are not recorded as events", rec.Holder, rec.Transitions)}}
	}
	return nil
}

// isFirstRenewal reports whether the grant was renewed for the first time:
// the recorded renewTime still equalled the acquireTime and now moved past it.
func isFirstRenewal(old, cur locksv1alpha1.DistributedLockStatus) bool {
	if old.RenewTime == nil || old.AcquireTime == nil || cur.RenewTime == nil || cur.AcquireTime == nil {
		return false
	}
	return old.RenewTime.Equal(old.AcquireTime) && cur.AcquireTime.Equal(old.AcquireTime) &&
		cur.RenewTime.Time.After(old.RenewTime.Time)
}

// lockDuration is the lock's own lease duration, for Leases that carry none.
func lockDuration(lock *locksv1alpha1.DistributedLock) time.Duration {
	return time.Duration(lock.EffectiveLeaseDurationSeconds()) * time.Second
}

func setCondition(st *locksv1alpha1.DistributedLockStatus, in statusInput, condType string,
	status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type:               condType,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: in.lock.Generation,
		LastTransitionTime: metav1.NewTime(in.now),
	})
}

func boolStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}
