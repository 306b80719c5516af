package controllers

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// The labels that name a lock on the manager's metrics.
const (
	labelNamespace = "namespace"
	labelLock      = "lock"
)

// Prometheus metrics of the manager, served on its metrics endpoint. The
// list, with meanings, is in docs/metrics.md.
var (
	lockHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "frontdesk_lock_held",
		Help: "1 while the lock has a live holder (condition Held=True), else 0.",
	}, []string{labelNamespace, labelLock})
	lockFencingToken = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "frontdesk_lock_fencing_token",
		Help: "The lock's recorded fencing token (status.fencingToken).",
	}, []string{labelNamespace, labelLock})
	lockEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "frontdesk_lock_transitions_total",
		Help: "Grants, handoffs, releases and expiries the controller observed, by kind " +
			"(acquired, taken_over, handed_off, released, expired, invalid_grant).",
	}, []string{labelNamespace, labelLock, "kind"})
	timeToAcquire = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "frontdesk_lock_time_to_acquire_seconds",
		Help:    "How long a lock stayed free (released or expired, as observed) before the next grant was observed.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{labelNamespace})
	holdDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "frontdesk_lock_hold_duration_seconds",
		Help:    "How long a grant lasted, from its observation to the observed release, expiry or takeover.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
	}, []string{labelNamespace})
	statusLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "frontdesk_status_lag_seconds",
		Help:    "From a Lease change reaching the controller's informer to the lock's status write that reflects it.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	provenDeadReleases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "frontdesk_proven_dead_releases_total",
		Help: "Grants the controller ended before their lease because the holder's pod was proven dead, by proof " +
			"(finished: Succeeded or Failed with every container terminated; deleted: gone after that).",
	}, []string{labelNamespace, "proof"})
	podAdmissionWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "frontdesk_pod_admission_wait_seconds",
		Help:    "How long a gated pod waited, from its creation to the controller removing its admission gate.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 12),
	}, []string{labelNamespace})
)

func init() {
	metrics.Registry.MustRegister(lockHeld, lockFencingToken, lockEvents, timeToAcquire, holdDuration, statusLag, podAdmissionWait, provenDeadReleases)
}

// eventKinds maps event reasons to the kind label of the transitions metric.
var eventKinds = map[string]string{
	EventAcquired:  "acquired",
	EventTakenOver: "taken_over",
	EventHandedOff: "handed_off",
	EventReleased:  "released",
	EventExpired:   "expired",
	// A grant ended on the proof of its holder's death (proof.go).
	EventHolderProvenDead: "proven_dead",
	// A Lease naming a new holder without a new token (alerted on).
	EventInvalidGrant: "invalid_grant",
}

// lockMetrics keeps the per-lock timing state the histograms need: when a
// grant started and when the lock became free, on the controller's clock,
// and when a Lease change arrived.
type lockMetrics struct {
	mu        sync.Mutex
	heldSince map[types.NamespacedName]time.Time
	freeSince map[types.NamespacedName]time.Time
	arrived   map[types.NamespacedName]time.Time
}

func newLockMetrics() *lockMetrics {
	return &lockMetrics{
		heldSince: map[types.NamespacedName]time.Time{},
		freeSince: map[types.NamespacedName]time.Time{},
		arrived:   map[types.NamespacedName]time.Time{},
	}
}

// leaseChanged notes when a Lease change for key reached the informer.
func (m *lockMetrics) leaseChanged(key types.NamespacedName, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, pending := m.arrived[key]; !pending {
		m.arrived[key] = now
	}
}

// statusWritten records the lag of a status write and the lock's gauges.
func (m *lockMetrics) statusWritten(key types.NamespacedName, st *locksv1alpha1.DistributedLockStatus, now time.Time) {
	m.mu.Lock()
	arrived, ok := m.arrived[key]
	delete(m.arrived, key)
	m.mu.Unlock()
	if ok {
		statusLag.Observe(now.Sub(arrived).Seconds())
	}
	held := 0.0
	if meta.IsStatusConditionTrue(st.Conditions, locksv1alpha1.ConditionHeld) {
		held = 1
	}
	lockHeld.WithLabelValues(key.Namespace, key.Name).Set(held)
	lockFencingToken.WithLabelValues(key.Namespace, key.Name).Set(float64(st.FencingToken))
}

// observed counts the transitions behind evs and times grants and gaps.
func (m *lockMetrics) observed(key types.NamespacedName, evs []lockEvent, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ev := range evs {
		kind, ok := eventKinds[ev.reason]
		if !ok {
			continue
		}
		lockEvents.WithLabelValues(key.Namespace, key.Name, kind).Inc()
		switch kind {
		case "acquired", "taken_over", "handed_off":
			if since, ok := m.heldSince[key]; ok {
				holdDuration.WithLabelValues(key.Namespace).Observe(now.Sub(since).Seconds())
			}
			if since, ok := m.freeSince[key]; ok {
				timeToAcquire.WithLabelValues(key.Namespace).Observe(now.Sub(since).Seconds())
				delete(m.freeSince, key)
			}
			m.heldSince[key] = now
		case "released", "expired", "proven_dead":
			if since, ok := m.heldSince[key]; ok {
				holdDuration.WithLabelValues(key.Namespace).Observe(now.Sub(since).Seconds())
				delete(m.heldSince, key)
			}
			m.freeSince[key] = now
		}
	}
}

// forget drops a deleted lock's series and state.
func (m *lockMetrics) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.heldSince, key)
	delete(m.freeSince, key)
	delete(m.arrived, key)
	lockHeld.DeleteLabelValues(key.Namespace, key.Name)
	lockFencingToken.DeleteLabelValues(key.Namespace, key.Name)
	lockEvents.DeletePartialMatch(prometheus.Labels{labelNamespace: key.Namespace, labelLock: key.Name})
}
