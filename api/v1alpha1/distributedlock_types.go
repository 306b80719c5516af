package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultLeaseDurationSeconds is the lease duration used when a lock does not
// set spec.leaseDurationSeconds. It must match the +kubebuilder:default marker.
const DefaultLeaseDurationSeconds int32 = 15

// DistributedLockSpec is the desired state of a DistributedLock.
// +kubebuilder:validation:XValidation:rule="has(self.leaseName) == has(oldSelf.leaseName) && (!has(self.leaseName) || self.leaseName == oldSelf.leaseName)",message="leaseName is immutable: delete and recreate the lock to use another Lease"
type DistributedLockSpec struct {
	// leaseDurationSeconds is how long a grant stays valid without a renewal.
	// A holder must renew within this window; other clients, and the
	// controller, treat the lock as free once they have themselves observed
	// no renewal for this long.
	// +optional
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds,omitempty"`

	// leaseName is the name of the coordination.k8s.io/v1 Lease, in the lock's
	// namespace, that backs this lock. It defaults to the lock's own name and
	// cannot be changed after creation.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="leaseName must be a valid Lease name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
	LeaseName string `json:"leaseName,omitempty"`

	// candidates, when set, turns on zero-code leader election: the
	// controller itself holds the lock on behalf of one Ready,
	// non-terminating pod selected by candidates.podSelector (the oldest
	// first), renews it while that pod stays Ready, and hands it to the next
	// candidate, with a new fencing token, when the pod goes away or stops
	// being Ready. The holder pod is labelled so a Service can select it.
	// +optional
	Candidates *CandidatesSpec `json:"candidates,omitempty"`
}

// CandidatesSpec selects the pods the controller holds the lock for.
type CandidatesSpec struct {
	// podSelector selects candidate pods in the lock's namespace. An empty
	// selector selects every pod in the namespace.
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="podSelector.matchExpressions[].operator must be one of In, NotIn, Exists, DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",message="podSelector.matchExpressions[]: In and NotIn need values; Exists and DoesNotExist take none"
	PodSelector metav1.LabelSelector `json:"podSelector"`
}

// DistributedLockStatus is the state of a DistributedLock as observed by the
// controller from its Lease.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.fencingToken) || (has(self.fencingToken) && self.fencingToken >= oldSelf.fencingToken)",message="fencingToken must never decrease"
type DistributedLockStatus struct {
	// holder is the identity that holds the lock, or empty when nobody does.
	// A holder whose lease has lapsed stays here until another client takes
	// the lock over; the Held condition tells whether the grant is live.
	// +optional
	Holder string `json:"holder,omitempty"`

	// fencingToken is the highest fencing token ever granted for this lock:
	// the Lease's spec.leaseTransitions. It never decreases, even when the
	// Lease is deleted and recreated.
	// +optional
	// +kubebuilder:validation:Minimum=0
	FencingToken int64 `json:"fencingToken,omitempty"`

	// acquireTime is when the current holder acquired the lock, as written by
	// that holder into the Lease.
	// +optional
	AcquireTime *metav1.MicroTime `json:"acquireTime,omitempty"`

	// renewTime is when the current holder last renewed the lock, as written
	// by that holder into the Lease.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`

	// expireTime is when the controller will consider the grant lapsed: the
	// time it last observed the Lease change plus the lease duration. It is
	// judged on the controller's own clock, never by comparing the holder's
	// timestamps with it.
	// +optional
	ExpireTime *metav1.Time `json:"expireTime,omitempty"`

	// leaseName is the name of the Lease that backs this lock.
	// +optional
	LeaseName string `json:"leaseName,omitempty"`

	// holderPod is the pod in the lock's namespace that the live holder's
	// identity names (the part before the first "_"), when that pod exists.
	// The controller annotates and labels it (see docs/annotations.md).
	// +optional
	HolderPod string `json:"holderPod,omitempty"`

	// observedGeneration is the metadata.generation this status was computed
	// from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the lock: Ready (the Lease exists and is in sync)
	// and Held (a live holder owns the lock).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DistributedLock is a lock across machines backed by a
// coordination.k8s.io/v1 Lease. Every grant increments a fencing token that
// the holder passes to the resources it writes, so that a holder that paused
// past its lease cannot write after another one took over.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dlock;dlocks,categories=frontdesk
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder`
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.fencingToken`
// +kubebuilder:printcolumn:name="Held",type=string,JSONPath=`.status.conditions[?(@.type=="Held")].status`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.expireTime`,description="When the controller will consider the grant lapsed, as observed on its own clock"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Lease",type=string,JSONPath=`.status.leaseName`,priority=1
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.holderPod`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type DistributedLock struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the lock.
	// +optional
	Spec DistributedLockSpec `json:"spec,omitempty"`

	// status is the state of the lock as observed from its Lease.
	// +optional
	Status DistributedLockStatus `json:"status,omitempty"`
}

// EffectiveLeaseName is the name of the Lease that backs the lock:
// spec.leaseName, or the lock's own name when that is empty.
func (l *DistributedLock) EffectiveLeaseName() string {
	if l.Spec.LeaseName != "" {
		return l.Spec.LeaseName
	}
	return l.Name
}

// EffectiveLeaseDurationSeconds is spec.leaseDurationSeconds, or the default
// when it is unset (for objects that bypassed apiserver defaulting).
func (l *DistributedLock) EffectiveLeaseDurationSeconds() int32 {
	if l.Spec.LeaseDurationSeconds > 0 {
		return l.Spec.LeaseDurationSeconds
	}
	return DefaultLeaseDurationSeconds
}

// DistributedLockList is a list of DistributedLocks.
// +kubebuilder:object:root=true
type DistributedLockList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the DistributedLocks.
	// +required
	Items []DistributedLock `json:"items"`
}

func init() {
	SchemeBuilder.Register(&DistributedLock{}, &DistributedLockList{})
}
