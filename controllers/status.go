package controllers

import (
	"fmt"
	"strconv"
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
	// retryIn is when to look at the Lease again although no event may
	// come (an unadopted Lease whose holder may lapse); zero for never.
	retryIn time.Duration
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
	// provenDead is the note of the event of a grant the pass ended on the
	// proof of its holder's death, "" when it did not.
	provenDead string
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
	st.LeaseName = leaseNameOf(in.lock)
	st.ObservedGeneration = in.lock.Generation
	setCondition(&st, in, locksv1alpha1.ConditionReady, boolStatus(in.lease.ready), in.lease.reason, in.lease.message)

	current := in.lease.lease
	if current == nil {
		st.Holder, st.AcquireTime, st.RenewTime = "", nil, nil
		setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonLeaseUnavailable,
			"the lock's Lease is unavailable: "+in.lease.message)
		return statusResult{status: st}
	}

	rec := in.observation.Record
	st.FencingToken = max(old.FencingToken, rec.Token, in.highWater)
	st.Holder = rec.Holder
	st.AcquireTime = current.Spec.AcquireTime.DeepCopy()

	var expiresIn time.Duration
	switch {
	case rec.Holder == "" && rec.Lapsed:
		setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonExpired, lapsedMessage(in, rec))
	case rec.Holder == "":
		setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNotHeld, "nobody holds the lock")
	case isInvalidGrant(old, rec):
		setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonInvalidGrant,
			invalidGrantMessage(old, rec))
		expiresIn = max(in.observation.Deadline(lockDuration(in.lock)).Sub(in.now), 0)
	case current.Annotations[locksv1alpha1.RevokedAnnotation] == rec.Holder:
		setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonRevoked,
			fmt.Sprintf("the grant of candidate %s (fencing token %d) was revoked: it is no longer eligible; "+
				"the lock is handed on once the pod is gone or the hand-off delay has passed", locksv1alpha1.PodNameOf(rec.Holder), rec.Token))
	default:
		duration := rec.Duration(lockDuration(in.lock))
		deadline := in.observation.Deadline(lockDuration(in.lock))
		if remaining := deadline.Sub(in.now); remaining > 0 && !rec.Lapsed && !lapseRecorded(old, rec, current) {
			expiresIn = remaining
			setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonHeld,
				fmt.Sprintf("held by %s with fencing token %d", rec.Holder, rec.Token))
		} else {
			setCondition(&st, in, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonExpired,
				fmt.Sprintf("holder %s (fencing token %d) has not renewed within %s, as observed by the controller, which ends the grant",
					rec.Holder, rec.Token, duration))
		}
	}
	// renewTime moves only with a change of the status that operators see
	// (holder, token, Held): routine renewals write the Lease, not status.
	// It is the renewTime of the record each such change was made from, so
	// an Expired status names exactly the record that lapsed.
	st.RenewTime = old.RenewTime
	if statusChanged(old, st) {
		st.RenewTime = current.Spec.RenewTime.DeepCopy()
	}
	return statusResult{status: st, events: transitionEvents(old, st, rec, current), expiresIn: expiresIn}
}

// lapseRecorded reports whether the old status already says that this very
// record (holder, token, renewTime) lapsed: observed by this controller
// before, or by an earlier instance before a restart, whose observations
// are lost. Such a record stays Expired; a renewal changes renewTime and
// is judged afresh.
func lapseRecorded(old locksv1alpha1.DistributedLockStatus, rec lease.Record, current *coordinationv1.Lease) bool {
	held := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionHeld)
	return held != nil && held.Reason == locksv1alpha1.ReasonExpired && old.Holder == rec.Holder &&
		old.FencingToken == rec.Token && old.RenewTime != nil && current.Spec.RenewTime != nil &&
		old.RenewTime.Equal(current.Spec.RenewTime)
}

