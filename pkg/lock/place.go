package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// place is a caller's place in the lock's queue of waiters.
type place struct {
	// ticket names this Acquire call's place; "" for a caller that does
	// not queue (TryAcquire).
	ticket string
	// waiting: the caller waits, so it registers when it cannot have the
	// lock at once.
	waiting bool
	// registeredAt is when the first registration of the ticket was sent
	// (zero if none was). Any hand-off naming this ticket came after some
	// registration of it, so after registeredAt: no other client can see
	// the handed-off grant lapse before registeredAt plus the lease
	// duration the hand-off wrote. It never moves forward, even if the
	// caller registers again.
	registeredAt time.Time
	// readAt and read: a read of the Lease sent at readAt answered with
	// read, which did not hand the lock to this caller. A hand-off of a
	// later resourceVersion was written after readAt, so the front of the
	// queue reads the Lease while it waits (refreshHandOffWindow) to take a
	// hand-off up without renewing it first.
	readAt time.Time
	read   *coordinationv1.Lease
	// readTried is when the last such read was answered or failed; the
	// next read counts from then.
	readTried time.Time
	// sentRegistration: a registration was sent (it may have landed even
	// if its answer never came), so a caller that gives up leaves the queue.
	sentRegistration bool
	// principal is who the apiserver recorded as having taken the place
	// (its queued-by annotation, in the registration's answer; "" where no
	// policy records it): a hand-off to the place belongs to it.
	principal string
	// raced: a registration found the Lease changed since the copy it was
	// judged on (a crowd is registering); the next one is a merge patch,
	// sent at registerAt (see registrationSpread).
	raced      bool
	registerAt time.Time
	// uncertain is the token of a grant of the caller's that it did not
	// take (its answer never came, or came too late), and uncertainNonce
	// the nonce it was written with; a caller that gives up releases it if
	// it landed, and only then.
	uncertain      int64
	uncertainNonce string
}

// waitTurn is what a caller that cannot have the lock now waits for (hint:
// a change of the Lease after current, or the deadline). A waiting caller
// that is not in the queue registers first. At the front of the queue it
// reads the Lease now and then, so that a hand-off can be used at once
// (refreshHandOffWindow); behind the front it hears of the Lease only when
// it moves up, and reads it at its deadline (waitBehindFront).
func (c *Client) waitTurn(ctx context.Context, info lockInfo, current *coordinationv1.Lease, p *place, position int, hint waitHint) waitHint {
	if !p.waiting {
		return hint
	}
	if now := c.cfg.Clock.Now(); position < 0 && now.Before(p.registerAt) {
		// Spreading out its registration after a crowd's (see
		// registrationSpread): unwatched until then.
		hint.deadline = earliestTime(hint.deadline, p.registerAt)
		hint.unwatched = true
		return hint
	}
	if position < 0 {
		registered, at, err := c.register(ctx, current, p)
		if lostRace(err) {
			p.raceLost(c.cfg.Clock.Now(), info.duration)
			hint.deadline, hint.unwatched = earliestTime(hint.deadline, p.registerAt), true
			return hint
		}
		if err != nil {
			// Queue full, or the registration failed: wait unregistered
			// (behind everyone registered) and try again at the next
			// change.
			c.logger(ctx).Info("waiting without a place in the lock's queue", "lock", c.LockName(), "err", err)
			return hint
		}
		hint.resourceVersion, hint.judged = registered.ResourceVersion, leaseCopy{lease: registered, verified: true}
		position = at
	}
	if position < lease.FrontLength {
		if next := c.refreshHandOffWindow(ctx, info, p); next.Before(hint.deadline) {
			hint.deadline = next
		}
		return hint
	}
	hint.waitBehindFront(c.cfg.Clock.Now(), info.duration)
	return hint
}

