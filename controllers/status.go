package controllers

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
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
	observation observation
	now         time.Time
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
	setCondition(&st, in, ConditionReady, boolStatus(in.lease.ready), in.lease.reason, in.lease.message)

	lease := in.lease.lease
	if lease == nil {
		st.Holder, st.AcquireTime, st.RenewTime, st.ExpireTime = "", nil, nil, nil
		setCondition(&st, in, ConditionHeld, metav1.ConditionFalse, ReasonLeaseUnavailable,
			"the lock's Lease is unavailable: "+in.lease.message)
		return statusResult{status: st}
	}

	rec := in.observation.record
	st.FencingToken = max(old.FencingToken, int64(rec.transitions))
	st.Holder = rec.holder
	st.AcquireTime = lease.Spec.AcquireTime.DeepCopy()
	st.RenewTime = lease.Spec.RenewTime.DeepCopy()
	st.ExpireTime = nil

	var expiresIn time.Duration
	switch {
	case rec.holder == "":
		setCondition(&st, in, ConditionHeld, metav1.ConditionFalse, ReasonNotHeld, "nobody holds the lock")
	default:
		duration := time.Duration(leaseDurationSeconds(in.lock, rec)) * time.Second
		deadline := in.observation.observedAt.Add(duration)
		st.ExpireTime = &metav1.Time{Time: deadline.Truncate(time.Second)}
		if remaining := deadline.Sub(in.now); remaining > 0 {
			expiresIn = remaining
			setCondition(&st, in, ConditionHeld, metav1.ConditionTrue, ReasonHeld,
				fmt.Sprintf("held by %s with fencing token %d", rec.holder, rec.transitions))
		} else {
			setCondition(&st, in, ConditionHeld, metav1.ConditionFalse, ReasonExpired,
				fmt.Sprintf("holder %s (fencing token %d) has not renewed within %s, as observed by the controller; any client may take the lock over",
					rec.holder, rec.transitions, duration))
		}
	}
	return statusResult{status: st, events: transitionEvents(old, st, rec), expiresIn: expiresIn}
}

// transitionEvents names what changed between the recorded status and the
// new one. Routine renewals produce no event.
func transitionEvents(old, cur locksv1alpha1.DistributedLockStatus, rec leaseRecord) []lockEvent {
	oldHeld := meta.FindStatusCondition(old.Conditions, ConditionHeld)
	newHeld := meta.FindStatusCondition(cur.Conditions, ConditionHeld)
	oldExpired := oldHeld != nil && oldHeld.Reason == ReasonExpired
	newExpired := newHeld != nil && newHeld.Reason == ReasonExpired

	switch {
	case rec.holder != "" && int64(rec.transitions) > old.FencingToken:
		if old.Holder != "" && old.Holder != rec.holder {
			return []lockEvent{{corev1.EventTypeNormal, EventTakenOver,
				fmt.Sprintf("%s took the lock over from %s with fencing token %d", rec.holder, old.Holder, rec.transitions)}}
		}
		return []lockEvent{{corev1.EventTypeNormal, EventAcquired,
			fmt.Sprintf("%s acquired the lock with fencing token %d", rec.holder, rec.transitions)}}
	case rec.holder == "" && old.Holder != "":
		return []lockEvent{{corev1.EventTypeNormal, EventReleased,
			fmt.Sprintf("%s released the lock (fencing token %d)", old.Holder, cur.FencingToken)}}
	case rec.holder == "" || rec.holder != old.Holder:
		return nil
	case newExpired && !oldExpired:
		return []lockEvent{{corev1.EventTypeWarning, EventExpired,
			fmt.Sprintf("%s stopped renewing; its lease (fencing token %d) lapsed", rec.holder, rec.transitions)}}
	case !newExpired && oldExpired:
		return []lockEvent{{corev1.EventTypeWarning, EventRenewed,
			fmt.Sprintf("%s renewed after its lease had lapsed (fencing token %d); writes it made meanwhile must be fenced", rec.holder, rec.transitions)}}
	case isFirstRenewal(old, cur):
		return []lockEvent{{corev1.EventTypeNormal, EventRenewed,
			fmt.Sprintf("%s is renewing the lock (fencing token %d); further renewals are not recorded as events", rec.holder, rec.transitions)}}
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

// leaseDurationSeconds is the duration the holder promised in the Lease, or
// the lock's own when the Lease carries none.
func leaseDurationSeconds(lock *locksv1alpha1.DistributedLock, rec leaseRecord) int32 {
	if rec.duration > 0 {
		return rec.duration
	}
	return lock.EffectiveLeaseDurationSeconds()
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