// statusChanged reports whether cur differs from old in what operators see:
// holder, token, acquire time, or a condition's status or reason.
func statusChanged(old, cur locksv1alpha1.DistributedLockStatus) bool {
	if old.Holder != cur.Holder || old.FencingToken != cur.FencingToken || !old.AcquireTime.Equal(cur.AcquireTime) {
		return true
	}
	for _, c := range cur.Conditions {
		o := meta.FindStatusCondition(old.Conditions, c.Type)
		if o == nil || o.Status != c.Status || o.Reason != c.Reason {
			return true
		}
	}
	return false
}

// isInvalidGrant reports whether rec names a holder that was not granted
// the lock: a new holder whose token is not above the recorded one, or the
// holder already flagged so whose record has not moved to a new token.
func isInvalidGrant(old locksv1alpha1.DistributedLockStatus, rec lease.Record) bool {
	if rec.Holder == "" {
		return false
	}
	held := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionHeld)
	if held != nil && held.Reason == locksv1alpha1.ReasonInvalidGrant && old.Holder == rec.Holder && old.FencingToken == rec.Token {
		return true
	}
	return rec.Holder != old.Holder && rec.Token <= old.FencingToken && old.FencingToken > 0
}

// lapsedMessage says whose grant the controller ended as lapsed: the holder
// status recorded at that token (a pass that finds it said already keeps
// what the first one said).
func lapsedMessage(in statusInput, rec lease.Record) string {
	old := in.lock.Status
	held := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionHeld)
	if held != nil && held.Reason == locksv1alpha1.ReasonExpired && old.Holder == "" && old.FencingToken == rec.Token {
		return held.Message
	}
	who := "its holder"
	if old.Holder != "" && old.FencingToken == rec.Token {
		who = old.Holder
	}
	if in.provenDead != "" {
		return in.provenDead + ": the lock is free"
	}
	return fmt.Sprintf("the grant of %s (fencing token %d) was not renewed within its lease, as observed by the controller, "+
		"which ended it: the lock is free", who, rec.Token)
}

// invalidGrantMessage says who the Lease names without a grant, and to whom
// its token was granted: the holder recorded before the invalid grant
// appeared (a pass that finds it already flagged keeps what the first one
// said; the status holder is then the invalid one itself).
func invalidGrantMessage(old locksv1alpha1.DistributedLockStatus, rec lease.Record) string {
	held := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionHeld)
	if held != nil && held.Reason == locksv1alpha1.ReasonInvalidGrant && old.Holder == rec.Holder {
		return held.Message
	}
	return fmt.Sprintf("the Lease names %s as holder with fencing token %d, which was already granted (to %s): "+
		"a holder written by hand, not a grant; nobody may act on it. It is judged like a holder and lapses unless renewed",
		rec.Holder, rec.Token, orNobody(old.Holder))
}

func orNobody(holder string) string {
	if holder == "" {
		return "nobody"
	}
	return holder
}

// transitionEvents names what changed between the recorded status and the
// new one. Routine renewals produce no event.
func transitionEvents(old, cur locksv1alpha1.DistributedLockStatus, rec lease.Record, current *coordinationv1.Lease) []lockEvent {
	oldHeld := meta.FindStatusCondition(old.Conditions, locksv1alpha1.ConditionHeld)
	newHeld := meta.FindStatusCondition(cur.Conditions, locksv1alpha1.ConditionHeld)
	reasonNow := func(r string) bool { return newHeld != nil && newHeld.Reason == r }
	reasonBefore := func(r string) bool { return oldHeld != nil && oldHeld.Reason == r }

	switch {
	case reasonNow(locksv1alpha1.ReasonInvalidGrant):
		if reasonBefore(locksv1alpha1.ReasonInvalidGrant) {
			return nil
		}
		return []lockEvent{{corev1.EventTypeWarning, EventInvalidGrant, newHeld.Message}}
	case rec.Holder != "" && rec.Token > old.FencingToken:
		return []lockEvent{grantEvent(old, rec, current)}
	case rec.Holder == "":
		return freedEvents(old, cur, rec, current)
	case rec.Holder != old.Holder:
		return nil
	case reasonNow(locksv1alpha1.ReasonRevoked):
		return nil // the controller's own revocation is reported as Revoked
	case reasonNow(locksv1alpha1.ReasonExpired) && !reasonBefore(locksv1alpha1.ReasonExpired):
		return []lockEvent{{corev1.EventTypeWarning, EventExpired,
			fmt.Sprintf("%s stopped renewing; its lease (fencing token %d) lapsed", rec.Holder, rec.Token)}}
	case !reasonNow(locksv1alpha1.ReasonExpired) && reasonBefore(locksv1alpha1.ReasonExpired):
		return []lockEvent{{corev1.EventTypeWarning, EventRenewed,
			fmt.Sprintf("%s renewed after its lease had lapsed (fencing token %d); writes it made meanwhile must be fenced", rec.Holder, rec.Token)}}
	}
	return nil
}

