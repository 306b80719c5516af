package lock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// maxCASAttempts bounds how often one attempt re-reads after losing a
// compare-and-swap race before it reports the lock as contended.
const maxCASAttempts = 5

// maxWriteAttempts bounds the compare-and-swap retries of a write that
// should land whatever the contention: a renewal (also bounded by its safe
// window), a release, leaving the queue, an admin edit. Waiters registering
// in the queue write the same Lease, and a crowd arriving at once wins race
// after race: a release lost 25 in a row to 200 waiters registering
// together (make bench, 2026-12-03). Each lost race is another writer's
// progress, and the queue holds at most lease.MaxQueue waiters, so the
// bound outlasts a crowd of that size arriving at once (not an endless
// stream of writers); a caller's ctx ends it sooner.
const maxWriteAttempts = lease.MaxQueue + 25

// errContended: a waiting attempt lost a compare-and-swap race; the watch
// brings the winner's write next.
var errContended = errors.New("lost a compare-and-swap race")

// errCutShort: a waiting caller's ctx ended its read of the Lease.
var errCutShort = errors.New("the caller gave up during the read")

// errReadFailed: a waiting caller's read of the Lease failed in a way that
// passes (see passingReadError); it waits on rather than leave the queue.
var errReadFailed = errors.New("reading the Lease failed for a moment")

