package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

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
		c.learnPrincipal(ctx, current, p)
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

// take grants the lock to this client on current, free (or lapsed, as the
// controller marked it): the next token, in one write (exact, or a patch
// that tests the token and holder it was judged on: see writeLease),
// leaving the caller's place in the queue in the same write. A write whose
// answer came back past its safe window is not used (ErrAnsweredTooLate,
// with what to wait for).
func (c *Client) take(ctx context.Context, info lockInfo, current *coordinationv1.Lease, p *place, start time.Time,
	exact bool) (*acquired, waitHint, error) {
	nonce := newTicket()
	patch, err := lease.GrantPatch(current, c.cfg.Identity, placeTicket(current, p), nonce, info.duration, start)
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
