// Package leasetest builds coordination.k8s.io/v1 Leases for unit tests. It
// is the Lease builder of frontdesk's own tests (internal/testutil forwards to
// it), kept in the library module so the library's tests need nothing
// outside it.
package leasetest

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LeaseBuilder builds coordination.k8s.io/v1 Leases for unit tests.
type LeaseBuilder struct {
	lease coordinationv1.Lease
}

// MakeLease starts a builder for a Lease with the given name and namespace
// (either may be empty), free and with no fields set.
func MakeLease(name, namespace string) *LeaseBuilder {
	return &LeaseBuilder{lease: coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}}
}

// ResourceVersion sets metadata.resourceVersion.
func (b *LeaseBuilder) ResourceVersion(rv string) *LeaseBuilder {
	b.lease.ResourceVersion = rv
	return b
}

// Token sets spec.leaseTransitions, the fencing token of the epoch.
func (b *LeaseBuilder) Token(transitions int32) *LeaseBuilder {
	b.lease.Spec.LeaseTransitions = &transitions
	return b
}

// Duration sets spec.leaseDurationSeconds.
func (b *LeaseBuilder) Duration(seconds int32) *LeaseBuilder {
	b.lease.Spec.LeaseDurationSeconds = &seconds
	return b
}

// Holder sets spec.holderIdentity alone (an empty holder as well).
func (b *LeaseBuilder) Holder(identity string) *LeaseBuilder {
	b.lease.Spec.HolderIdentity = &identity
	return b
}

// Held sets the holder and its grant's acquireTime and renewTime.
func (b *LeaseBuilder) Held(identity string, acquired, renewed time.Time) *LeaseBuilder {
	at, rt := metav1.NewMicroTime(acquired), metav1.NewMicroTime(renewed)
	b.lease.Spec.AcquireTime, b.lease.Spec.RenewTime = &at, &rt
	return b.Holder(identity)
}

// Annotation sets the annotation key to value.
func (b *LeaseBuilder) Annotation(key, value string) *LeaseBuilder {
	if b.lease.Annotations == nil {
		b.lease.Annotations = map[string]string{}
	}
	b.lease.Annotations[key] = value
	return b
}

// Annotations sets all the annotations at once (nil: none).
func (b *LeaseBuilder) Annotations(annotations map[string]string) *LeaseBuilder {
	b.lease.Annotations = annotations
	return b
}

// Label sets the label key to value.
func (b *LeaseBuilder) Label(key, value string) *LeaseBuilder {
	if b.lease.Labels == nil {
		b.lease.Labels = map[string]string{}
	}
	b.lease.Labels[key] = value
	return b
}

// Obj returns a copy of the Lease built so far.
func (b *LeaseBuilder) Obj() *coordinationv1.Lease {
	return b.lease.DeepCopy()
}
