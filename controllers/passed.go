package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// When a lock falls free other than by a hand-off (its grant lapsed, was
// broken, or was released with nobody queued), the waiters take their turns
// (lease.Turn): the head at once, the one at position k once the lock has
// been free for k turns. A waiter that takes the lock at its turn leaves
// the queue; those ahead of it had their turn and let it pass (most likely
// they are dead). Only the owner of a place may remove it (the lease-guard
// policy), so the controller removes the places passed over, and only when
// the lock was free long enough, as it observed, for their turns to have
// passed: a participant grabbing the lock out of turn does not get anyone
// else's place removed.

// passedPlaces remembers, per lock, the places a takeover passed over,
// from the Lease event that showed it until the next pass removes them.
type passedPlaces struct {
	mu sync.Mutex
	m  map[types.NamespacedName][]string
}

func newPassedPlaces() *passedPlaces {
	return &passedPlaces{m: map[types.NamespacedName][]string{}}
}

func (p *passedPlaces) note(key types.NamespacedName, tickets []string) {
	if len(tickets) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[key] = append(p.m[key], tickets...)
}

func (p *passedPlaces) take(key types.NamespacedName) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	tickets := p.m[key]
	delete(p.m, key)
	return tickets
}

// passedOver is the places of old's queue that the grant in cur passed
// over: a grant that is not a hand-off, by a waiter that left the queue in
// the same write (or by a caller outside it, which comes after everyone),
// made when the lock had been free, as observed here, for the turns of the
// places ahead of it (half a turn of slack: the controller sees the lock
// fall free a moment after the waiters do).
func passedOver(old, cur *coordinationv1.Lease, freeFor, turn time.Duration) []string {
	if lease.Token(cur) != lease.Token(old)+1 || lease.Holder(cur) == "" || cur.Annotations[lease.TicketAnnotation] != "" {
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

// removePassedPlaces removes the places noted as passed over for the lock,
// in one merge patch (removing a place already gone changes nothing).
func (r *DistributedLockReconciler) removePassedPlaces(ctx context.Context, key types.NamespacedName, l *coordinationv1.Lease) error {
	tickets := r.passed.take(key)
	if l == nil || len(tickets) == 0 {
		return nil
	}
	annotations, labels := map[string]any{}, map[string]any{}
	for _, t := range tickets {
		annotations[lease.EntryKey(t)], annotations[lease.QueuedByKey(t)] = nil, nil
		labels[lease.FrontLabelPrefix+t] = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations, "labels": labels}})
	if err != nil {
		return fmt.Errorf("encoding the removal of passed places: %w", err)
	}
	if err := r.Patch(ctx, l.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil {
		r.passed.note(key, tickets)
		return fmt.Errorf("removing the places passed over on lease %s: %w", l.Name, err)
	}
	return nil
}