// passingReadError reports whether a failed read is one that passes by
// itself: the apiserver timed out, was overloaded (429, 5xx) or the
// connection broke or timed out; never when the caller's ctx has ended, and
// never an error that retrying cannot mend (a refusal, bad credentials).
func passingReadError(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		utilnet.IsTimeout(err) || utilnet.IsProbableEOF(err) || utilnet.IsConnectionReset(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsHTTP2ConnectionLost(err)
}

// candidate is a copy of the Lease to judge, and where it came from.
type candidate struct {
	lease *coordinationv1.Lease
	// fromWatch: the copy arrived in an event of a watch of every change,
	// so its record has most likely just changed, and the controller is not
	// asked whether it saw it lapse (asking is only a shortcut).
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
	// behindFront: the caller waits in the queue behind its first
	// lease.FrontLength waiters, so it needs to hear of the Lease only when
	// it moves up to the front (see leaseWatch), and reads it afresh at the
	// deadline, which is at most maxRecheck away (waitBehindFront).
	behindFront bool
	// backingOff: the caller lost a registration race; it neither
	// watches nor judges until the deadline, then reads afresh.
	backingOff bool
}

// maxRecheck bounds how long a waiter behind the front of the queue goes
// without reading the Lease: at most a lease duration, and at most this.
const maxRecheck = 30 * time.Second

// waitBehindFront makes h the hint of a caller behind the front of the
// queue. Its watch hears of nothing else, so it also reads the Lease at
// least once per lease duration (or maxRecheck, if shorter), at a random
// moment in the last quarter of that, so that waiters who registered
// together do not read together: what a scoped watch does not bring (the
// Lease deleted and created again, a queue written by a client that does
// not label its front) costs it at most that long.
func (h *waitHint) waitBehindFront(now time.Time, duration time.Duration) {
	h.behindFront = true
	recheck := min(duration, maxRecheck)
	recheck -= time.Duration(rand.Int64N(int64(recheck/4) + 1))
	if at := now.Add(recheck); at.Before(h.deadline) {
		h.deadline = at
	}
}

// TryAcquire makes one attempt to take the lock. When another holder has it,
// the error is a *HeldError (errors.Is(err, ErrHeld)) saying who and until
// when; so it is when the lock is free but waiters are queued for it (they
// come first: HeldError.Ahead says how many). When the grant's answer came
// back too late to be used, the error matches ErrAnsweredTooLate (and
// ErrHeld).
//
// Every call reads the DistributedLock first: its UID (a lock deleted and
// created again is a new lock) and its recorded fencing token (no grant may
// carry a token at or below it).
func (c *Client) TryAcquire(ctx context.Context) (g *Grant, err error) {
	defer c.countAcquire(c.cfg.Clock.Now(), &err)
	info, _, err := c.resolve(ctx, true)
	if err != nil {
		return nil, err
	}
	p := &place{}
	g, _, err = c.attempt(ctx, &info, candidate{lease: c.remembered(info.leaseName)}, p)
	if err != nil {
		c.leaveQueue(info, p) // releases a grant whose answer never came, if it landed
	}
	return g, err
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
// queue in the same write, and when the lock falls free otherwise only the
// head tries at once (see lease.Turn). Waiting is event-driven: one watch of
// the Lease wakes it (on every change for the first lease.FrontLength
// waiters; only on moving up to them for a waiter further back, see
// leaseWatch), and a timer at the next deadline (observed expiry, or this
// waiter's turn; a waiter behind the front reads the Lease afresh then, at
// least once per lease duration or maxRecheck). A caller that gives up
// leaves the queue; a read that fails for a moment (a timeout, a 5xx) does
// not make it give up. A caller whose ctx ends after it has waited, even in
// the middle of a read or write, gets an error matching why it waited
// (ErrHeld, or ErrLeaseUnavailable; a read that failed for a moment if that
// is all it ever saw) and ctx's error.
// Like TryAcquire it starts from a fresh read of the DistributedLock.
func (c *Client) Acquire(ctx context.Context) (_ *Grant, err error) {
	defer c.countAcquire(c.cfg.Clock.Now(), &err)
	info, _, err := c.resolve(ctx, true)
	if err != nil {
		return nil, err
	}
	p := &place{ticket: newTicket(), waiting: true}
	w := &leaseWatch{client: c, name: info.leaseName, ticket: p.ticket}
	defer w.stop()
	next := candidate{lease: c.remembered(info.leaseName)}
	// waitedOn is why the caller last waited: what it reports if it gives
	// up while an attempt is on its way.
	var waitedOn error
	for {
		g, hint, err := c.attempt(ctx, &info, next, p)
		if err == nil {
			return g, nil
		}
		if !waitable(err) {
			c.leaveQueue(info, p)
			if waitedOn != nil && errors.Is(err, errCutShort) {
				// The caller's ctx ended a read of an attempt after it
				// had waited: it gave up waiting, as it would have
				// between attempts.
				return nil, gaveUpWaiting(c.LockName(), waitedOn, ctx.Err(), err)
			}
			return nil, err
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

// place is a caller's place in the lock's queue of waiters.
type place struct {
	// ticket names this Acquire call's entry; "" for a caller that does
	// not queue (TryAcquire).
	ticket string
	// waiting: the caller waits, so it registers when it cannot have the
	// lock at once.
	waiting bool
	// registeredAt is when the first write that put the ticket in the
	// queue was sent (zero if none was). Any hand-off naming this ticket
	// came after some registration of it, so after registeredAt: no other
	// client can see the handed-off grant lapse before registeredAt plus
	// the lease duration the hand-off wrote. It never moves forward, even
	// if the caller registers again.
	registeredAt time.Time
	// readAt and read: a read of the Lease sent at readAt answered with
	// read, which did not hand the lock to this caller. A hand-off of a
	// later resourceVersion was written after readAt, so the head of the
	// queue, whose registration may be older than a lease duration, reads
	// the Lease while it waits (refreshHandOffWindow) to take a hand-off up
	// without renewing it first.
	readAt time.Time
	read   *coordinationv1.Lease
	// readTried is when the last such read was answered or failed; the
	// next read counts from then.
	readTried time.Time
	// registerConflicts counts the registration races lost in a row.
	registerConflicts int
	// sentRegistration: a registration was sent (it may have landed even
	// if its answer never came), so a caller that gives up leaves the queue.
	sentRegistration bool
	// uncertain is the token of a grant whose answer never came (the
	// caller gave up meanwhile, or the request failed), and uncertainNonce
	// the nonce it was written with; a caller that gives up releases it if
	// it landed, and only then.
	uncertain      int64
	uncertainNonce string
}

// attempt is one try, in the steps of client-go's tryAcquireOrRenew:
//  1. Start from the candidate copy of the Lease, or a fresh read. A
//     remembered copy is only a fast path to a free Lease: one that shows a
//     holder, or is being deleted, is re-read first.
//  2. A Lease the lock does not control (not adopted yet, or owned by
//     something else), or one being deleted, cannot be granted: wait for the
//     controller. A Lease controlled by a lock of this name with another UID
//     means the lock was deleted and created again: read it afresh and go on
//     with the new one. A Lease whose token is below the lock's recorded
//     token (wound back by hand) cannot be granted either: its next token may
//     have been handed out before.
//  3. Observe the Lease record on this client's monotonic clock.
//  4. A release that handed the lock to this caller's ticket: take the
//     grant up (claimHandOff).
//  5. If a holder (this identity included: another process may use it) has
//     it and neither this client nor the controller has observed it go
//     unrenewed for the lease duration, or it is free but not yet this
//     caller's turn in the queue: ErrHeld; a waiting caller registers in
//     the queue (one compare-and-swap) and waits. A registration that
//     loses its race to another write backs off unwatched, then reads
//     afresh (registerBackoff).
//  6. Compare-and-swap: take it with leaseTransitions+1 as the token (or
//     fail with ErrTokensExhausted at the end of the int32 range), leaving
//     the queue together with the waiters ahead, whose turn has passed.
//  7. On a conflict the copy was stale: a waiting caller waits for the
//     watch to bring the newer version; otherwise re-read and go to 2.
func (c *Client) attempt(ctx context.Context, infoRef *lockInfo, cand candidate, p *place) (*Grant, waitHint, error) {
	info := *infoRef
	for range maxCASAttempts {
		if cand.lease != nil && !cand.verified && (cand.lease.DeletionTimestamp != nil || lease.Holder(cand.lease) != "") {
			cand = candidate{}
		}
		if cand.lease == nil {
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
				return nil, waitHint{deadline: c.cfg.Clock.Now().Add(info.duration)}, err
			}
			cand = candidate{lease: l, verified: true}
		}
		current := cand.lease
		hint := waitHint{resourceVersion: current.ResourceVersion, deadline: c.cfg.Clock.Now().Add(info.duration), judged: cand}
		if err := c.grantable(current, info); err != nil {
			if !cand.verified {
				cand = candidate{} // a remembered copy may be stale: read afresh
				continue
			}
			if fresh, recreated := c.lockRecreated(ctx, current, info); recreated {
				info, *infoRef = fresh, fresh
				cand = candidate{lease: current, verified: cand.verified, fromWatch: cand.fromWatch}
				continue
			}
			return nil, hint, err
		}

		start := c.cfg.Clock.Now()
		obs := c.observer.Observe(info.leaseName, lease.RecordOf(current), start)
		if handedToMe(current, c.cfg.Identity, p) {
			g, err := c.claimHandOff(ctx, info, current, p, start)
			switch {
			case err == nil:
				return g, waitHint{}, nil
			case apierrors.IsConflict(err):
				cand = candidate{}
				continue
			case errors.Is(err, ErrHeld):
				return nil, hint, err
			case ctx.Err() != nil:
				// Gave up while renewing the handed-off grant: leaving
				// (leaveQueue) hands it on.
				return nil, hint, fmt.Errorf("%w: taking up the lock handed to this client: %w", ErrHeld, err)
			default:
				return nil, waitHint{}, fmt.Errorf("taking up the lock handed to this client: %w", err)
			}
		}
		position, queueLength := lease.Place(current, p.ticket)
		if position >= 0 {
			p.registerConflicts = 0
		}
		if held, turnAt := c.heldOrQueued(ctx, obs, info, position, queueLength, start, cand.fromWatch); held != nil {
			hint.deadline = turnAt
			if p.waiting && position < 0 {
				registered, at, err := c.register(ctx, current, p)
				switch {
				case err == nil:
					hint.resourceVersion, hint.judged = registered.ResourceVersion, candidate{lease: registered, verified: true}
					position = at
					p.registerConflicts = 0
				case apierrors.IsConflict(err) && !cand.verified:
					cand = candidate{} // a remembered copy was stale: read afresh
					continue
				case apierrors.IsConflict(err):
					// Another write won (most often another waiter
					// registering): back off, then read afresh, so that a
					// crowd registering at once leaves room for the
					// holder's renewals and release (registerBackoff).
					p.registerConflicts++
					backoff := registerBackoff(p.registerConflicts, info.duration)
					return nil, waitHint{deadline: c.cfg.Clock.Now().Add(backoff), backingOff: true}, held
				default:
					// Queue full, or the registration failed: wait
					// unregistered (behind everyone registered) and try
					// again at the next change.
				}
			}
			if p.waiting && position == 0 {
				if next := c.refreshHandOffWindow(ctx, info, p); next.Before(hint.deadline) {
					hint.deadline = next
				}
			}
			if p.waiting && position >= lease.FrontLength {
				hint.waitBehindFront(c.cfg.Clock.Now(), info.duration)
			}
			return nil, hint, held
		}

		granted, err := c.grantedLease(current, info, p, position, start)
		if err != nil {
			return nil, waitHint{}, err
		}
		nonce := newTicket()
		if granted.Annotations == nil {
			granted.Annotations = map[string]string{}
		}
		granted.Annotations[lease.GrantNonceAnnotation] = nonce
		updated, err := c.leases.Update(ctx, granted, metav1.UpdateOptions{})
		switch {
		case err == nil:
			c.remember(updated)
			if hint, late := c.answeredTooLate(info, updated, start); late != nil {
				return nil, hint, late
			}
			c.observer.Observe(info.leaseName, lease.RecordOf(updated), start)
			return newGrant(c, c.logger(ctx), info, updated, c.safeUntil(info, start), c.renewInterval(info)), waitHint{}, nil
		case apierrors.IsConflict(err) && p.waiting && cand.verified:
			return nil, hint, errContended
		case apierrors.IsConflict(err):
			cand = candidate{}
		case ctx.Err() != nil:
			// The caller gave up while the grant was on its way: it may
			// have landed. Leaving (leaveQueue) releases it if it did.
			c.remember(nil)
			p.uncertain, p.uncertainNonce = lease.Token(granted), nonce
			return nil, hint, fmt.Errorf("%w: acquiring lease %s/%s: no answer before the caller gave up: %w",
				ErrHeld, c.cfg.Namespace, info.leaseName, err)
		default:
			// A request that failed may still have landed (a timeout, a
			// 5xx, a broken connection): leaving releases it if it did.
			c.remember(nil)
			if mayHaveLanded(err) {
				p.uncertain, p.uncertainNonce = lease.Token(granted), nonce
			}
			return nil, waitHint{}, fmt.Errorf("acquiring lease %s/%s: %w", c.cfg.Namespace, info.leaseName, err)
		}
	}
	return nil, waitHint{deadline: c.cfg.Clock.Now().Add(info.duration)},
		fmt.Errorf("%w: lost %d compare-and-swap races in a row on lease %s/%s", ErrHeld, maxCASAttempts, c.cfg.Namespace, info.leaseName)
}

// grantedLease is current granted to this client with the next token,
// without the caller's queue entry and the entries ahead of it (their turn
// has passed); a caller outside the queue comes after all of them.
func (c *Client) grantedLease(current *coordinationv1.Lease, info lockInfo, p *place, position int, start time.Time) (*coordinationv1.Lease, error) {
	granted, err := lease.Grant(current, c.cfg.Identity, info.duration, start)
	if err != nil {
		return nil, fmt.Errorf("acquiring lock %s: %w", c.LockName(), err)
	}
	if position >= 0 {
		return lease.DequeueThrough(granted, p.ticket)
	}
	var passed []string
	for _, w := range lease.Queue(current) {
		passed = append(passed, w.Ticket)
	}
	return lease.Dequeue(granted, passed...)
}

// heldOrQueued reports whether the caller cannot take the lock now: a
// holder's grant is still live as observed (see heldByOther), or the lock
// is free but waiters ahead of the caller in the queue still have their
// turn. position is the caller's place in the queue (-1 if it is not
// queued: it then comes after all queueLength waiters). turnAt is when to
// look again with no change in between.
func (c *Client) heldOrQueued(ctx context.Context, obs lease.Observation, info lockInfo, position, queueLength int,
	now time.Time, fromWatch bool) (*HeldError, time.Time) {
	if position < 0 {
		position = queueLength
	}
	turn := lease.Turn(position, info.duration)
	// The controller's view can only let a caller whose turn is now try
	// (a lapse it saw counts from now), so only such a caller asks.
	held, freeSince := c.heldByOther(ctx, obs, info, now, !fromWatch && turn == 0)
	if held != nil {
		held.Ahead = position
		return held, held.FreeAt.Add(turn)
	}
	if turnAt := freeSince.Add(turn); now.Before(turnAt) {
		return &HeldError{Lock: c.LockName(), Ahead: position, Token: int64(obs.Record.Transitions), FreeAt: turnAt}, turnAt
	}
	return nil, time.Time{}
}

// register puts the caller in the lock's queue with one compare-and-swap
// on current, and returns the Lease written and the caller's position in
// its queue.
func (c *Client) register(ctx context.Context, current *coordinationv1.Lease, p *place) (_ *coordinationv1.Lease, position int, _ error) {
	queued, err := lease.Enqueue(current, lease.Waiter{Identity: c.cfg.Identity, Ticket: p.ticket, Priority: c.cfg.Priority})
	if err != nil {
		return nil, -1, err
	}
	if !p.sentRegistration {
		p.registeredAt = c.cfg.Clock.Now()
	}
	p.sentRegistration = true
	updated, err := c.leases.Update(ctx, queued, metav1.UpdateOptions{})
	if err != nil {
		return nil, -1, err
	}
	c.remember(updated)
	c.cfg.Metrics.queued(c.cfg.Namespace, c.cfg.Name)
	position = lease.Position(updated, p.ticket)
	c.logger(ctx).V(1).Info("waiting in the lock's queue", "lock", c.LockName(), "position", position)
	return updated, position, nil
}

// handedToMe reports whether current is a release that handed the lock to
// the caller's ticket.
func handedToMe(current *coordinationv1.Lease, identity string, p *place) bool {
	return p.ticket != "" && lease.Holder(current) == identity && current.Annotations[lease.TicketAnnotation] == p.ticket
}

// claimHandOff takes up a grant that a release handed to the caller. The
// caller did not write it, so it trusts no window it did not start: the
// hand-off was written after the caller's registration or its last read at
// the head of the queue (handOffWrittenAfter), so nobody else can see the
// handed-off grant lapse before that moment plus the lease duration
// (everyone's expiry clock starts at or after the hand-off's write). If that
// window, minus the safety margin, still has at least half a renew interval
// left, the grant is usable at once and its first renewal comes within the
// window; otherwise (the wait was long) the caller renews first and counts
// from that write, like any grant.
func (c *Client) claimHandOff(ctx context.Context, info lockInfo, current *coordinationv1.Lease, p *place, now time.Time) (*Grant, error) {
	interval := c.renewInterval(info)
	if from := p.handOffWrittenAfter(current); !from.IsZero() {
		// The others judge the handed-off grant by the duration the
		// releaser wrote, which may be shorter than this client's (the
		// lock's leaseDurationSeconds was changed in between).
		handed := info
		handed.duration = min(info.duration, lease.RecordOf(current).Duration(info.duration))
		until := c.safeUntil(handed, from)
		if left := until.Sub(now); left >= interval/2 {
			c.logger(ctx).V(1).Info("taking up the lock handed to this client", "lock", c.LockName(), "token", lease.Token(current))
			return newGrant(c, c.logger(ctx), info, current, until, min(interval, left/2)), nil
		}
	}
	updated, err := c.leases.Update(ctx, lease.Renew(current, info.duration, now), metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	c.remember(updated)
	if _, late := c.answeredTooLate(info, updated, now); late != nil {
		return nil, late
	}
	c.observer.Observe(info.leaseName, lease.RecordOf(updated), now)
	return newGrant(c, c.logger(ctx), info, updated, c.safeUntil(info, now), interval), nil
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

// refreshHandOffWindow is run by the head of the queue while another holds
// the lock. When what it knows (the registration, or the last read)
// vouches for less than one and a half renew intervals of a hand-off's
// window (a hand-off needs half of one), it reads the Lease, a quorum
// read, so that the next hand-off is known to be written after this moment
// (see handOffWrittenAfter). It returns when to run again: when what it
// knows vouches for one and a half renew intervals more (the slack beyond
// half of one is for a late timer or a slow read), and never sooner than a
// renew interval after its last read's answer (or failure; a read gets
// half a renew interval). So a head reads about twice per lease duration
// for as long as it waits at the head of the queue while another holds the
// lock, and writes nothing.
func (c *Client) refreshHandOffWindow(ctx context.Context, info lockInfo, p *place) (next time.Time) {
	interval := c.renewInterval(info)
	due := func() time.Time {
		vouched := c.safeUntil(info, latest(p.registeredAt, p.readAt)).Add(-interval * 3 / 2)
		return latest(vouched, p.readTried.Add(interval))
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

// latest is the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// leaveQueue takes a caller that gave up out of the queue (best effort,
// bounded). A release that handed it the lock meanwhile, or a grant of its
// own whose answer never came, is handed on or released, so it does not sit
// on a lock nobody uses.
func (c *Client) leaveQueue(info lockInfo, p *place) {
	if !p.sentRegistration && p.uncertain == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = c.modifyLease(ctx, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		if handedToMe(l, c.cfg.Identity, p) || landedUncertain(l, c.cfg.Identity, p) {
			return c.releasedLease(l, info)
		}
		if lease.Position(l, p.ticket) < 0 {
			return nil, errNothingToDo
		}
		return lease.Dequeue(l, p.ticket)
	})
}

// mayHaveLanded reports whether a write that failed with err may still
// have been applied: an answer from the apiserver below 500 (other than a
// request timeout) is a refusal; a 5xx, a timeout or no answer is not.
func mayHaveLanded(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == http.StatusRequestTimeout
	}
	return true
}

// landedUncertain reports whether current is the caller's own grant whose
// answer never came: its identity, its token and its attempt's nonce.
func landedUncertain(current *coordinationv1.Lease, identity string, p *place) bool {
	return p.uncertain != 0 && p.uncertainNonce != "" && lease.Holder(current) == identity &&
		lease.Token(current) == p.uncertain && current.Annotations[lease.GrantNonceAnnotation] == p.uncertainNonce
}

// errNothingToDo ends a modifyLease that has nothing to write.
var errNothingToDo = errors.New("nothing to do")

// releasedLease is current given up by its holder, this client: handed to
// the head of the queue in the same write, or simply released when nobody
// is queued.
func (c *Client) releasedLease(current *coordinationv1.Lease, info lockInfo) (*coordinationv1.Lease, error) {
	if current.DeletionTimestamp != nil || !controlledBy(current, info.uid) {
		// Being deleted, or no longer this lock's (retired): nobody can
		// take a hand-off up there, so it would only hold the Lease up.
		return lease.Release(current), nil
	}
	handed, _, ok, err := lease.HandOff(current, c.cfg.Identity, info.duration, c.cfg.Clock.Now())
	if err == nil && ok {
		return handed, nil
	}
	return lease.Release(current), nil
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
// by the lock, guarded by the token finalizer, not being deleted, and not
// wound back below a token already granted or recorded. Tokens on any other
// Lease would not be protected from going backwards.
func (c *Client) grantable(l *coordinationv1.Lease, info lockInfo) error {
	switch {
	case l.DeletionTimestamp != nil:
		return fmt.Errorf("%w: Lease %s/%s is being deleted; the controller recreates it", ErrLeaseUnavailable, c.cfg.Namespace, l.Name)
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
	fresh, _, err := c.resolve(ctx, true)
	if err != nil || fresh.uid != uid || fresh.leaseName != info.leaseName {
		return info, false
	}
	return fresh, true
}

// heldByOther reports whether a holder's grant is still live, and if not
// since when the lock has been free as observed here. A grant is live until
// this client has seen the same record for the lease duration, unless
// askController and the controller, which may have been watching longer,
// already reports this very record Expired.
func (c *Client) heldByOther(ctx context.Context, obs lease.Observation, info lockInfo, now time.Time, askController bool) (*HeldError, time.Time) {
	rec := obs.Record
	if rec.Holder == "" {
		return nil, obs.ObservedAt
	}
	if deadline := obs.Deadline(info.duration); !now.Before(deadline) {
		return nil, deadline
	}
	if askController {
		if _, lock, err := c.resolve(ctx, true); err == nil && controllerSawExpiry(lock, rec) {
			return nil, now
		}
	}
	return &HeldError{Lock: c.LockName(), Holder: rec.Holder, Token: int64(rec.Transitions), FreeAt: obs.Deadline(info.duration)}, time.Time{}
}

// controllerSawExpiry reports whether the lock's status marks exactly this
// Lease record as Expired.
func controllerSawExpiry(lock *locksv1alpha1.DistributedLock, rec lease.Record) bool {
	held := meta.FindStatusCondition(lock.Status.Conditions, locksv1alpha1.ConditionHeld)
	st := lock.Status
	return held != nil && held.Reason == locksv1alpha1.ReasonExpired && st.Holder == rec.Holder &&
		st.FencingToken == int64(rec.Transitions) && st.RenewTime != nil && st.RenewTime.Time.Equal(rec.RenewTime)
}
