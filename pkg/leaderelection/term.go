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
// ValidUntil is a local monotonic-clock time before which nobody else can
// take the Lease over (short of breaking the lock): the lease duration of
// the last successful write of this Term, minus the safety margin, counted
// from the first time this Lock sent a record that others could not tell
// apart from that write's record. Others restart their wait only when the
// record they read changes; client-go candidates see a record's renewTime
// to the second, so that first sending is the first write, failed ones
// included, whose renewTime fell in the same wall-clock second (a resent
// record, or another renewal within that second). See firstSent for the
// argument.
//
// What ends the Term, and when:
//   - Err and Lock.Term compare the clock with ValidUntil when they are
//     called: from ValidUntil on, Err returns ErrLost and Term returns nil.
//     Check Err right before each write.
//   - The Context is cancelled by a timer set for ValidUntil, whose function
//     runs on a goroutine of its own; after a pause of this process, code
//     that was ready to run may run before that goroutine does, so
//     ctx.Err() alone may still be nil a moment after ValidUntil.
//   - Sooner, when this process learns it no longer leads: the Lease shows
//     another holder or another token, client-go releases it (before the
//     release is sent), client-go stops leading (its RenewDeadline passed
//     without a renewal), the Lease is gone or being deleted, or a renewal
//     is about to carry an older renewTime than one already sent.
//
// One failed renewal does not end it: client-go retries until its
// RenewDeadline, and the window keeps counting.
//
// The Term bounds how long a running leader believes it leads. A process
// frozen between its check and its write can still send that write late;
// only the resource can refuse it, by its token.
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

// FencingKey is the key to fence the Term's writes on, with Token:
// "<namespace>/<name>" of the DistributedLock over the election Lease
// (fencing.LockKey of Config.Namespace and Config.LockName), the key a
// pkg/lock Grant of that lock gives too.
//
//	err := guard.Fence(ctx, term.FencingKey(), term.Token(), write)
func (t *Term) FencingKey() string { return t.lock.fencingKey }

// Context ends with the Term; context.Cause says why (ErrLost, ErrReleased).
// It is cancelled shortly after ValidUntil, not at it (see Term): use Err to
// decide whether to write.
func (t *Term) Context() context.Context { return t.ctx }

// Err is nil while the Term is held: its Context is live and the local
// monotonic clock is before ValidUntil. Otherwise it ends the Term (if the
// window ran out and the timer has not yet) and returns the cause, as
// context.Cause(t.Context()) then does. It needs no other goroutine to
// have run: call it right before each write.
func (t *Term) Err() error {
	l := t.lock
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkWindowLocked(t)
	return context.Cause(t.ctx)
}

// ValidUntil is the local monotonic-clock time until which the Term is
// certainly still held, as of the last successful write (see Term).
func (t *Term) ValidUntil() time.Time {
	t.lock.mu.Lock()
	defer t.lock.mu.Unlock()
	return t.validUntil
}
