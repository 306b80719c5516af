package controllers

import (
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
)

// leaseRecord is the part of a Lease that a holder changes when it acquires,
// renews or releases. The controller compares records, never timestamps
// against its own clock, to tell that a holder is alive.
type leaseRecord struct {
	holder      string
	transitions int32
	duration    int32
	acquireTime time.Time
	renewTime   time.Time
}

// recordOf extracts the leaseRecord of a Lease.
func recordOf(lease *coordinationv1.Lease) leaseRecord {
	var r leaseRecord
	if lease.Spec.HolderIdentity != nil {
		r.holder = *lease.Spec.HolderIdentity
	}
	if lease.Spec.LeaseTransitions != nil {
		r.transitions = *lease.Spec.LeaseTransitions
	}
	if lease.Spec.LeaseDurationSeconds != nil {
		r.duration = *lease.Spec.LeaseDurationSeconds
	}
	if lease.Spec.AcquireTime != nil {
		r.acquireTime = lease.Spec.AcquireTime.Time
	}
	if lease.Spec.RenewTime != nil {
		r.renewTime = lease.Spec.RenewTime.Time
	}
	return r
}

func (r leaseRecord) equal(o leaseRecord) bool {
	return r.holder == o.holder && r.transitions == o.transitions && r.duration == o.duration &&
		r.acquireTime.Equal(o.acquireTime) && r.renewTime.Equal(o.renewTime)
}

// observation is the last leaseRecord seen for a lock and when, on the
// controller's clock, it was first seen. Times come from clock.Now(), which
// carries Go's monotonic reading, so durations between them are immune to
// wall-clock steps.
type observation struct {
	record     leaseRecord
	observedAt time.Time
}

// observationTracker remembers, per lock, when the controller last saw its
// Lease record change. It is the controller's monotonic view of liveness:
// a holder is expired once the record has stayed the same for the lease
// duration. After a restart the tracker is empty and every lease gets a full
// duration from its first observation, the conservative direction.
type observationTracker struct {
	mu           sync.Mutex
	observations map[types.NamespacedName]observation
}

func newObservationTracker() *observationTracker {
	return &observationTracker{observations: map[types.NamespacedName]observation{}}
}

// observe records the record seen for key at now and returns the
// observation: observedAt moves to now only when the record changed.
func (t *observationTracker) observe(key types.NamespacedName, record leaseRecord, now time.Time) observation {
	t.mu.Lock()
	defer t.mu.Unlock()
	prev, ok := t.observations[key]
	if ok && prev.record.equal(record) {
		return prev
	}
	obs := observation{record: record, observedAt: now}
	t.observations[key] = obs
	return obs
}

// forget drops what is known about key, when its lock is gone.
func (t *observationTracker) forget(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.observations, key)
}
