package lock

import (
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// grantable checks that the Lease is the lock's own, in service: controlled
// by the lock, guarded by the token finalizer, not being deleted, and not
// wound back below a token already granted or recorded. Tokens on any other
// Lease would not be protected from going backwards.
func (c *Client) grantable(l *coordinationv1.Lease, info lockInfo) error {
	switch {
	case info.deleting:
		return fmt.Errorf("%w: lock %s is being deleted: its Lease %s stays as the record of its fencing tokens and grants nothing more "+
			"(the lock goes once its holder has released or lapsed; create it again to use it)", ErrLeaseUnavailable, c.LockName(), l.Name)
	case l.DeletionTimestamp != nil:
		return fmt.Errorf("%w: Lease %s/%s is being deleted; the controller recreates it with its fencing token kept",
			ErrLeaseUnavailable, c.cfg.Namespace, l.Name)
	case !controlledBy(l, info.uid) || !slices.Contains(l.Finalizers, locksv1alpha1.LeaseTokenFinalizer):
		return fmt.Errorf("%w: Lease %s/%s is not (yet) managed by DistributedLock %s; is the frontdesk controller running?",
			ErrLeaseUnavailable, c.cfg.Namespace, l.Name, c.LockName())
	case lease.Token(l) < c.floor(info):
		return fmt.Errorf("%w: Lease %s/%s has fencing token %d, below the %d already granted or recorded for lock %s "+
			"(it was wound back by hand); no token is granted on it until the frontdesk controller restores it",
			ErrLeaseUnavailable, c.cfg.Namespace, l.Name, lease.Token(l), c.floor(info), c.LockName())
	}
	return nil
}

// lockRecreated reports whether l is controlled by a DistributedLock of
// this name with a UID other than the one this client knows (the lock was
// deleted and created again), and if so returns the new lock's info.
func (c *Client) lockRecreated(ctx context.Context, l *coordinationv1.Lease, info lockInfo) (lockInfo, bool) {
	uid := lease.ControllerUID(l)
	if uid == "" || uid == info.uid || l.Labels[locksv1alpha1.LockNameLabel] != c.cfg.Name {
		return info, false
	}
	fresh, err := c.resolve(ctx, true)
	if err != nil || fresh.uid != uid || fresh.leaseName != info.leaseName {
		return info, false
	}
	return fresh, true
}

// identityInUse refuses current when another live client uses this
// client's identity: a grant to it that is not this caller's (not a
// hand-off to its ticket, not its own grant not taken), or another place in
// the queue under it ahead of the caller's. Two processes sharing an
// identity would otherwise each take the other's records for their own.
// Where the policies record principals, only a grant or place of this
// client's own principal counts: an identity is a name anyone can write,
// and another principal's place or grant under it is that principal's,
// no reason to lock this client out.
func (c *Client) identityInUse(ctx context.Context, current *coordinationv1.Lease, p *place) error {
	id := c.cfg.Identity
	if lease.Holder(current) == id && !handedToMe(current, id, p) && !landedUncertain(current, id, p) &&
		c.mine(ctx, p, current.Annotations[locksv1alpha1.HolderPrincipalAnnotation]) {
		return &IdentityInUseError{Lock: c.LockName(), Identity: id, Holds: true, Token: lease.Token(current)}
	}
	if lease.Holder(current) == "" {
		// On a free lock a place under this identity ahead of the caller
		// either takes its turn now (then its grant is refused above) or
		// is dead, and the controller removes it once its turn passed: the
		// caller waits its turn behind it.
		return nil
	}
	q := lease.Queue(current)
	mine := slices.IndexFunc(q, func(w lease.Waiter) bool { return w.Ticket == p.ticket })
	for i, w := range q {
		if w.Identity == id && w.Ticket != p.ticket && (mine < 0 || i < mine) && c.mine(ctx, p, w.Principal) {
			return &IdentityInUseError{Lock: c.LockName(), Identity: id, Position: i}
		}
	}
	return nil
}

// mine reports whether a grant or place recorded as made by principal is
// this client's principal's ("" where no policy records principals: then
// it may be). When this client's principal cannot be learnt, it counts as
// its: the cautious answer for a client that must not share its identity.
func (c *Client) mine(ctx context.Context, p *place, principal string) bool {
	if principal == "" {
		return true
	}
	self := p.principal
	if self == "" {
		var err error
		if self, err = c.selfPrincipal(ctx); err != nil {
			return true
		}
	}
	return principal == self
}

// heldOrQueued reports whether the caller cannot take the lock now: a
// holder's grant is live (see heldByOther), or the lock is free but waiters
// ahead of the caller in the queue still have their turn. position is the
// caller's place in the queue (-1 if it is not queued: it then comes after
// all queueLength waiters). turnAt is when to look again with no change in
// between.
func (c *Client) heldOrQueued(obs lease.Observation, info lockInfo, position, queueLength int, now time.Time) (*HeldError, time.Time) {
	if position < 0 {
		position = queueLength
	}
	turn := lease.Turn(position, info.duration)
	held, freeSince, recheck := c.heldByOther(obs, info, now)
	if held != nil {
		held.Ahead = position
		return held, recheck
	}
	if turnAt := freeSince.Add(turn); now.Before(turnAt) {
		return &HeldError{Lock: c.LockName(), Ahead: position, Token: obs.Record.Token, FreeAt: turnAt}, turnAt
	}
	return nil, time.Time{}
}

// heldByOther reports whether a holder's grant is live, and if not since
// when the lock has been free as observed here. A grant ends only with its
// holder's release, a break, or the controller's lapse mark: the
// controller, which judges expiry on its own monotonic clock, marks a grant
// it has seen go unrenewed for the lease duration (see
// locksv1alpha1.LapsedAnnotation), and the lease-guard policy lets nobody
// but the holder touch a grant that is not marked. So a waiter never takes
// over on its own judgement; it expects the mark at about the moment the
// same record has gone unchanged for the lease duration on its own clock
// (FreeAt), and looks again then (recheck) if nothing came meanwhile.
func (c *Client) heldByOther(obs lease.Observation, info lockInfo, now time.Time) (held *HeldError, freeSince, recheck time.Time) {
	rec := obs.Record
	if rec.Holder == "" {
		return nil, obs.ObservedAt, time.Time{}
	}
	deadline := obs.Deadline(info.duration)
	recheck = deadline
	if !now.Before(deadline) {
		// Past the lease as observed here, no mark yet: the controller's
		// clock started later, or it is slow or down. Look again a turn
		// later.
		recheck = now.Add(lease.TurnLength(info.duration))
	}
	return &HeldError{Lock: c.LockName(), Holder: rec.Holder, Token: rec.Token, FreeAt: deadline}, time.Time{}, recheck
}

// answeredTooLate refuses a grant whose answer came back after its safe
// window (a slow or held-back network, a pause right after the request):
// others may already have taken the lock over, so it is never handed to
// the caller. The Lease, granted to this identity on the server, stays
// granted while the caller waits on (the caller remembers it as its own
// grant not taken, and releases it if it gives up); this client judges its
// expiry from when the answer arrived, like everyone else who saw the
// write, so it does not take the lock back ahead of them. The error matches
// ErrAnsweredTooLate and ErrHeld, so Acquire waits on.
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
