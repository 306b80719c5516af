package lease

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// distributedLockKind is the kind of the objects that control Leases.
const distributedLockKind = "DistributedLock"

// ControllerUID is the UID of the DistributedLock that controls l: its
// locks.frontdesk.dev/lock-uid annotation or, on a Lease an earlier
// frontdesk version took over, its controller owner reference to a
// DistributedLock. "" when no lock controls it.
func ControllerUID(l *coordinationv1.Lease) types.UID {
	if uid := l.Annotations[locksv1alpha1.LockUIDAnnotation]; uid != "" {
		return types.UID(uid)
	}
	if owner := metav1.GetControllerOf(l); owner != nil && owner.Kind == distributedLockKind && owner.APIVersion == locksv1alpha1.GroupVersion.String() {
		return owner.UID
	}
	return ""
}

// ForeignController is the controller owner reference of l to an object
// other than a DistributedLock, if any: such a Lease is another
// controller's, never a lock's.
func ForeignController(l *coordinationv1.Lease) *metav1.OwnerReference {
	owner := metav1.GetControllerOf(l)
	if owner == nil || (owner.Kind == distributedLockKind && owner.APIVersion == locksv1alpha1.GroupVersion.String()) {
		return nil
	}
	return owner
}

// SetController makes the lock with the given UID the controller of l (a
// copy the caller owns), dropping owner references to DistributedLocks that
// earlier frontdesk versions set.
func SetController(l *coordinationv1.Lease, uid types.UID) {
	dropLockOwners(l)
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[locksv1alpha1.LockUIDAnnotation] = string(uid)
}

// ClearController leaves l (a copy the caller owns) controlled by no lock.
func ClearController(l *coordinationv1.Lease) {
	dropLockOwners(l)
	delete(l.Annotations, locksv1alpha1.LockUIDAnnotation)
}

func dropLockOwners(l *coordinationv1.Lease) {
	var kept []metav1.OwnerReference
	for _, ref := range l.OwnerReferences {
		if ref.Kind != distributedLockKind || ref.APIVersion != locksv1alpha1.GroupVersion.String() {
			kept = append(kept, ref)
		}
	}
	l.OwnerReferences = kept
}
