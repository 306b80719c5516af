package testutil

import "github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"

// LeaseBuilder builds coordination.k8s.io/v1 Leases for unit tests. It is
// pkg/lease/leasetest's, so the library module's own tests share it.
type LeaseBuilder = leasetest.LeaseBuilder

// MakeLease starts a builder for a Lease with the given name and namespace
// (either may be empty), free and with no fields set.
func MakeLease(name, namespace string) *LeaseBuilder {
	return leasetest.MakeLease(name, namespace)
}
