package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// maxCASAttempts bounds how often one attempt re-reads after its write's
// tests failed (the Lease was no longer the copy it judged) before it
// reports the lock as contended.
const maxCASAttempts = 5

// errContended: a waiting attempt's write found the Lease changed; the
// watch brings the change next.
var errContended = errors.New("lost a compare-and-swap race")

// errCutShort: a waiting caller's ctx ended its read of the Lease.
var errCutShort = errors.New("the caller gave up during the read")

// errReadFailed: a waiting caller's read of the Lease failed in a way that
// passes (see passingReadError); it waits on rather than leave the queue.
var errReadFailed = errors.New("reading the Lease failed for a moment")

// acquired is a grant written (or taken up) by an attempt, not yet handed to
// the caller: it is held until validUntil unless renewed, first after
// firstRenewal.
type acquired struct {
	lease        *coordinationv1.Lease
	info         lockInfo
	validUntil   time.Time
	firstRenewal time.Duration
}

// TryAcquire makes one attempt to take the lock. When another holder has it,
// the error is a *HeldError (errors.Is(err, ErrHeld)) saying who and until
// when; so it is when the lock is free but waiters are queued for it (they
// come first: HeldError.Ahead says how many). When the grant's answer came
// back too late to be used, the error matches ErrAnsweredTooLate (and
// ErrHeld). When another process holds the lock, or waits for it, under this
// client's identity, the error matches ErrIdentityInUse.
//
// Every call reads the DistributedLock: its UID (a lock deleted and created
// again is a new lock) and its recorded fencing token (no grant may carry a
// token at or below it). A client that has read it before sends that read
// alongside its write, and hands the grant out only once both agree.
func (c *Client) TryAcquire(ctx context.Context) (g *Grant, err error) {
	defer c.countAcquire(c.cfg.Clock.Now(), &err)
	info, read, err := c.startLockRead(ctx)
	if err != nil {
		return nil, err
	}
	p := &place{}
	uid := info.uid
	a, _, err := c.attempt(ctx, &info, leaseCopy{lease: c.remembered(info.leaseName)}, p)
	if info.uid != uid {
		read = nil // the attempt read the new lock itself before it wrote
	}
	if err == nil {
		if g, err = c.confirm(ctx, a, read, p); err == nil {
			return g, nil
		}
	}
	c.leaveQueue(info, p) // releases a grant whose answer never came, if it landed
	return nil, read.failed(err)
}

// countAcquire records an acquire that started at start and ended with
// *err.
func (c *Client) countAcquire(start time.Time, err *error) {
	c.cfg.Metrics.acquired(c.cfg.Namespace, c.cfg.Name, c.cfg.Clock.Since(start), *err)
}

// Acquire blocks until this client holds the lock or ctx ends; a ctx with a
// deadline makes it a try-lock with timeout. A caller that has to wait joins
// the lock's queue of waiters (first come, first served, within
// Config.Priority): the holder's Release hands the lock to the head of the
// queue in the same write, and when the lock falls free otherwise (released
// with nobody queued, broken, or a grant the controller marked lapsed) only
// the head tries at once (see lease.Turn). Waiting is event-driven: one
// watch of the Lease wakes it (on every change for the first
// lease.FrontLength waiters; only on moving up to them for a waiter further
// back, see leaseWatch), and a timer at the next deadline (observed expiry,
// or this waiter's turn; a waiter behind the front reads the Lease afresh
// then, at least once per lease duration or maxRecheck). A caller that gives
// up leaves the queue; a read that fails for a moment (a timeout, a 5xx)
// does not make it give up. A caller whose ctx ends after it has waited,
// even in the middle of a read or write, gets an error matching why it
// waited (ErrHeld, or ErrLeaseUnavailable; a read that failed for a moment
// if that is all it ever saw) and ctx's error. Another process holding or
// waiting for the lock under this client's identity ends it with
// ErrIdentityInUse. Like TryAcquire it reads the DistributedLock.
func (c *Client) Acquire(ctx context.Context) (_ *Grant, err error) {
	defer c.countAcquire(c.cfg.Clock.Now(), &err)
	info, read, err := c.startLockRead(ctx)
	if err != nil {
		return nil, err
	}
	p := &place{ticket: newTicket(), waiting: true}
	w := &leaseWatch{client: c, name: info.leaseName, ticket: p.ticket}
	defer w.stop()
	next := leaseCopy{lease: c.remembered(info.leaseName)}
	// waitedOn is why the caller last waited: what it reports if it gives
	// up while an attempt is on its way.
	var waitedOn error
	for {
		uid := info.uid
		a, hint, err := c.attempt(ctx, &info, next, p)
		if info.uid != uid {
			read = nil // the attempt read the new lock itself before it wrote
		}
		if err == nil {
			g, cerr := c.confirm(ctx, a, read, p)
			if cerr == nil {
				return g, nil
			}
			// Withheld: the next grant is judged on the lock as read now.
			err, read = cerr, nil
			if fresh, rerr := c.resolve(ctx, false); rerr == nil {
				info = fresh
			}
		}
		if err = read.failed(err); !waitable(err) {
			c.leaveQueue(info, p)
			return nil, gaveUpOrFailed(c.LockName(), waitedOn, ctx.Err(), err)
		}
		if waitedOn == nil || !errors.Is(err, errReadFailed) {
			// A read that failed for a moment does not hide why the
			// caller was waiting.
			waitedOn = err
		}
		var werr error
		if next, werr = w.next(ctx, hint); werr != nil {
			c.leaveQueue(info, p)
			return nil, gaveUpWaiting(c.LockName(), waitedOn, werr, nil)
		}
	}
}

