package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

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
	// principal is this client's, which its registration wrote as the
	// place's (queued-by): a hand-off to the place is bound to it.
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

// leaseCopy is a copy of the Lease to judge, and where it came from.
type leaseCopy struct {
	lease *coordinationv1.Lease
	// fromWatch: the copy arrived in an event of a watch of every change.
	fromWatch bool
	// verified: the copy is a fresh read or a watch event, not a copy
	// remembered from an earlier call.
	verified bool
}

// waitHint tells Acquire what to wait for after a failed attempt: a change
// of the Lease after resourceVersion, or the deadline.
type waitHint struct {
	resourceVersion string
	deadline        time.Time
	// judged is the copy the attempt decided on, to judge again when the
	// deadline passes with no change.
	judged leaseCopy
	// behindFront: the caller waits in the queue behind its first
	// lease.FrontLength waiters, so it needs to hear of the Lease only when
	// it moves up to the front (see leaseWatch), and reads it afresh at the
	// deadline, which is at most maxRecheck away (waitBehindFront).
	behindFront bool
	// unwatched: the caller neither watches nor judges until the
	// deadline, then reads the Lease afresh.
	unwatched bool
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
	principal, err := c.selfPrincipal(ctx)
	if err != nil {
		return nil, -1, err
	}
	w := lease.Waiter{Identity: c.cfg.Identity, Ticket: p.ticket, Priority: c.cfg.Priority, Principal: principal}
	if !p.sentRegistration {
		p.registeredAt = c.cfg.Clock.Now()
	}
	p.sentRegistration = true
	p.principal = principal
	var updated *coordinationv1.Lease
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
	c.cfg.Metrics.queued(c.cfg.Namespace, c.cfg.Name)
	position := lease.Position(updated, p.ticket)
	c.logger(ctx).V(1).Info("waiting in the lock's queue", "lock", c.LockName(), "position", position)
	return updated, position, nil
}

// handedToMe reports whether current is a release that handed the lock to
// the caller's ticket: its identity and ticket, bound to this client's
// principal (a grant bound to another principal is that principal's,
// whatever it names).
func handedToMe(current *coordinationv1.Lease, identity string, p *place) bool {
	if p.ticket == "" || p.principal == "" || lease.Holder(current) != identity || current.Annotations[locksv1alpha1.TicketAnnotation] != p.ticket {
		return false
	}
	return current.Annotations[locksv1alpha1.HolderPrincipalAnnotation] == p.principal
}

