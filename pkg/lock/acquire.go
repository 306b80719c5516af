package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// maxCASAttempts bounds how often one attempt re-reads after losing a
// compare-and-swap race before it reports the lock as contended.
const maxCASAttempts = 5

// errContended: a waiting attempt lost a compare-and-swap race; the watch
// brings the winner's write next.
var errContended = errors.New("lost a compare-and-swap race")

// candidate is a copy of the Lease to judge, and where it came from.
type candidate struct {
	lease *coordinationv1.Lease
	// fromWatch: the copy arrived in a watch event, so its record has just
	// changed (and no observer, the controller included, can have seen it
	// lapse yet).
	fromWatch bool
	// verified: the copy is a fresh read or a watch event, not a copy
	// remembered from an earlier call.
	verified bool
}

// waitHint tells Acquire what to wait for after a failed attempt: a change
// of the Lease after resourceVersion, or the observed expiry deadline.
type waitHint struct {
	resourceVersion string
	deadline        time.Time
	// judged is the copy the attempt decided on, to judge again when the
	// deadline passes with no change.
	judged candidate
}

// TryAcquire makes one attempt to take the lock. When another holder has it,
// the error is a *HeldError (errors.Is(err, ErrHeld)) saying who and until
// when. When the grant's answer came back too late to be used, the error
// matches ErrAnsweredTooLate (and ErrHeld).
func (c *Client) TryAcquire(ctx context.Context) (*Grant, error) {
	info, _, err := c.resolve(ctx, false)
	if err != nil {
		return nil, err
	}
	g, _, err := c.attempt(ctx, info, candidate{lease: c.remembered(info.leaseName)}, false)
	return g, err
}

// Acquire blocks until this client holds the lock or ctx ends; a ctx with a
// deadline makes it a try-lock with timeout. Waiting is event-driven: one
// watch of the Lease wakes it on every change (a release above all), and a
// timer at the observed expiry deadline; nothing polls.
func (c *Client) Acquire(ctx context.Context) (*Grant, error) {
	info, _, err := c.resolve(ctx, false)
	if err != nil {
		return nil, err
	}
	w := &leaseWatch{client: c, name: info.leaseName}
	defer w.stop()
	next := candidate{lease: c.remembered(info.leaseName)}
	for {
		g, hint, err := c.attempt(ctx, info, next, true)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, ErrHeld) && !errors.Is(err, ErrLeaseUnavailable) && !errors.Is(err, errContended) {
			return nil, err
		}
		var werr error
		if next, werr = w.next(ctx, hint); werr != nil {
			if errors.Is(err, errContended) {
				err = fmt.Errorf("%w: lock %s is contended", ErrHeld, c.LockName())
			}
			return nil, fmt.Errorf("%w (gave up waiting: %w)", err, werr)
		}
	}
}

// attempt is one try, in the steps of client-go's tryAcquireOrRenew:
//  1. Start from the candidate copy of the Lease, or a fresh read. A
//     remembered copy is only a fast path to a free Lease: one that shows a
//     holder, or is being deleted, is re-read first.
//  2. A Lease the lock does not control (not adopted yet, or owned by
//     something else), or one being deleted, cannot be granted: wait for the
//     controller.
//  3. Observe the Lease record on this client's monotonic clock.
//  4. If a holder (this identity included: another process may use it) has
//     it and neither this client nor the controller has observed it go
//     unrenewed for the lease duration: ErrHeld.
//  5. Compare-and-swap: take it with leaseTransitions+1 as the token.
//  6. On a conflict the copy was stale: a waiting caller waits for the
//     watch to bring the newer version; otherwise re-read and go to 2.
func (c *Client) attempt(ctx context.Context, info lockInfo, cand candidate, waiting bool) (*Grant, waitHint, error) {
	for range maxCASAttempts {
		if cand.lease != nil && !cand.verified && (cand.lease.DeletionTimestamp != nil || ptr.Deref(cand.lease.Spec.HolderIdentity, "") != "") {
			cand = candidate{}
		}
		if cand.lease == nil {
			l, err := c.readLease(ctx, info.leaseName)
			if err != nil {
				return nil, waitHint{deadline: c.cfg.Clock.Now().Add(info.duration)}, err
			}
			cand = candidate{lease: l, verified: true}
		}
		current := cand.lease
		hint := waitHint{resourceVersion: current.ResourceVersion, deadline: c.cfg.Clock.Now().Add(info.duration), judged: cand}
		if err := c.grantable(current, info); err != nil {
			return nil, hint, err
		}

		start := c.cfg.Clock.Now()
		obs := c.observer.Observe(info.leaseName, lease.RecordOf(current), start)
		if held, ok := c.heldByOther(ctx, obs, info, start, cand.fromWatch); ok {
			hint.deadline = obs.Deadline(info.duration)
			return nil, hint, held
		}

		updated, err := c.leases.Update(ctx, grantedLease(current, c.cfg.Identity, info.duration, start), metav1.UpdateOptions{})
		switch {
		case err == nil:
			c.remember(updated)
			if hint, late := c.answeredTooLate(info, updated, start); late != nil {
				return nil, hint, late
			}
			c.observer.Observe(info.leaseName, lease.RecordOf(updated), start)
			return newGrant(c, info, updated, start), waitHint{}, nil
		case apierrors.IsConflict(err) && waiting && cand.verified:
			return nil, hint, errContended
		case apierrors.IsConflict(err):
			cand = candidate{}
		default:
			c.remember(nil)
			return nil, waitHint{}, fmt.Errorf("acquiring lease %s/%s: %w", c.cfg.Namespace, info.leaseName, err)
		}
	}
	return nil, waitHint{deadline: c.cfg.Clock.Now().Add(info.duration)},
		fmt.Errorf("%w: lost %d compare-and-swap races in a row on lease %s/%s", ErrHeld, maxCASAttempts, c.cfg.Namespace, info.leaseName)
}

