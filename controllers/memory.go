package controllers

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// memories is what this process remembers between passes, beyond what the
// cache holds: what it observed of each lock's grants and when, what it
// keeps for a lock's next pass, and what the pod watch showed. It starts
// empty after a restart; every part is written for that (the conservative
// direction: waits are counted afresh, nothing is proven).
type memories struct {
	// Of a lock's grants, keyed by the lock.

	// observations: when the controller first saw each Lease record.
	observations *lease.Observer
	// metrics: the per-lock timing state of the histograms, and its series.
	metrics *lockMetrics
	// highWater: the highest token any event of the lock's Lease showed.
	highWater *tokenHighWater

	// For a lock's next pass, keyed by the lock.

	// pending: the events of Lease writes made by a pass that failed.
	pending *pendingEvents
	// passed: the places a takeover passed over, and the last removal.
	passed *passedPlaces
	// written: the lock's resourceVersion before the controller last wrote it.
	written *ownWrites

	// Of pods and ServiceAccounts, keyed by pod UID or ServiceAccount: a
	// lock's deletion does not end them.

	// podNotes: how a pod went away, waits, warnings sent.
	podNotes *podNotes
	// deaths: the pods the watch showed finished, and deleted so.
	deaths *deaths
	// phases: who set each pod's terminal phase, as first seen.
	phases *phases
	// pods: when a queued pod principal was last seen alive.
	pods *podsAlive
	// access: whether a ServiceAccount may use a lock, and since when.
	access *lockAccess
}

// newMemories is what a process starts with: nothing remembered.
func newMemories() *memories {
	return &memories{
		observations: lease.NewObserver(),
		metrics:      newLockMetrics(),
		highWater:    newTokenHighWater(),
		pending:      newPendingEvents(),
		passed:       newPassedPlaces(),
		written:      newOwnWrites(),
		podNotes:     newPodNotes(),
		deaths:       newDeaths(),
		phases:       newPhases(),
		pods:         newPodsAlive(),
		access:       newLockAccess(),
	}
}

// forget drops everything remembered of the lock key: its grants and what
// was kept for its next pass. It is for a lock that no longer exists.
func (m *memories) forget(key types.NamespacedName) {
	m.forgetGrants(key)
	m.pending.forget(key)
	m.passed.forget(key)
	m.written.forget(key)
}

// forgetGrants drops what was observed of the lock key's grants (its
// observations, metrics and token high water), and keeps what was kept for
// its next pass: it is for a lock whose finalizer is gone, so that a lock
// created again under its name observes its grants afresh.
func (m *memories) forgetGrants(key types.NamespacedName) {
	m.observations.Forget(key.String())
	m.metrics.forget(key)
	m.highWater.forget(key)
}
