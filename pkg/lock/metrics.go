package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus metrics of lock holders. Create them once per
// process with NewMetrics, on the registry you serve, and pass them to every
// Client in Config.Metrics. The names are listed in docs/metrics.md.
type Metrics struct {
	acquire        *prometheus.HistogramVec
	renewals       *prometheus.CounterVec
	renewalErrors  *prometheus.CounterVec
	lost           *prometheus.CounterVec
	held           *prometheus.HistogramVec
	holding        *prometheus.GaugeVec
	queuedAcquires *prometheus.CounterVec
}

// NewMetrics creates the holder metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	labels := []string{"namespace", "lock"}
	m := &Metrics{
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "frontdesk_client_acquire_seconds",
			Help:    "How long Acquire or TryAcquire took, by result (acquired, held, error).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, append(labels, "result")),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "frontdesk_client_renewals_total",
			Help: "Renewals of grants that landed.",
		}, labels),
		renewalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "frontdesk_client_renewal_failures_total",
			Help: "Renewal attempts that failed (each is retried within the grant's safe window).",
		}, labels),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "frontdesk_client_grants_lost_total",
			Help: "Grants that ended without Release: taken over, broken, deleted, or not renewed in time (reason).",
		}, append(labels, "reason")),
		held: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "frontdesk_client_held_seconds",
			Help:    "How long a grant lasted, from the grant to its release or loss.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}, labels),
		holding: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "frontdesk_client_holding",
			Help: "Grants this process holds now.",
		}, labels),
		queuedAcquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "frontdesk_client_queued_acquires_total",
			Help: "Acquire calls that joined the lock's queue of waiters.",
		}, labels),
	}
	for _, c := range []prometheus.Collector{m.acquire, m.renewals, m.renewalErrors, m.lost, m.held, m.holding, m.queuedAcquires} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering frontdesk client metrics: %w", err)
		}
	}
	return m, nil
}

// The methods below do nothing on a nil *Metrics (a Client without
// metrics).

func (m *Metrics) acquired(ns, name string, took time.Duration, err error) {
	if m == nil {
		return
	}
	result := "acquired"
	switch {
	case errors.Is(err, ErrHeld):
		result = "held"
	case err != nil:
		result = "error"
	}
	m.acquire.WithLabelValues(ns, name, result).Observe(took.Seconds())
	if err == nil {
		m.holding.WithLabelValues(ns, name).Inc()
	}
}

func (m *Metrics) renewed(ns, name string, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.renewalErrors.WithLabelValues(ns, name).Inc()
		return
	}
	m.renewals.WithLabelValues(ns, name).Inc()
}

func (m *Metrics) ended(ns, name string, held time.Duration, lostReason string) {
	if m == nil {
		return
	}
	m.holding.WithLabelValues(ns, name).Dec()
	m.held.WithLabelValues(ns, name).Observe(held.Seconds())
	if lostReason != "" {
		m.lost.WithLabelValues(ns, name, lostReason).Inc()
	}
}

func (m *Metrics) queued(ns, name string) {
	if m == nil {
		return
	}
	m.queuedAcquires.WithLabelValues(ns, name).Inc()
}
