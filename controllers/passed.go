package controllers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// When a lock falls free other than by a hand-off (a grant ended as lapsed,
// a break, a release with nobody queued), the waiters take their turns
// (lease.Turn): the head at once, the one at position k once the lock has
// been free for k turns. A waiter that takes the lock at its turn leaves
// the queue; those ahead of it had their turn and let it pass (most likely
// they are dead). Only the owner of a place may remove it (the lease-guard
// policy), so the controller removes the places passed over, and only when
// the lock was free long enough, as it observed, for their turns to have
// passed: a participant grabbing the lock out of turn does not get anyone
// else's place removed. It also removes the head of a queue whose turn
// passed while the lock stayed free (nobody took it), one place at a time:
// the head watches every change, so a live one takes its turn on time.
// Every removal tests the place it removes, so a place registered again
// under the same ticket meanwhile stays.

// passedPlaces remembers, per lock, the places a takeover passed over (the
// tickets, from the Lease event that showed it until the next pass removes
// them), and when the controller last removed places of a free lock.
type passedPlaces struct {
	mu      sync.Mutex
	tickets map[types.NamespacedName][]string
	pruned  map[types.NamespacedName]time.Time
}

func newPassedPlaces() *passedPlaces {
	return &passedPlaces{tickets: map[types.NamespacedName][]string{}, pruned: map[types.NamespacedName]time.Time{}}
}

func (p *passedPlaces) note(key types.NamespacedName, tickets []string) {
	if len(tickets) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tickets[key] = append(p.tickets[key], tickets...)
}

func (p *passedPlaces) take(key types.NamespacedName) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	tickets := p.tickets[key]
	delete(p.tickets, key)
	return tickets
}

func (p *passedPlaces) lastPruned(key types.NamespacedName) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pruned[key]
}

func (p *passedPlaces) prunedAt(key types.NamespacedName, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruned[key] = at
}

func (p *passedPlaces) forget(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.tickets, key)
	delete(p.pruned, key)
}

// passedOver is the places of old's queue that the grant in cur passed
// over: a grant that is not a hand-off, by a waiter that left the queue in
// the same write (or by a caller outside it, which comes after everyone),
// made when the lock had been free, as observed here, for the turns of the
// places ahead of it (half a turn of slack: the controller sees the lock
// fall free a moment after the waiters do).
func passedOver(old, cur *coordinationv1.Lease, freeFor, turn time.Duration) []string {
	if lease.Token(cur) != lease.Token(old)+1 || lease.Holder(cur) == "" || cur.Annotations[locksv1alpha1.TicketAnnotation] != "" {
		return nil
	}
	q := lease.Queue(old)
	still := map[string]bool{}
	for _, w := range lease.Queue(cur) {
		still[w.Ticket] = true
	}
	taker := len(q)
	for i, w := range q {
		if !still[w.Ticket] && w.Identity == lease.Holder(cur) {
			taker = i
			break
		}
	}
	if taker == 0 || freeFor < time.Duration(taker)*turn-turn/2 {
		return nil
	}
	var passed []string
	for _, w := range q[:taker] {
		if still[w.Ticket] {
			passed = append(passed, w.Ticket)
		}
	}
	return passed
}

// expiredFront is the head of a free lock's queue once its turn passed with
// nobody taking the lock: once the lock has been free (or the head was
// last removed) for a turn and half a turn more; the head watches every
// change, so a live one has taken the lock by then. One place at a time:
// the next head's turn counts from this removal. next is when the head's
// turn will have passed (zero: the queue is empty).
func expiredFront(q []lease.Waiter, freeFor, turn time.Duration) (tickets []string, next time.Duration) {
	if len(q) == 0 {
		return nil, 0
	}
	if due := turn + turn/2; freeFor < due {
		return nil, due - freeFor
	}
	return []string{q[0].Ticket}, 0
}

// removePassedPlaces removes, from the pass's Lease l, the places noted as
// passed over and, if the lock is free, the first places whose turns
// passed while it stayed free (the pass's observation says since when). It
// returns how long until the next such turn has passed (zero: none).
func (r *DistributedLockReconciler) removePassedPlaces(ctx context.Context, p *pass) (time.Duration, error) {
	key, l, obs, now := p.key, p.state.lease, p.obs, p.now
	turn := lease.TurnLength(lockDuration(p.lock))
	tickets := r.passed.take(key)
	if l == nil {
		return 0, nil
	}
	var next time.Duration
	if obs.Record.Holder == "" {
		since := obs.ObservedAt
		if pruned := r.passed.lastPruned(key); pruned.After(since) {
			since = pruned
		}
		var expired []string
		expired, next = expiredFront(lease.Queue(l), now.Sub(since), turn)
		for _, t := range expired {
			if !slices.Contains(tickets, t) {
				tickets = append(tickets, t)
			}
		}
	}
	patch := lease.RemovePlacesPatch(l, tickets)
	if patch == nil {
		return next, nil
	}
	err := r.Patch(ctx, l.DeepCopy(), client.RawPatch(types.JSONPatchType, patch.Bytes()))
	switch {
	case err == nil:
		r.passed.prunedAt(key, now)
		return turn, nil
	case lease.PatchDidNotApply(err):
		return turn, nil // a place changed meanwhile: judged again at the next pass
	default:
		return 0, fmt.Errorf("removing the places passed over on lease %s: %w", l.Name, err)
	}
}