// landedUncertain reports whether current is the caller's own grant that
// it did not take: its identity, its token and its attempt's nonce.
func landedUncertain(current *coordinationv1.Lease, identity string, p *place) bool {
	return p.uncertain != 0 && p.uncertainNonce != "" && lease.Holder(current) == identity &&
		lease.Token(current) == p.uncertain && current.Annotations[locksv1alpha1.GrantNonceAnnotation] == p.uncertainNonce
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

// earliestTime is the earlier of a and b, ignoring zero times.
func earliestTime(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// waitBehindFront makes h the hint of a caller behind the front of the
// queue. Its watch hears of nothing else, so it also reads the Lease at
// least once per lease duration (or maxRecheck, if shorter), at a random
// moment in the last quarter of that, so that waiters who registered
// together do not read together: what a scoped watch does not bring (the
// Lease deleted and created again, a front label not set) costs it at most
// that long.
func (h *waitHint) waitBehindFront(now time.Time, duration time.Duration) {
	h.behindFront = true
	recheck := min(duration, maxRecheck)
	recheck -= time.Duration(rand.Int64N(int64(recheck/4) + 1))
	if at := now.Add(recheck); at.Before(h.deadline) {
		h.deadline = at
	}
}

// leaseWatch is the one watch an Acquire call keeps on its Lease. It is
// opened at the first wait, reopened when the server ends it, and narrowed
// or widened as the caller moves in the queue: a waiter behind the front
// of the queue (its first lease.FrontLength waiters) watches the Lease only
// for the moment it moves up to the front (lease.FrontSelector on its
// ticket), so that a renewal or a registration reaches the front alone
// instead of every waiter; the front, and a caller outside the queue,
// watch every change.
type leaseWatch struct {
	client *Client
	name   string
	// ticket is the caller's place in the queue ("" when it has none).
	ticket string
	w      watch.Interface
	// scoped: w watches only for the Lease naming ticket at the front.
	scoped bool
	// retries backs off the watches in a row that could not be opened;
	// failing says one failed last.
	retries wait.Backoff
	failing bool
}

// next waits for the Lease's next change, the hint's deadline, or the end of
// ctx, and returns the copy of the Lease to judge next (an empty leaseCopy
// means: read it afresh).
func (lw *leaseWatch) next(ctx context.Context, hint waitHint) (leaseCopy, error) {
	if hint.unwatched {
		return leaseCopy{}, lw.sleep(ctx, hint.deadline)
	}
	clk := lw.client.cfg.Clock
	timer := clk.NewTimer(max(hint.deadline.Sub(clk.Now()), time.Millisecond))
	defer timer.Stop()
	scoped := hint.behindFront && lw.ticket != ""
	if lw.w != nil && lw.scoped != scoped {
		lw.stop()
	}
	if lw.w == nil {
		selector := ""
		if scoped {
			selector = lease.FrontSelector(lw.ticket)
		}
		w, err := lw.client.watchLease(ctx, lw.name, hint.resourceVersion, selector)
		if err != nil {
			// No watch (the resourceVersion may be too old, or watching is
			// not allowed, or the apiserver is away): back off, then read
			// afresh.
			if !lw.failing {
				lw.retries, lw.failing = watchBackoff(), true
			}
			backoff := clk.NewTimer(jitterDown(lw.retries.Step()))
			defer backoff.Stop()
			select {
			case <-ctx.Done():
				return leaseCopy{}, ctx.Err()
			case <-timer.C():
			case <-backoff.C():
			}
			return leaseCopy{}, nil
		}
		lw.w, lw.scoped, lw.failing = w, scoped, false
	}
	select {
	case <-ctx.Done():
		return leaseCopy{}, ctx.Err()
	case <-timer.C():
		if lw.scoped {
			// A scoped watch hears of no renewal: read afresh.
			return leaseCopy{}, nil
		}
		// Nothing changed until the deadline: judge the same copy again,
		// now past its observed expiry.
		return hint.judged, nil
	case ev, ok := <-lw.w.ResultChan():
		if l, isLease := ev.Object.(*coordinationv1.Lease); ok && isLease && (ev.Type == watch.Added || ev.Type == watch.Modified) {
			lw.client.remember(l)
			// A scoped watch brings the Lease when the caller reaches the
			// front, whenever its record last changed.
			return leaseCopy{lease: l, fromWatch: !lw.scoped, verified: true}, nil
		}
		// Anything else is read afresh. Never judge a DELETED event's
		// object: when the Lease stops matching a scoped watch's selector,
		// the apiserver sends its content before the change under the
		// change's resourceVersion, a copy that never existed (a grant
		// compare-and-swapped on it would overwrite the change).
		if !ok || ev.Type == watch.Error {
			lw.stop()
		}
		lw.client.remember(nil)
		return leaseCopy{}, nil
	}
}

// sleep waits, unwatched, until deadline or the end of ctx (its error).
func (lw *leaseWatch) sleep(ctx context.Context, deadline time.Time) error {
	lw.stop()
	clk := lw.client.cfg.Clock
	timer := clk.NewTimer(max(deadline.Sub(clk.Now()), time.Millisecond))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C():
		return nil
	}
}

// watchLease watches the Lease name from resourceVersion ("" for its
// current state), every change of it, or only while it matches the label
// selector (when not "").
func (c *Client) watchLease(ctx context.Context, name, resourceVersion, labelSelector string) (watch.Interface, error) {
	return c.leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		LabelSelector:   labelSelector,
		ResourceVersion: resourceVersion,
	})
}

