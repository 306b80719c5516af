// Package v1alpha1 contains the locks.frontdesk.dev/v1alpha1 API: the
// DistributedLock custom resource.
// +kubebuilder:object:generate=true
// +groupName=locks.frontdesk.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the DistributedLock API.
	GroupVersion = schema.GroupVersion{Group: "locks.frontdesk.dev", Version: "v1alpha1"}

	// SchemeGroupVersion is GroupVersion under the name k8s.io/api's groups
	// and generated clients use.
	SchemeGroupVersion = GroupVersion

	// SchemeBuilder registers the API types with a runtime.Scheme. It is
	// apimachinery's, so importing the API needs no controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers DistributedLock and DistributedLockList in
// GroupVersion, with the meta/v1 types every group version has (as
// controller-runtime's scheme.Builder did).
func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &DistributedLock{}, &DistributedLockList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