// register puts the caller in the lock's queue, as judged from current:
// first with a patch that lands only on current's version (the usual case:
// nothing else wrote the Lease meanwhile), and once that lost a race, with a
// merge patch, which conflicts with no other write (see registrationSpread
// for when it is sent). It returns the Lease written and the caller's
// position in its queue.
func (c *Client) register(ctx context.Context, current *coordinationv1.Lease, p *place) (*coordinationv1.Lease, int, error) {
	w := lease.Waiter{Identity: c.cfg.Identity, Ticket: p.ticket, Priority: c.cfg.Priority}
	if !p.sentRegistration {
		p.registeredAt = c.cfg.Clock.Now()
	}
	p.sentRegistration = true
	var updated *coordinationv1.Lease
	var err error
	if p.raced {
		var merge []byte
		if merge, _, err = lease.Registration(current, w); err != nil {
			return nil, -1, err
		}
		updated, err = c.leases.Patch(ctx, current.Name, types.MergePatchType, merge, metav1.PatchOptions{})
	} else {
		var exact *lease.Patch
		if exact, _, err = lease.ExactRegistration(current, w); err != nil {
			return nil, -1, err
		}
		var next *coordinationv1.Lease
		if next, err = exact.ApplyTo(current); err != nil {
			return nil, -1, err
		}
		updated, err = c.leases.Update(ctx, next, metav1.UpdateOptions{})
	}
	if err != nil {
		return nil, -1, refusal(err)
	}
	c.remember(updated)
	p.principal = updated.Annotations[lease.QueuedByKey(p.ticket)]
	c.cfg.Metrics.queued(c.cfg.Namespace, c.cfg.Name)
	position := lease.Position(updated, p.ticket)
	c.logger(ctx).V(1).Info("waiting in the lock's queue", "lock", c.LockName(), "position", position)
	return updated, position, nil
}

// handedToMe reports whether current is a release that handed the lock to
// the caller's ticket: its identity and ticket, and, where the policies
// record principals, the principal that took the place (a grant bound to
// another principal is that principal's, whatever it names).
func handedToMe(current *coordinationv1.Lease, identity string, p *place) bool {
	if p.ticket == "" || lease.Holder(current) != identity || current.Annotations[locksv1alpha1.TicketAnnotation] != p.ticket {
		return false
	}
	bound := current.Annotations[locksv1alpha1.HolderPrincipalAnnotation]
	return p.principal == "" || bound == p.principal
}

// landedUncertain reports whether current is the caller's own grant that
// it did not take: its identity, its token and its attempt's nonce.
func landedUncertain(current *coordinationv1.Lease, identity string, p *place) bool {
	return p.uncertain != 0 && p.uncertainNonce != "" && lease.Holder(current) == identity &&
		lease.Token(current) == p.uncertain && current.Annotations[locksv1alpha1.GrantNonceAnnotation] == p.uncertainNonce
}

