package lease

import (
	"errors"
	"fmt"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The edits below are the only ways frontdesk changes a Lease's record. Each
// returns a modified copy that keeps the resourceVersion of the Lease it was
// made from, so writing it with Update is a compare-and-swap: it lands only
// if nobody wrote in between. None of them does I/O.

// ErrTokensExhausted: the Lease's leaseTransitions is at the largest value
// an int32 holds, so no further grant can carry a higher fencing token.
var ErrTokensExhausted = errors.New("fencing tokens exhausted: leaseTransitions is at its maximum (2147483647)")

// Token is the Lease's fencing token: spec.leaseTransitions (0 when unset).
func Token(l *coordinationv1.Lease) int64 {
	return int64(ptr.Deref(l.Spec.LeaseTransitions, 0))
}

// Holder is the Lease's spec.holderIdentity ("" when unset).
func Holder(l *coordinationv1.Lease) string {
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// Grant is current granted to identity: the next fencing token, fresh
// acquire and renew times, and the given lease duration, in one write.
// Grant, Renew and Release also set the queue's front labels afresh (see
// FrontLabelPrefix), repairing them if a client that does not set them
// wrote the queue last.
func Grant(current *coordinationv1.Lease, identity string, duration time.Duration, now time.Time) (*coordinationv1.Lease, error) {
	next, err := nextToken(current)
	if err != nil {
		return nil, err
	}
	l := current.DeepCopy()
	forgetHandOff(l)
	t := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity = ptr.To(identity)
	l.Spec.LeaseTransitions = ptr.To(next)
	l.Spec.LeaseDurationSeconds = ptr.To(durationSeconds(duration))
	l.Spec.AcquireTime, l.Spec.RenewTime = &t, ptr.To(t)
	return relabelFront(l), nil
}

// Renew is current with its renew time moved to now and the given lease
// duration; holder and token are unchanged.
func Renew(current *coordinationv1.Lease, duration time.Duration, now time.Time) *coordinationv1.Lease {
	l := current.DeepCopy()
	l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
	l.Spec.LeaseDurationSeconds = ptr.To(durationSeconds(duration))
	return relabelFront(l)
}

// Release is current with no holder and no times; the token is unchanged,
// so the next grant gets the next one.
func Release(current *coordinationv1.Lease) *coordinationv1.Lease {
	l := current.DeepCopy()
	forgetHandOff(l)
	l.Spec.HolderIdentity = nil
	l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
	return relabelFront(l)
}

// Break is current released with its token raised by one, in the same
// write, so the previous holder is fenced by every later grant.
func Break(current *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	next, err := nextToken(current)
	if err != nil {
		return nil, err
	}
	l := Release(current)
	l.Spec.LeaseTransitions = ptr.To(next)
	return l, nil
}

// RaiseToFloor is current with its token raised to floor and its grant
// voided (a token at or below the floor may have been handed out before).
func RaiseToFloor(current *coordinationv1.Lease, floor int64) (*coordinationv1.Lease, error) {
	if floor > math.MaxInt32 {
		return nil, fmt.Errorf("%w: the recorded floor is %d", ErrTokensExhausted, floor)
	}
	l := Release(current)
	l.Spec.LeaseTransitions = ptr.To(int32(floor))
	return l, nil
}

// forgetHandOff drops the marks of a hand-off (whose ticket the grant
// names, who handed it on): they describe the grant being replaced.
func forgetHandOff(l *coordinationv1.Lease) {
	delete(l.Annotations, TicketAnnotation)
	delete(l.Annotations, HandedOffByAnnotation)
	delete(l.Annotations, GrantNonceAnnotation)
}

// nextToken is the token a new grant or break of current carries.
func nextToken(current *coordinationv1.Lease) (int32, error) {
	token := ptr.Deref(current.Spec.LeaseTransitions, 0)
	if token >= math.MaxInt32 {
		return 0, ErrTokensExhausted
	}
	return token + 1, nil
}

// durationSeconds is d in whole seconds, at least 1.
func durationSeconds(d time.Duration) int32 {
	return int32(max(d/time.Second, 1))
}
