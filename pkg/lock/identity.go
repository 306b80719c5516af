package lock

import (
	"crypto/rand"
	"encoding/hex"
	"os"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// DefaultIdentity is unique per process incarnation. In a pod whose
// downward API sets $POD_NAME and $POD_UID it is "<pod>_<uid>_<8 hex>": the
// controller then marks that pod (and only that pod, checked by UID) as the
// holder. Without them it is "<hostname>_<8 hex>", which marks no pod.
func DefaultIdentity() string {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	random := hex.EncodeToString(suffix)
	pod, uid := os.Getenv("POD_NAME"), os.Getenv("POD_UID")
	if pod != "" && locksv1alpha1.PodUIDOf(pod+locksv1alpha1.IdentitySeparator+uid) != "" {
		return locksv1alpha1.PodIdentity(pod, uid, random)
	}
	base := pod
	if base == "" {
		base, _ = os.Hostname()
	}
	if base == "" {
		base = "unknown"
	}
	return base + locksv1alpha1.IdentitySeparator + random
}

// PodNameOf returns the pod (or host) part of an identity made by
// DefaultIdentity; other identities are returned whole.
func PodNameOf(identity string) string {
	return locksv1alpha1.PodNameOf(identity)
}

// newTicket is a random ticket for one place in a lock's queue.
func newTicket() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
