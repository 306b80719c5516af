package lease

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// The edits below change a Lease's record as a whole object, for the
// controller. Each returns a modified copy that keeps the resourceVersion of
// the Lease it was made from, so writing it with Update is a
// compare-and-swap: it lands only if nobody wrote in between. None of them
// does I/O. They are not the controller's only changes to a record: it
// revokes its own candidates-mode grant by moving renewTime itself
// (revokeCandidateGrant in controllers/retire.go), sets the duration of a
// free Lease to the lock's (controllers/lease.go), and builds from the
// patches of writes.go its ending of a lapsed grant, its removal of
// passed-over places and the grants of lock-admitted pods.

// ErrTokensExhausted means the Lease's leaseTransitions is at the largest value
// an int32 holds, so no further grant can carry a higher fencing token until
// the controller starts a new token epoch (see Token).
var ErrTokensExhausted = errors.New("fencing tokens of this epoch exhausted: leaseTransitions is at its maximum (2147483647); " +
	"the frontdesk controller starts a new token epoch once the lock is free")

// EpochSize is how many tokens one token epoch holds: leaseTransitions is
// an int32.
const EpochSize = int64(math.MaxInt32) + 1

// Token is the Lease's fencing token: its token epoch (the manager's
// locks.frontdesk.dev/token-epoch, 0 when unset) times EpochSize, plus
// spec.leaseTransitions (0 when unset). Tokens of a later epoch are above
// every token of an earlier one.
func Token(l *coordinationv1.Lease) int64 {
	return Epoch(l)*EpochSize + int64(ptr.Deref(l.Spec.LeaseTransitions, 0))
}

// Epoch is the Lease's token epoch (0 when unset or not a number of the
// grammar, ParseNumber, as the lease-guard policy reads it: only the
// manager writes it).
func Epoch(l *coordinationv1.Lease) int64 {
	e, _ := ParseNumber(l.Annotations[locksv1alpha1.TokenEpochAnnotation])
	return e
}

// setToken sets l's token epoch and leaseTransitions so that Token(l) is
// token.
func setToken(l *coordinationv1.Lease, token int64) {
	epoch, transitions := token/EpochSize, int32(token%EpochSize)
	if epoch > 0 || Epoch(l) > 0 {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[locksv1alpha1.TokenEpochAnnotation] = strconv.FormatInt(epoch, 10)
	}
	l.Spec.LeaseTransitions = ptr.To(transitions)
}

// Exhausted reports whether l's leaseTransitions is at its maximum: no grant
// can be made on it in this token epoch.
func Exhausted(l *coordinationv1.Lease) bool {
	return ptr.Deref(l.Spec.LeaseTransitions, 0) == math.MaxInt32
}

// Holder is the Lease's spec.holderIdentity ("" when unset).
func Holder(l *coordinationv1.Lease) string {
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// Grant is current granted to identity, bound to principal (the writer's:
// see GrantPatch): the next fencing token, fresh acquire and renew times,
// and the given lease duration, in one write.
// Grant, Renew and Release also set the queue's front labels afresh (see
// FrontLabelPrefix).
func Grant(current *coordinationv1.Lease, identity, principal string, duration time.Duration, now time.Time) (*coordinationv1.Lease, error) {
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
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = principal
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
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[locksv1alpha1.BrokenAtAnnotation] = strconv.FormatInt(Token(l), 10)
	return l, nil
}

// RaiseToFloor is current with its token raised to floor (into a later
// token epoch if need be) and its grant voided (a token at or below the
// floor may have been handed out before).
func RaiseToFloor(current *coordinationv1.Lease, floor int64) (*coordinationv1.Lease, error) {
	if floor < 0 {
		return nil, fmt.Errorf("raising lease %s to a negative token floor %d", current.Name, floor)
	}
	l := Release(current)
	delete(l.Annotations, locksv1alpha1.LapsedAnnotation) // it named a token of the old count
	setToken(l, floor)
	return l, nil
}

// NewEpoch is current, free or held by a grant the controller marked lapsed,
// at the end of its token epoch (Exhausted), moved to the next epoch: token
// epoch plus one, leaseTransitions 0, no holder. Every later token is above
// every token of the epoch that ended.
func NewEpoch(current *coordinationv1.Lease) *coordinationv1.Lease {
	l := Release(current)
	delete(l.Annotations, locksv1alpha1.LapsedAnnotation) // it named a leaseTransitions of the epoch that ended
	setToken(l, (Epoch(current)+1)*EpochSize)
	return l
}

// forgetHandOff drops the marks of the grant being replaced (GrantAnnotations).
func forgetHandOff(l *coordinationv1.Lease) {
	for _, key := range locksv1alpha1.GrantAnnotations {
		delete(l.Annotations, key)
	}
}

// nextToken is the token a new grant or break of current carries.
func nextToken(current *coordinationv1.Lease) (int32, error) {
	token := ptr.Deref(current.Spec.LeaseTransitions, 0)
	if token == math.MaxInt32 {
		return 0, ErrTokensExhausted
	}
	return token + 1, nil
}

// durationSeconds is d in whole seconds, at least 1.
func durationSeconds(d time.Duration) int32 {
	return int32(max(d/time.Second, 1))
}
