package lock

import (
	"crypto/rand"
	"encoding/hex"
	"os"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// IdentitySeparator separates the pod (or host) name from the per-process
// suffix in a default identity. It cannot occur in a pod name, so the part
// before it names the pod (the controller labels that pod).
const IdentitySeparator = locksv1alpha1.IdentitySeparator

// DefaultIdentity is unique per process incarnation: $POD_NAME (else the
// hostname), the separator, and 8 random hex digits.
func DefaultIdentity() string {
	base := os.Getenv("POD_NAME")
	if base == "" {
		base, _ = os.Hostname()
	}
	if base == "" {
		base = "unknown"
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	return base + IdentitySeparator + hex.EncodeToString(suffix)
}

// PodNameOf returns the pod (or host) part of an identity made by
// DefaultIdentity; other identities are returned whole.
func PodNameOf(identity string) string {
	return locksv1alpha1.PodNameOf(identity)
}