// grantEvent names a new grant to rec.Holder: handed off by the old holder,
// taken over from it, or acquired.
func grantEvent(old locksv1alpha1.DistributedLockStatus, rec lease.Record, current *coordinationv1.Lease) lockEvent {
	if by := current.Annotations[locksv1alpha1.HandedOffByAnnotation]; by != "" && by == old.Holder {
		return lockEvent{corev1.EventTypeNormal, EventHandedOff,
			fmt.Sprintf("%s released the lock and handed it to %s, the first in its queue, with fencing token %d", by, rec.Holder, rec.Token)}
	}
	if old.Holder != "" && old.Holder != rec.Holder {
		return lockEvent{corev1.EventTypeNormal, EventTakenOver,
			fmt.Sprintf("%s took the lock over from %s with fencing token %d", rec.Holder, old.Holder, rec.Token)}
	}
	return lockEvent{corev1.EventTypeNormal, EventAcquired,
		fmt.Sprintf("%s acquired the lock with fencing token %d", rec.Holder, rec.Token)}
}

// freedEvents names how the lock became free: released (seen or not),
// broken, or lapsed. Nothing when it was free already.
func freedEvents(old, cur locksv1alpha1.DistributedLockStatus, rec lease.Record, current *coordinationv1.Lease) []lockEvent {
	switch {
	case rec.Token > old.FencingToken && old.LeaseName != "" && !brokenAt(current, rec.Token):
		// The token went up and the lock is free, but no break made it so:
		// holders came and went while the controller was not watching.
		return []lockEvent{{corev1.EventTypeNormal, EventReleased, fmt.Sprintf(
			"the lock is free at fencing token %d; it was granted and released %d time(s) since the controller last recorded it (token %d, held by %s)",
			rec.Token, rec.Token-old.FencingToken, old.FencingToken, orNobody(old.Holder))}}
	case rec.Token > old.FencingToken && old.LeaseName != "":
		// A recorded lock whose token a break raised.
		if old.Holder != "" {
			return []lockEvent{{corev1.EventTypeWarning, EventBroken, fmt.Sprintf(
				"the lock was broken: the grant of %s (fencing token %d) was voided and the fencing token raised to %d",
				old.Holder, old.FencingToken, rec.Token)}}
		}
		return []lockEvent{{corev1.EventTypeWarning, EventBroken, fmt.Sprintf(
			"the lock was broken while free: the fencing token was raised from %d to %d", old.FencingToken, rec.Token)}}
	case old.Holder != "" && rec.Lapsed:
		return []lockEvent{{corev1.EventTypeWarning, EventExpired,
			fmt.Sprintf("%s stopped renewing; its lease (fencing token %d) lapsed, and the controller ended the grant", old.Holder, rec.Token)}}
	case old.Holder != "":
		return []lockEvent{{corev1.EventTypeNormal, EventReleased,
			fmt.Sprintf("%s released the lock (fencing token %d)", old.Holder, cur.FencingToken)}}
	}
	return nil
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

// brokenAt reports whether a break raised l's token to token (its mark,
// locks.frontdesk.dev/broken-at, names it).
func brokenAt(l *coordinationv1.Lease, token int64) bool {
	return l.Annotations[locksv1alpha1.BrokenAtAnnotation] == strconv.FormatInt(token, 10)
}
