package lease

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

func TestControllerOfALease(t *testing.T) {
	lockRef := metav1.OwnerReference{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "DistributedLock", Name: "billing",
		UID: "old-uid", Controller: ptr.To(true)}
	otherRef := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "dep", Controller: ptr.To(true)}
	plainRef := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "cm", UID: "cm"}

	legacy := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{lockRef, plainRef}}}
	if got := ControllerUID(legacy); got != "old-uid" {
		t.Errorf("a Lease an earlier version adopted: controller %q, want old-uid", got)
	}
	l := legacy.DeepCopy()
	SetController(l, "new-uid")
	if got := ControllerUID(l); got != "new-uid" || len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != "cm" {
		t.Errorf("after SetController: controller %q, owner references %v", got, l.OwnerReferences)
	}
	ClearController(l)
	if got := ControllerUID(l); got != "" || len(l.OwnerReferences) != 1 {
		t.Errorf("after ClearController: controller %q, owner references %v", got, l.OwnerReferences)
	}
	if ForeignController(legacy) != nil {
		t.Errorf("a DistributedLock owner counted as foreign")
	}
	foreign := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{otherRef}}}
	if ForeignController(foreign) == nil || ControllerUID(foreign) != "" {
		t.Errorf("a Deployment-controlled Lease: foreign %v, lock %q", ForeignController(foreign), ControllerUID(foreign))
	}
}
