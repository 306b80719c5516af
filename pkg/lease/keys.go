package lease

import (
	"slices"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// ManagerAnnotations are the annotations on a lock's Lease that only the
// frontdesk manager writes (the lease-guard policy refuses them to
// everyone else).
var ManagerAnnotations = []string{
	locksv1alpha1.LockUIDAnnotation, locksv1alpha1.LeaseOriginAnnotation, locksv1alpha1.CandidateGrantAnnotation,
	locksv1alpha1.RevokedAnnotation, locksv1alpha1.LeaseDurationAnnotation, locksv1alpha1.LapsedAnnotation,
	locksv1alpha1.AdmittedGrantAnnotation,
}

// GrantAnnotations describe the Lease's current grant; a new grant or a
// release replaces or drops them.
var GrantAnnotations = grantMarks

// IsFrontdeskAnnotation reports whether an annotation key on a Lease is one
// of frontdesk's: the manager's, the grant's, or the queue's.
func IsFrontdeskAnnotation(key string) bool {
	return slices.Contains(ManagerAnnotations, key) || slices.Contains(grantMarks, key) || IsQueueKey(key)
}