// gaveUpOrFailed is the error of an Acquire whose attempt failed with err:
// err itself, unless the caller's ctx cut short a read after it had waited,
// which is giving up waiting.
func gaveUpOrFailed(lock string, waitedOn, ctxErr, err error) error {
	if waitedOn != nil && errors.Is(err, errCutShort) {
		return gaveUpWaiting(lock, waitedOn, ctxErr, err)
	}
	return err
}

// waitable reports whether an attempt's error is one an Acquire waits out:
// the lock is held or queued for, its Lease is not ready yet, a race was
// lost, or a read failed for a moment.
func waitable(err error) bool {
	return errors.Is(err, ErrHeld) || errors.Is(err, ErrLeaseUnavailable) || errors.Is(err, errContended) || errors.Is(err, errReadFailed)
}

// gaveUpWaiting is the error of an Acquire that stopped waiting on lock
// because its ctx ended (ctxErr): it matches waitedOn (why it waited;
// ErrHeld for a lost race) and ctxErr, and names the read it cut short
// (cut, when not nil).
func gaveUpWaiting(lock string, waitedOn, ctxErr, cut error) error {
	if errors.Is(waitedOn, errContended) {
		waitedOn = fmt.Errorf("%w: lock %s is contended", ErrHeld, lock)
	}
	if cut != nil {
		return fmt.Errorf("%w (gave up waiting: %w; it cut short: %w)", waitedOn, ctxErr, cut)
	}
	return fmt.Errorf("%w (gave up waiting: %w)", waitedOn, ctxErr)
}

// lockRead is a read of the DistributedLock that may still be on its way.
type lockRead struct {
	done chan struct{}
	info lockInfo
	err  error
}

// startLockRead starts the read of the DistributedLock that every acquire
// makes (its UID and its recorded token: the floor no grant may go below).
// A client that has read the lock before acts on what it read then, with
// the read of now on its way beside it: the grant is handed to the caller
// only once that read agrees (confirm). A client that never read it reads
// it first (read is nil: nothing to confirm).
func (c *Client) startLockRead(ctx context.Context) (lockInfo, *lockRead, error) {
	c.mu.Lock()
	cached := c.info
	c.mu.Unlock()
	if cached == nil {
		// The first read of the lock also learns, alongside, the
		// principal this client's grants and places carry.
		principal := make(chan error, 1)
		go func() {
			_, err := c.selfPrincipal(ctx)
			principal <- err
		}()
		info, err := c.resolve(ctx, true)
		if perr := <-principal; err == nil && perr != nil {
			err = perr
		}
		return info, nil, err
	}
	r := &lockRead{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.info, r.err = c.resolve(ctx, true)
	}()
	return *cached, r, nil
}

// failed is why an acquire whose attempt failed with err failed: the lock
// read beside it, when that read found the lock gone (an attempt on a
// remembered Lease only learns that the Lease is no longer the lock's),
// else err. It waits for the read; a nil read (the lock was read first)
// changes nothing.
func (r *lockRead) failed(err error) error {
	if r == nil || err == nil {
		return err
	}
	<-r.done
	if errors.Is(r.err, ErrLockNotFound) {
		return r.err
	}
	return err
}

