package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// maxCASAttempts bounds how often one attempt re-reads after losing a
// compare-and-swap race before it reports the lock as contended.
const maxCASAttempts = 5

// waitHint tells Acquire what to wait for after a failed attempt: a change
// of the Lease after resourceVersion, or the observed expiry deadline.
type waitHint struct {
	leaseName       string
	resourceVersion string
	deadline        time.Time
}

// TryAcquire makes one attempt to take the lock. When another holder has it,
// the error is a *HeldError (errors.Is(err, ErrHeld)) saying who and until
// when.
func (c *Client) TryAcquire(ctx context.Context) (*Grant, error) {
	g, _, err := c.attempt(ctx)
	return g, err
}

// Acquire blocks until this client holds the lock or ctx ends; a ctx with a
// deadline makes it a try-lock with timeout. Waiting is event-driven: it
// watches the Lease and wakes on a release or at the observed expiry
// deadline, with no polling.
func (c *Client) Acquire(ctx context.Context) (*Grant, error) {
	for {
		g, hint, err := c.attempt(ctx)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, ErrHeld) && !errors.Is(err, ErrLeaseUnavailable) {
			return nil, err
		}
		if werr := c.waitForChange(ctx, hint); werr != nil {
			return nil, fmt.Errorf("%w (gave up waiting: %w)", err, werr)
		}
	}
}

// attempt is one try, in the steps of client-go's tryAcquireOrRenew:
//  1. Resolve the lock's Lease name and duration (cached after the first).
//  2. Read the Lease: the newest one this client saw, else a fresh read
//     (a remembered copy that shows another holder is always re-read).
//  3. A missing or terminating Lease cannot be granted: wait for the
//     controller to (re)create it.
//  4. Observe the Lease record on this client's monotonic clock.
//  5. If another holder has it and neither this client nor the controller
//     has observed it go unrenewed for the lease duration: ErrHeld.
//  6. Compare-and-swap: take it with leaseTransitions+1 as the token.
//  7. On a conflict the copy was stale: re-read and start over at 3.
func (c *Client) attempt(ctx context.Context) (*Grant, waitHint, error) {
	info, _, err := c.resolve(ctx, false)
	if err != nil {
		return nil, waitHint{}, err
	}
	fresh := false
	for range maxCASAttempts {
		current, err := c.readLease(ctx, info.leaseName, fresh)
		if err != nil {
			return nil, waitHint{leaseName: info.leaseName, deadline: c.cfg.Clock.Now().Add(info.duration)}, err
		}
		if current.DeletionTimestamp != nil {
			return nil, waitHint{leaseName: info.leaseName, resourceVersion: current.ResourceVersion, deadline: c.cfg.Clock.Now().Add(info.duration)},
				fmt.Errorf("%w: Lease %s/%s is being deleted; the controller recreates it", ErrLeaseUnavailable, c.cfg.Namespace, info.leaseName)
		}

		start := c.cfg.Clock.Now()
		obs := c.observer.Observe(info.leaseName, lease.RecordOf(current), start)
		if held, ok := c.heldByOther(ctx, obs, info, start); ok {
			if !fresh {
				// The remembered copy is only a fast path to a free lock;
				// judge a held one on a fresh read.
				fresh = true
				continue
			}
			return nil, waitHint{leaseName: info.leaseName, resourceVersion: current.ResourceVersion, deadline: obs.Deadline(info.duration)}, held
		}

		updated, err := c.leases.Update(ctx, grantedLease(current, c.cfg.Identity, info.duration, start), metav1.UpdateOptions{})
		switch {
		case err == nil:
			c.remember(updated)
			c.observer.Observe(info.leaseName, lease.RecordOf(updated), start)
			return newGrant(c, info, updated, start), waitHint{}, nil
		case apierrors.IsConflict(err):
			fresh = true
		default:
			c.remember(nil)
			return nil, waitHint{}, fmt.Errorf("acquiring lease %s/%s: %w", c.cfg.Namespace, info.leaseName, err)
		}
	}
	return nil, waitHint{leaseName: info.leaseName, deadline: c.cfg.Clock.Now().Add(info.duration)},
		fmt.Errorf("%w: lost %d compare-and-swap races in a row on lease %s/%s", ErrHeld, maxCASAttempts, c.cfg.Namespace, info.leaseName)
}

// heldByOther reports whether another holder's grant is still live. It is
// live until this client has seen the same record for the lease duration,
// unless the controller, which has been watching longer, already reports
// this very record Expired.
func (c *Client) heldByOther(ctx context.Context, obs lease.Observation, info lockInfo, now time.Time) (*HeldError, bool) {
	rec := obs.Record
	if rec.Holder == "" || rec.Holder == c.cfg.Identity || !now.Before(obs.Deadline(info.duration)) {
		return nil, false
	}
	if _, lock, err := c.resolve(ctx, true); err == nil && controllerSawExpiry(lock, rec) {
		return nil, false
	}
	return &HeldError{Lock: c.LockName(), Holder: rec.Holder, Token: int64(rec.Transitions), FreeAt: obs.Deadline(info.duration)}, true
}

// controllerSawExpiry reports whether the lock's status marks exactly this
// Lease record as Expired.
func controllerSawExpiry(lock *locksv1alpha1.DistributedLock, rec lease.Record) bool {
	held := meta.FindStatusCondition(lock.Status.Conditions, locksv1alpha1.ConditionHeld)
	st := lock.Status
	return held != nil && held.Reason == locksv1alpha1.ReasonExpired && st.Holder == rec.Holder && st.FencingToken == int64(rec.Transitions) &&
		st.RenewTime != nil && st.RenewTime.Time.Equal(rec.RenewTime)
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

// waitForChange blocks until the Lease changes after hint.resourceVersion,
// the observed deadline passes, or ctx ends. The Lease seen in the watch
// event becomes the next attempt's starting point.
func (c *Client) waitForChange(ctx context.Context, hint waitHint) error {
	if hint.leaseName == "" {
		return ctx.Err()
	}
	timer := c.cfg.Clock.NewTimer(max(hint.deadline.Sub(c.cfg.Clock.Now()), time.Millisecond))
	defer timer.Stop()
	w, err := c.leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", hint.leaseName).String(),
		ResourceVersion: hint.resourceVersion,
	})
	if err != nil {
		// No watch (e.g. the resourceVersion is too old): re-read at once,
		// unless ctx is over.
		c.remember(nil)
		return ctx.Err()
	}
	defer w.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C():
		return nil
	case ev, ok := <-w.ResultChan():
		if l, isLease := ev.Object.(*coordinationv1.Lease); ok && isLease && (ev.Type == watch.Added || ev.Type == watch.Modified) {
			c.remember(l)
		} else {
			c.remember(nil)
		}
		return nil
	}
}