// leaveQueue takes a caller that gave up out of the queue (best effort,
// bounded). A release that handed it the lock meanwhile, or a grant of its
// own that it did not take, is handed on or released, so it does not sit
// on a lock nobody uses. What it could not end is remembered on the Client
// (see leftover), and cleared by its next attempt.
func (c *Client) leaveQueue(info lockInfo, p *place) {
	if !p.sentRegistration && p.uncertain == 0 {
		return
	}
	lo := leftover{token: p.uncertain, nonce: p.uncertainNonce, ticket: p.ticket}
	if !p.sentRegistration {
		lo.ticket = ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := c.modifyLease(ctx, info, func(l *coordinationv1.Lease) (*lease.Patch, error) {
		if handedToMe(l, c.cfg.Identity, p) || landedUncertain(l, c.cfg.Identity, p) {
			return c.releasePatch(l, info), nil
		}
		return nil, errNothingToDo
	})
	if err != nil && !errors.Is(err, errNothingToDo) && !apierrors.IsNotFound(err) {
		c.leaveBehind(lo)
		return
	}
	if lo.ticket == "" {
		return
	}
	if err := c.withdraw(ctx, info, lo.ticket); err != nil {
		c.leaveBehind(leftover{ticket: lo.ticket})
	}
}

// withdraw removes the place with ticket from the lock's queue (a merge
// patch that touches only that ticket's keys); a Lease already gone is no
// error.
func (c *Client) withdraw(ctx context.Context, info lockInfo, ticket string) error {
	withdrawal, err := lease.Withdrawal(ticket)
	if err != nil {
		return err
	}
	_, err = c.writes.Patch(ctx, info.leaseName, types.MergePatchType, withdrawal, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// refreshHandOffWindow is run by a waiter at the front of the queue. When
// what it knows (its registration, or its last read) is older than half a
// renew interval, it reads the Lease, a quorum read, so that the next
// hand-off is known to be written after this moment (see
// handOffWrittenAfter): a hand-off it can vouch for that recently can be
// used at once, with its first renewal where a grant of its own would have
// it (see claimHandOff). It returns when to run again: half a renew interval
// after what it knows, and never sooner than a quarter of one after its
// last read's answer (or failure; a read gets half a renew interval). So a
// waiter at the front reads about twice per renew interval, and writes
// nothing.
func (c *Client) refreshHandOffWindow(ctx context.Context, info lockInfo, p *place) (next time.Time) {
	interval := c.renewInterval(info)
	due := func() time.Time {
		return latest(latest(p.registeredAt, p.readAt).Add(interval/2), p.readTried.Add(interval/4))
	}
	now := c.cfg.Clock.Now()
	if now.Before(due()) {
		return due()
	}
	readCtx, cancel := context.WithTimeout(ctx, interval/2)
	defer cancel()
	l, err := c.readLease(readCtx, info.leaseName)
	// The next read counts from this answer, not from the request: a slow
	// apiserver gets no reads back to back.
	p.readTried = c.cfg.Clock.Now()
	if err == nil && !handedToMe(l, c.cfg.Identity, p) {
		// An answer naming this ticket is no moment before the hand-off:
		// a later version carrying the same hand-off would look newer.
		p.readAt, p.read = now, l
	}
	return due()
}

// handOffWrittenAfter is the latest time this caller knows current, a
// hand-off naming its ticket, to have been written after: the sending of
// its first registration (the ticket was not queued before), or of a later
// read whose answer current is newer than (newerVersion: resourceVersions
// are etcd revisions, and a quorum read is answered as of a moment after
// it was sent). Zero when neither is known.
func (p *place) handOffWrittenAfter(current *coordinationv1.Lease) time.Time {
	if p.read != nil && p.readAt.After(p.registeredAt) && newerVersion(current, p.read) {
		return p.readAt
	}
	return p.registeredAt
}

// latest is the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// raceLost records that a write of the caller, not yet registered, lost a
// race (a crowd is taking or registering at the same moment): its
// registration is then a merge patch, sent at a random moment of the spread
// from now on (see registrationSpread).
func (p *place) raceLost(now time.Time, leaseDuration time.Duration) {
	if p.raced || p.ticket == "" {
		return
	}
	p.raced = true
	p.registerAt = now.Add(registrationSpread(leaseDuration))
}

// maxRegistrationSpread bounds registrationSpread.
const maxRegistrationSpread = 15 * time.Second

// registrationSpread is how long a waiter whose registration lost a race
// waits, unwatched, before it registers with a merge patch: a random moment
// within half a lease (at least a turn, at most maxRegistrationSpread). A
// lost race means that others are registering at the same moment (a crowd
// arriving at once). Merge patches never fail on each other, but the
// apiserver applies the writes of one Lease one at a time and redoes those
// that lost (a crowd merging at once makes it redo its work the square of
// the crowd's size times, starving the holder's renewals); spread out, the
// crowd's registrations land one after another, and the holder's renewals
// between them. The first of N sleepers wakes after about 1/N of the
// spread, so a lock that falls free meanwhile is not left free for long.
// Waiters of one crowd may queue in any order among themselves.
func registrationSpread(leaseDuration time.Duration) time.Duration {
	w := min(max(leaseDuration/2, lease.TurnLength(leaseDuration)), maxRegistrationSpread)
	return time.Duration(rand.Int64N(int64(w) + 1))
}

// earliestTime is the earlier of a and b, ignoring zero times.
func earliestTime(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// learnPrincipal fills in the principal of the caller's place when its
// registration's answer did not say it: from the place itself while it is
// queued, or, for a hand-off naming the caller's ticket and bound to a
// principal, from the apiserver (a hand-off is the caller's only if it is
// bound to the principal that registered, which is this client).
func (c *Client) learnPrincipal(ctx context.Context, current *coordinationv1.Lease, p *place) {
	if p.ticket == "" || p.principal != "" {
		return
	}
	if queuedBy := current.Annotations[lease.QueuedByKey(p.ticket)]; queuedBy != "" {
		p.principal = queuedBy
		return
	}
	if current.Annotations[locksv1alpha1.TicketAnnotation] == p.ticket && current.Annotations[locksv1alpha1.HolderPrincipalAnnotation] != "" {
		if self, err := c.selfPrincipal(ctx); err == nil {
			p.principal = self
		}
	}
}
