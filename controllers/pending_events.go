package controllers

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// pendingEvents keeps, per lock, the events of Lease writes made by a pass
// whose status write (or a later step) failed. Events go out after the
// status write succeeds; without this, a pass that handed a candidates-mode
// lock on and then lost its status write race would leave the hand-off
// unreported: the pass that runs again finds the Lease already written and
// writes nothing (its status diff would name it a takeover instead). The
// next pass of the same lock (same UID) takes them and records them after
// its own status write. After a restart it starts empty.
type pendingEvents struct {
	mu      sync.Mutex
	pending map[types.NamespacedName]pendingFor
}

// pendingFor are the events kept for one lock, of the UID they describe.
type pendingFor struct {
	uid    types.UID
	events []lockEvent
}

func newPendingEvents() *pendingEvents {
	return &pendingEvents{pending: map[types.NamespacedName]pendingFor{}}
}

// keep stores the Lease-write events of a failed pass for the lock (the
// warnings a pass repeats while their cause lasts are left out), after any
// kept before.
func (p *pendingEvents) keep(lock types.NamespacedName, uid types.UID, evs []lockEvent) {
	writes := slices.DeleteFunc(slices.Clone(evs), func(ev lockEvent) bool { return recurringWarning(ev.reason) })
	if len(writes) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.pending[lock]
	if kept.uid != uid {
		kept = pendingFor{uid: uid}
	}
	kept.events = append(kept.events, writes...)
	p.pending[lock] = kept
}

// take removes and returns the events kept for the lock with this UID (a
// lock deleted and created again does not inherit them).
func (p *pendingEvents) take(lock types.NamespacedName, uid types.UID) []lockEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept, ok := p.pending[lock]
	delete(p.pending, lock)
	if !ok || kept.uid != uid {
		return nil
	}
	return kept.events
}

func (p *pendingEvents) forget(lock types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pending, lock)
}
