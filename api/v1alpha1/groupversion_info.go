// Package v1alpha1 contains the locks.frontdesk.dev/v1alpha1 API: the
// DistributedLock custom resource.
// +kubebuilder:object:generate=true
// +groupName=locks.frontdesk.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the DistributedLock API.
	GroupVersion = schema.GroupVersion{Group: "locks.frontdesk.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion} //nolint:staticcheck // SA1019: replacing it changes the exported SchemeBuilder's type; kubebuilder still scaffolds it

	// AddToScheme adds the API types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
