// Package testutil holds the builders and helpers that the unit tests of
// the root module share with the suites of the test module (locks, Leases,
// pods, metrics). Helpers only the suites use are in the test module's
// test/internal/harness.
package testutil

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// LockBuilder builds DistributedLocks for tests.
type LockBuilder struct {
	lock locksv1alpha1.DistributedLock
}

// MakeLock starts a builder for a lock with the given name and namespace.
func MakeLock(name, namespace string) *LockBuilder {
	return &LockBuilder{lock: locksv1alpha1.DistributedLock{
		TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "DistributedLock"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
	}}
}

// LeaseDuration sets spec.leaseDurationSeconds.
func (b *LockBuilder) LeaseDuration(seconds int32) *LockBuilder {
	b.lock.Spec.LeaseDurationSeconds = seconds
	return b
}

// LeaseName sets spec.leaseName.
func (b *LockBuilder) LeaseName(name string) *LockBuilder {
	b.lock.Spec.LeaseName = name
	return b
}

// Generation sets metadata.generation.
func (b *LockBuilder) Generation(g int64) *LockBuilder {
	b.lock.Generation = g
	return b
}

// Status sets the recorded status.
func (b *LockBuilder) Status(st locksv1alpha1.DistributedLockStatus) *LockBuilder {
	b.lock.Status = st
	return b
}

// Obj returns a copy of the built lock.
func (b *LockBuilder) Obj() *locksv1alpha1.DistributedLock {
	return b.lock.DeepCopy()
}

// Candidates turns on candidates mode for pods with the given labels.
func (b *LockBuilder) Candidates(matchLabels map[string]string) *LockBuilder {
	sel := locksv1alpha1.PodSelector{MatchLabels: map[string]locksv1alpha1.LabelValue{}}
	for k, v := range matchLabels {
		sel.MatchLabels[k] = locksv1alpha1.LabelValue(v)
	}
	b.lock.Spec.Candidates = &locksv1alpha1.CandidatesSpec{PodSelector: sel}
	return b
}

// HandOffDelay sets spec.candidates.handOffDelaySeconds (call after Candidates).
func (b *LockBuilder) HandOffDelay(seconds int32) *LockBuilder {
	b.lock.Spec.Candidates.HandOffDelaySeconds = &seconds
	return b
}

// LeaseAdoption sets spec.leaseAdoption.
func (b *LockBuilder) LeaseAdoption(a locksv1alpha1.LeaseAdoption) *LockBuilder {
	b.lock.Spec.LeaseAdoption = a
	return b
}

// Failover sets spec.failover.
func (b *LockBuilder) Failover(f locksv1alpha1.Failover) *LockBuilder {
	b.lock.Spec.Failover = f
	return b
}