// attempt is one try, in the steps of client-go's tryAcquireOrRenew. It
// returns the grant written or taken up, or what to wait for and why.
func (c *Client) attempt(ctx context.Context, infoRef *lockInfo, seen leaseCopy, p *place) (*acquired, waitHint, error) {
	// A grant is written exactly (the whole object, as judged) until a
	// write of this caller lost a race; then with a patch that tests the
	// token and holder only (see writeLease).
	exact := !p.raced
	for range maxCASAttempts {
		// 1. A copy of the Lease to judge: the one passed in, or a fresh read.
		//    A remembered copy is only a fast path to a free Lease.
		var err error
		if seen, err = c.copyToJudge(ctx, *infoRef, seen, p); err != nil {
			return nil, waitHint{deadline: c.cfg.Clock.Now().Add(infoRef.duration)}, err
		}
		current := seen.lease
		hint := waitHint{resourceVersion: current.ResourceVersion, deadline: c.cfg.Clock.Now().Add(infoRef.duration), judged: seen}

		// 2. Only the lock's own Lease, in service and not wound back below
		//    a token already granted, is granted on.
		if retry, err := c.checkGrantable(ctx, infoRef, &seen); retry {
			continue
		} else if err != nil {
			return nil, hint, err
		}
		info := *infoRef

		// 3. Observe the record on this client's monotonic clock.
		start := c.cfg.Clock.Now()
		obs := c.observer.Observe(info.leaseName, lease.RecordOf(current), start)

		// 4. A grant or place this client left behind (its release or
		//    withdrawal failed) is cleared first, then judged afresh;
		//    another live client under this identity holds or waits: refuse.
		if cleared, err := c.clearLeftoverOn(ctx, info, current); err != nil {
			return nil, hint, err
		} else if cleared {
			seen = leaseCopy{}
			continue
		}
		if err := c.identityInUse(ctx, current, p); err != nil {
			return nil, waitHint{}, err
		}

		// 5. A release handed the lock to this caller's ticket: take it up.
		if handedToMe(current, c.cfg.Identity, p) {
			a, err := c.claimHandOff(ctx, info, current, p, start)
			if err != nil && lostRace(err) {
				seen = leaseCopy{}
				continue
			}
			return a, hint, claimError(ctx, err)
		}

		// 6. Held (a live grant: only the controller's lapse mark ends one),
		//    or free but queued for by waiters ahead: wait, registering in
		//    the queue first.
		position, queueLength := lease.Place(current, p.ticket)
		if held, turnAt := c.heldOrQueued(obs, info, position, queueLength, start); held != nil {
			hint.deadline = turnAt
			return nil, c.waitTurn(ctx, info, current, p, position, hint), held
		}

		// 7. Take it: one patch that tests the token and holder judged.
		a, late, err := c.take(ctx, info, current, p, start, exact)
		switch {
		case !lostRace(err):
			return a, takeHint(hint, late, err), err
		case p.waiting && seen.verified:
			// Others are taking the lock at the same moment: a crowd. The
			// registration that follows is spread out (see register).
			p.raceLost(c.cfg.Clock.Now(), info.duration)
			return nil, hint, errContended
		}
		exact, seen = false, leaseCopy{} // lost a race: judge afresh
	}
	return nil, waitHint{deadline: c.cfg.Clock.Now().Add(infoRef.duration)},
		fmt.Errorf("%w: lost %d compare-and-swap races in a row on lease %s/%s", ErrHeld, maxCASAttempts, c.cfg.Namespace, infoRef.leaseName)
}

// copyToJudge is the copy of the Lease an attempt judges: seen, unless it is
// a remembered copy that shows a holder or a deletion (then, or when there
// is none, a fresh read).
func (c *Client) copyToJudge(ctx context.Context, info lockInfo, seen leaseCopy, p *place) (leaseCopy, error) {
	if seen.lease != nil && !seen.verified && (seen.lease.DeletionTimestamp != nil || lease.Holder(seen.lease) != "") {
		seen = leaseCopy{}
	}
	if seen.lease != nil {
		return seen, nil
	}
	l, err := c.readLease(ctx, info.leaseName)
	if err != nil {
		switch {
		case p.waiting && ctx.Err() != nil:
			err = fmt.Errorf("%w: %w", errCutShort, err)
		case p.waiting && passingReadError(ctx, err):
			// A waiter keeps its place and waits on (its watch, or
			// another read).
			c.logger(ctx).Info("reading the lock's Lease failed; waiting on", "lock", c.LockName(), "err", err)
			err = fmt.Errorf("%w: %w", errReadFailed, err)
		}
		return leaseCopy{}, err
	}
	return leaseCopy{lease: l, verified: true}, nil
}

