package lease

import (
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// Record is the part of a Lease that a holder changes when it acquires,
// renews or releases. Liveness is judged by whether the record changes, never
// by comparing its timestamps with the local clock.
type Record struct {
	// Holder is spec.holderIdentity ("" when free).
	Holder string
	// Token is the fencing token of the last grant (see Token).
	Token int64
	// DurationSeconds is spec.leaseDurationSeconds (0 when unset).
	DurationSeconds int32
	// AcquireTime is spec.acquireTime as the holder wrote it.
	AcquireTime time.Time
	// RenewTime is spec.renewTime as the holder wrote it.
	RenewTime time.Time
	// Lapsed: the Lease is free because the controller ended its last
	// grant as lapsed (see Lapsed).
	Lapsed bool
}

// RecordOf extracts the Record of a Lease; unset fields are zero.
func RecordOf(l *coordinationv1.Lease) Record {
	var r Record
	if l.Spec.HolderIdentity != nil {
		r.Holder = *l.Spec.HolderIdentity
	}
	r.Token = Token(l)
	if l.Spec.LeaseDurationSeconds != nil {
		r.DurationSeconds = *l.Spec.LeaseDurationSeconds
	}
	if l.Spec.AcquireTime != nil {
		r.AcquireTime = l.Spec.AcquireTime.Time
	}
	if l.Spec.RenewTime != nil {
		r.RenewTime = l.Spec.RenewTime.Time
	}
	r.Lapsed = Lapsed(l)
	return r
}

// Equal reports whether two records are the same.
func (r Record) Equal(o Record) bool {
	return r.Holder == o.Holder && r.Token == o.Token && r.DurationSeconds == o.DurationSeconds &&
		r.AcquireTime.Equal(o.AcquireTime) && r.RenewTime.Equal(o.RenewTime) && r.Lapsed == o.Lapsed
}

// Duration is the record's lease duration, or fallback when it carries none.
func (r Record) Duration(fallback time.Duration) time.Duration {
	if r.DurationSeconds > 0 {
		return time.Duration(r.DurationSeconds) * time.Second
	}
	return fallback
}

// Observation is a record and when the local clock first saw it. A record
// is the holder, token and renewTime together, so ObservedAt moves on every
// renewal: it says when the grant was last seen renewed, not when it began.
// ObservedAt comes from a clock that carries Go's monotonic reading, so
// durations measured from it are immune to wall-clock steps.
type Observation struct {
	Record     Record
	ObservedAt time.Time
}

// Deadline is when the record's holder is expired as observed here: the
// first sighting plus the lease duration.
func (o Observation) Deadline(fallback time.Duration) time.Time {
	return o.ObservedAt.Add(o.Record.Duration(fallback))
}

// Observer remembers, per key, the last record seen and when it was first
// seen. After a restart it is empty, and every lease gets a full duration
// from its first sighting: the conservative direction.
type Observer struct {
	mu           sync.Mutex
	observations map[string]Observation
}

// NewObserver returns an empty Observer.
func NewObserver() *Observer {
	return &Observer{observations: map[string]Observation{}}
}

// Observe records r as seen for key at now and returns the observation:
// ObservedAt moves to now only when the record changed.
func (o *Observer) Observe(key string, r Record, now time.Time) Observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	prev, ok := o.observations[key]
	if ok && prev.Record.Equal(r) {
		return prev
	}
	obs := Observation{Record: r, ObservedAt: now}
	o.observations[key] = obs
	return obs
}

// Last is the last observation recorded for key, if any.
func (o *Observer) Last(key string) (Observation, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	obs, ok := o.observations[key]
	return obs, ok
}

// Forget drops what is known about key.
func (o *Observer) Forget(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.observations, key)
}

// SafetyMargin is how much earlier than the lease duration, counted from a
// write's start, its writer stops counting on the grant: configured when
// positive, else 2% of duration plus 100ms. It covers the clocks of two
// machines running at different rates, and scheduling delay.
func SafetyMargin(duration, configured time.Duration) time.Duration {
	if configured > 0 {
		return configured
	}
	return duration/50 + 100*time.Millisecond
}
