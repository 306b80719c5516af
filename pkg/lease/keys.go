package lease

import (
	"slices"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// IsFrontdeskAnnotation reports whether an annotation key on a Lease is one
// of frontdesk's: the manager's, the grant's, or the queue's.
func IsFrontdeskAnnotation(key string) bool {
	return slices.Contains(locksv1alpha1.ManagerAnnotations, key) || slices.Contains(locksv1alpha1.GrantAnnotations, key) || IsQueueKey(key)
}