// answeredTooLate refuses a grant whose answer came back after its safe
// window (a slow or held-back network, a pause right after the request):
// others may already have taken the lock over, so it is never handed to
// the caller. The Lease, granted to this identity on the server, is left to
// expire, and this client judges that expiry from when the answer arrived,
// like everyone else who saw the write, so it does not take the lock back
// ahead of them. The error matches ErrAnsweredTooLate and ErrHeld, so
// Acquire waits on.
func (c *Client) answeredTooLate(info lockInfo, granted *coordinationv1.Lease, requestStart time.Time) (waitHint, error) {
	now := c.cfg.Clock.Now()
	if now.Before(c.safeUntil(info, requestStart)) {
		return waitHint{}, nil
	}
	c.observer.Forget(info.leaseName)
	obs := c.observer.Observe(info.leaseName, lease.RecordOf(granted), now)
	err := fmt.Errorf("%w: lock %s granted token %d %s after the request, past its safe window; not held, it lapses at %s",
		ErrAnsweredTooLate, c.LockName(), ptr.Deref(granted.Spec.LeaseTransitions, 0), now.Sub(requestStart).Round(time.Millisecond),
		obs.Deadline(info.duration).Format(time.RFC3339Nano))
	return waitHint{resourceVersion: granted.ResourceVersion, deadline: obs.Deadline(info.duration)}, err
}

// grantable checks that the Lease is the lock's own, in service: controlled
// by the lock, guarded by the token finalizer, not being deleted. Tokens on
// any other Lease would not be protected from going backwards.
func (c *Client) grantable(l *coordinationv1.Lease, info lockInfo) error {
	switch owner := metav1.GetControllerOf(l); {
	case l.DeletionTimestamp != nil:
		return fmt.Errorf("%w: Lease %s/%s is being deleted; the controller recreates it", ErrLeaseUnavailable, c.cfg.Namespace, l.Name)
	case owner == nil || owner.UID != info.uid || !slices.Contains(l.Finalizers, locksv1alpha1.LeaseTokenFinalizer):
		return fmt.Errorf("%w: Lease %s/%s is not (yet) managed by DistributedLock %s; is the frontdesk controller running?",
			ErrLeaseUnavailable, c.cfg.Namespace, l.Name, c.LockName())
	}
	return nil
}

// heldByOther reports whether a holder's grant is still live. It is
// live until this client has seen the same record for the lease duration,
// unless the controller, which may have been watching longer, already
// reports this very record Expired (not asked for records a watch event just
// brought: they changed a moment ago).
func (c *Client) heldByOther(ctx context.Context, obs lease.Observation, info lockInfo, now time.Time, fromWatch bool) (*HeldError, bool) {
	rec := obs.Record
	if rec.Holder == "" || !now.Before(obs.Deadline(info.duration)) {
		return nil, false
	}
	if !fromWatch {
		if _, lock, err := c.resolve(ctx, true); err == nil && controllerSawExpiry(lock, rec) {
			return nil, false
		}
	}
	return &HeldError{Lock: c.LockName(), Holder: rec.Holder, Token: int64(rec.Transitions), FreeAt: obs.Deadline(info.duration)}, true
}

// controllerSawExpiry reports whether the lock's status marks exactly this
// Lease record as Expired.
func controllerSawExpiry(lock *locksv1alpha1.DistributedLock, rec lease.Record) bool {
	held := meta.FindStatusCondition(lock.Status.Conditions, locksv1alpha1.ConditionHeld)
	st := lock.Status
	return held != nil && held.Reason == locksv1alpha1.ReasonExpired && st.Holder == rec.Holder &&
		st.FencingToken == int64(rec.Transitions) && st.RenewTime != nil && st.RenewTime.Time.Equal(rec.RenewTime)
}

// grantedLease is current taken by identity: the next token, fresh times and
// the lock's duration. The copy keeps current's resourceVersion, which makes
// the Update a compare-and-swap.
func grantedLease(current *coordinationv1.Lease, identity string, duration time.Duration, now time.Time) *coordinationv1.Lease {
	l := current.DeepCopy()
	t := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity = ptr.To(identity)
	l.Spec.LeaseTransitions = ptr.To(ptr.Deref(current.Spec.LeaseTransitions, 0) + 1)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(duration / time.Second))
	l.Spec.AcquireTime = &t
	l.Spec.RenewTime = &t
	return l
}
