package leaderelection

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Term is one stretch of leadership under one fencing token: it begins with
// the successful write that made this process leader (or raised its token)
// and ends, for good, when its Context does.
//
// What Context guarantees: it is cancelled no later than ValidUntil, the
// start of the last successful write of this Term (when the request was
// sent, on the local monotonic clock) plus the lease duration that write
// recorded, minus the safety margin. Nobody else can take the Lease over
// before that: client-go candidates, frontdesk clients and frontdesk's
// controller all wait a full lease duration after they first see a record,
// and they can first see it only after it was sent. It is cancelled sooner
// when this process learns it no longer leads: the Lease shows another
// holder or another token, client-go releases it (before the release is
// sent), client-go stops leading (its RenewDeadline passed without a
// renewal), or the Lease is gone or being deleted. One failed renewal does
// not end it: client-go retries until its RenewDeadline, and the window
// keeps counting.
//
// The Context bounds how long a running leader believes it leads. A
// process frozen between its check of the Context and its write can still
// send that write late; only the resource can refuse it, by its token.
type Term struct {
	lock   *Lock
	token  int64
	ctx    context.Context
	cancel context.CancelCauseFunc

	// Guarded by lock.mu.
	validUntil time.Time
	timer      clock.Timer
	generation int
}

// Token is the Term's fencing token: the Lease's spec.leaseTransitions in
// the apiserver's answer to the write that began the Term. Pass it with
// every write to a fenced resource.
func (t *Term) Token() int64 { return t.token }

// Context ends with the Term; context.Cause says why (ErrLost, ErrReleased).
func (t *Term) Context() context.Context { return t.ctx }

// ValidUntil is the local monotonic-clock time until which the Term is
// certainly still held, as of the last successful write.
func (t *Term) ValidUntil() time.Time {
	t.lock.mu.Lock()
	defer t.lock.mu.Unlock()
	return t.validUntil
}