func (lw *leaseWatch) stop() {
	if lw.w != nil {
		lw.w.Stop()
		lw.w = nil
	}
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

// maxLeftovers bounds what a Client remembers of what it left behind; the
// controller clears the rest (a grant lapses, a dead place is passed over).
const maxLeftovers = 8

// leftover is a record this client may have left on the lock's Lease: a
// grant whose release failed or whose answer never came (token, with the
// nonce or hand-off ticket it was written with), or a place in the queue
// whose withdrawal failed (ticket). Both are this client's own, no longer
// used by anybody: the next attempt clears them rather than take them for
// another client's under the same identity (see identityInUse).
type leftover struct {
	token  int64
	nonce  string
	ticket string
}

// leftovers is what a Client left behind, newest last.
type leftovers struct {
	mu    sync.Mutex
	items []leftover
}

// leaveBehind remembers lo (the oldest is forgotten beyond maxLeftovers).
func (c *Client) leaveBehind(lo leftover) {
	c.left.mu.Lock()
	defer c.left.mu.Unlock()
	c.left.items = append(c.left.items, lo)
	if len(c.left.items) > maxLeftovers {
		c.left.items = c.left.items[1:]
	}
}

// forgetLeftover forgets lo, cleared or gone.
func (c *Client) forgetLeftover(lo leftover) {
	c.left.mu.Lock()
	defer c.left.mu.Unlock()
	c.left.items = slices.DeleteFunc(c.left.items, func(x leftover) bool { return x == lo })
}

// leftOn returns a leftover of this client's that current still records.
func (c *Client) leftOn(current *coordinationv1.Lease) (leftover, bool) {
	c.left.mu.Lock()
	defer c.left.mu.Unlock()
	for _, lo := range c.left.items {
		if lo.grantOn(current, c.cfg.Identity) || lo.placeOn(current) {
			return lo, true
		}
	}
	return leftover{}, false
}

// grantOn reports whether current's grant is lo: held under identity and
// handed to lo's ticket, or with lo's token and written with lo's nonce.
func (lo leftover) grantOn(current *coordinationv1.Lease, identity string) bool {
	if lease.Holder(current) != identity {
		return false
	}
	if lo.ticket != "" && current.Annotations[locksv1alpha1.TicketAnnotation] == lo.ticket {
		return true
	}
	return lo.token != 0 && lo.nonce != "" && lease.Token(current) == lo.token &&
		current.Annotations[locksv1alpha1.GrantNonceAnnotation] == lo.nonce
}

// placeOn reports whether current's queue still holds lo's place.
func (lo leftover) placeOn(current *coordinationv1.Lease) bool {
	return lo.ticket != "" && lease.Position(current, lo.ticket) >= 0
}

// leftoverOfGrant is what a grant written on l leaves behind if it is not
// released.
func leftoverOfGrant(l *coordinationv1.Lease) leftover {
	return leftover{token: lease.Token(l), nonce: l.Annotations[locksv1alpha1.GrantNonceAnnotation], ticket: l.Annotations[locksv1alpha1.TicketAnnotation]}
}

// clearLeftover ends lo on the lock's Lease: releases its grant if the
// Lease still records it, and withdraws its place. Either write is made
// only while the Lease shows lo (the release is a compare-and-swap of the
// copy judged; a withdrawal removes only lo's ticket), so it never touches
// another client's grant or place. lo is forgotten once nothing of it is
// left.
func (c *Client) clearLeftover(ctx context.Context, info lockInfo, lo leftover) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := c.modifyLease(ctx, info, func(l *coordinationv1.Lease) (*lease.Patch, error) {
		if lo.grantOn(l, c.cfg.Identity) && c.mine(ctx, &place{}, l.Annotations[locksv1alpha1.HolderPrincipalAnnotation]) {
			return c.releasePatch(l, info), nil
		}
		return nil, errNothingToDo
	})
	if err != nil && !errors.Is(err, errNothingToDo) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing this client's earlier grant (token %d) on lock %s: %w", lo.token, c.LockName(), err)
	}
	if lo.ticket != "" {
		if err := c.withdraw(ctx, info, lo.ticket); err != nil {
			return fmt.Errorf("withdrawing this client's earlier place in the queue of lock %s: %w", c.LockName(), err)
		}
	}
	c.forgetLeftover(lo)
	return nil
}

// isRefusal reports whether clearing a leftover failed with the
// apiserver's answer (a 4xx: RBAC, the policies, a bad request), not for a
// moment: then the leftover is not this client's to clear, and is dropped.
func isRefusal(err error) bool { return !mayHaveLanded(err) }