// checkGrantable checks the copy in *seen (see grantable). retry: the copy
// was only remembered, or the lock was deleted and created again (then
// *infoRef is the new lock's): judge again from a fresh read.
func (c *Client) checkGrantable(ctx context.Context, infoRef *lockInfo, seen *leaseCopy) (retry bool, err error) {
	err = c.grantable(seen.lease, *infoRef)
	switch {
	case err == nil:
		return false, nil
	case !seen.verified:
		*seen = leaseCopy{} // a remembered copy may be stale: read afresh
		return true, nil
	}
	if fresh, recreated := c.lockRecreated(ctx, seen.lease, *infoRef); recreated {
		*infoRef = fresh
		return true, nil
	}
	return false, err
}

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

// clearLeftoverOn clears a grant or place this client left behind on
// current (its release or withdrawal failed); cleared: a leftover was found
// (cleared, or forgotten as not this client's), so judge afresh. A clear that failed for a moment is a read
// that failed (the caller waits on); one refused was not this client's to
// clear, and is forgotten.
func (c *Client) clearLeftoverOn(ctx context.Context, info lockInfo, current *coordinationv1.Lease) (cleared bool, err error) {
	lo, ok := c.leftOn(current)
	if !ok {
		return false, nil
	}
	if err := c.clearLeftover(ctx, info, lo); err != nil && !isRefusal(err) {
		return false, fmt.Errorf("%w: %w", errReadFailed, err)
	} else if err != nil {
		c.forgetLeftover(lo)
	}
	return true, nil
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

// claimHandOff takes up a grant that a release handed to the caller. The
// caller did not write it, so it trusts no window it did not start: the
// hand-off was written after the caller's registration or its last read at
// the front of the queue (handOffWrittenAfter), so nobody else can see the
// handed-off grant lapse before that moment plus the lease duration the
// hand-off wrote (everyone's expiry clock starts at or after the hand-off's
// write). If that moment is at most a renew interval ago, the grant is used
// at once, as if this client had written it then: it is held until that
// moment plus the safe window, and first renewed when a grant written then
// would be (a renew interval after it), so that its ValidUntil is never
// nearer than a grant of its own would have it. Otherwise (the wait was
// long, or the front's reads failed) the caller renews first and counts
// from that write, like any grant.
func (c *Client) claimHandOff(ctx context.Context, info lockInfo, current *coordinationv1.Lease, p *place, now time.Time) (*acquired, error) {
	handed := info.grantedOn(current)
	interval := c.renewInterval(handed)
	if from := p.handOffWrittenAfter(current); !from.IsZero() && now.Sub(from) <= interval {
		c.logger(ctx).V(1).Info("taking up the lock handed to this client", "lock", c.LockName(), "token", lease.Token(current))
		return &acquired{lease: current, info: handed, validUntil: c.safeUntil(handed, from),
			firstRenewal: max(interval-now.Sub(from), 0)}, nil
	}
	updated, err := c.writeLease(ctx, current, lease.RenewPatch(current, now), false)
	if err != nil {
		return nil, err
	}
	if _, late := c.answeredTooLate(handed, updated, now); late != nil {
		return nil, late // the next attempt finds the hand-off still its own and renews again
	}
	c.observer.Observe(info.leaseName, lease.RecordOf(updated), now)
	return &acquired{lease: updated, info: handed, validUntil: c.safeUntil(handed, now), firstRenewal: interval}, nil
}

// claimError is what an attempt reports when taking up a hand-off failed
// with err (nil: nothing).
func claimError(ctx context.Context, err error) error {
	switch {
	case err == nil, errors.Is(err, ErrHeld):
		return err
	case ctx.Err() != nil:
		// Gave up while renewing the handed-off grant: leaving
		// (leaveQueue) hands it on.
		return fmt.Errorf("%w: taking up the lock handed to this client: %w", ErrHeld, err)
	default:
		return fmt.Errorf("taking up the lock handed to this client: %w", err)
	}
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

// take grants the lock to this client on current, free (or lapsed, as the
// controller marked it): the next token, in one write (exact, or a patch
// that tests the token and holder it was judged on: see writeLease),
// leaving the caller's place in the queue in the same write. A write whose
// answer came back past its safe window is not used (ErrAnsweredTooLate,
// with what to wait for).
func (c *Client) take(ctx context.Context, info lockInfo, current *coordinationv1.Lease, p *place, start time.Time,
	exact bool) (*acquired, waitHint, error) {
	principal, err := c.selfPrincipal(ctx)
	if err != nil {
		return nil, waitHint{}, fmt.Errorf("acquiring lock %s: %w", c.LockName(), err)
	}
	nonce := newTicket()
	patch, err := lease.GrantPatch(current, c.cfg.Identity, principal, placeTicket(current, p), nonce, info.duration, start)
	if err != nil {
		return nil, waitHint{}, fmt.Errorf("acquiring lock %s: %w", c.LockName(), err)
	}
	updated, err := c.writeLease(ctx, current, patch, exact)
	if err != nil {
		return nil, waitHint{}, c.grantFailed(ctx, info, current, p, nonce, err)
	}
	granted := info.grantedOn(updated)
	if late, err := c.answeredTooLate(granted, updated, start); err != nil {
		// Not this caller's to use; released if it gives up (leaveQueue).
		p.uncertain, p.uncertainNonce = lease.Token(updated), nonce
		return nil, late, err
	}
	c.observer.Observe(info.leaseName, lease.RecordOf(updated), start)
	return &acquired{lease: updated, info: granted, validUntil: c.safeUntil(granted, start), firstRenewal: c.renewInterval(granted)}, waitHint{}, nil
}

// grantFailed is the error of a grant patch that failed with err. A grant
// that may have landed (no answer, a timeout, a 5xx) is remembered as
// uncertain: leaving (leaveQueue) releases it if it did, and only if it
// carries this attempt's nonce.
func (c *Client) grantFailed(ctx context.Context, info lockInfo, current *coordinationv1.Lease, p *place, nonce string, err error) error {
	if !lostRace(err) && (ctx.Err() != nil || mayHaveLanded(err)) {
		c.remember(nil)
		p.uncertain, p.uncertainNonce = lease.Token(current)+1, nonce
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: acquiring lease %s/%s: no answer before the caller gave up: %w",
			ErrHeld, c.cfg.Namespace, info.leaseName, err)
	}
	return fmt.Errorf("acquiring lease %s/%s: %w", c.cfg.Namespace, info.leaseName, refusal(err))
}

// placeTicket is the caller's ticket if current shows its place in the
// queue, else "".
func placeTicket(current *coordinationv1.Lease, p *place) string {
	if p.ticket != "" && lease.Position(current, p.ticket) >= 0 {
		return p.ticket
	}
	return ""
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

// takeHint is what an attempt whose take ended with err waits for: nothing
// after a grant, late after an answer that came too late, else hint.
func takeHint(hint, late waitHint, err error) waitHint {
	switch {
	case err == nil:
		return waitHint{}
	case errors.Is(err, ErrAnsweredTooLate):
		return late
	default:
		return hint
	}
}

// confirm hands the grant a to the caller once the read of the lock that
// went beside it (read; nil when the lock was read first) agrees: the same
// lock (UID) and Lease, and a token above the one the lock recorded (or
// that very grant recorded). Otherwise the grant is withheld: nobody acts
// on it, it is released, and the error says why (ErrLeaseUnavailable: the
// lock changed, or the Lease was wound back below a token already granted;
// or the read's own error).
func (c *Client) confirm(ctx context.Context, a *acquired, read *lockRead, p *place) (*Grant, error) {
	if read != nil {
		<-read.done
		fresh := read.info
		token := lease.Token(a.lease)
		switch {
		case read.err != nil:
			c.withhold(a, p)
			return nil, read.err
		case fresh.uid != a.info.uid || fresh.leaseName != a.info.leaseName:
			c.withhold(a, p)
			return nil, fmt.Errorf("%w: lock %s was deleted and created again while it was being acquired; its grant was not used",
				ErrLeaseUnavailable, c.LockName())
		case token < fresh.recorded || token == fresh.recorded && !fresh.records(a.lease):
			c.withhold(a, p)
			return nil, fmt.Errorf("%w: Lease %s/%s granted fencing token %d, but lock %s has recorded %d: the Lease was wound back; "+
				"its grant was not used, and no token is granted on it until the frontdesk controller restores it",
				ErrLeaseUnavailable, c.cfg.Namespace, a.info.leaseName, token, c.LockName(), fresh.recorded)
		}
	}
	return newGrant(c, c.logger(ctx), a), nil
}

// withhold releases a grant that was written but not handed to the caller
// (best effort, bounded): it carries a token that may have been handed out
// before, or belongs to a lock that is no more. The caller's place
// remembers it as its own grant not taken (p.uncertain), so that a copy of
// the Lease still showing it is not taken for another client's.
func (c *Client) withhold(a *acquired, p *place) {
	p.uncertain, p.uncertainNonce = lease.Token(a.lease), a.lease.Annotations[locksv1alpha1.GrantNonceAnnotation]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.writeLease(ctx, a.lease, lease.ReleasePatch(a.lease), false); err != nil {
		c.logger(ctx).Info("releasing a grant that was not used", "lock", c.LockName(), "err", err)
	}
}
