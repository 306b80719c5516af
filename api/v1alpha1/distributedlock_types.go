package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultLeaseDurationSeconds is the lease duration used when a lock does not
// set spec.leaseDurationSeconds. It must match the +kubebuilder:default marker.
const DefaultLeaseDurationSeconds int32 = 15

// DefaultPodStartTimeoutSeconds is spec.podStartTimeoutSeconds when unset.
// It must match the +kubebuilder:default marker.
const DefaultPodStartTimeoutSeconds = 300

// LeaseAdoption says when a lock adopts an existing Lease that no object
// controls and frontdesk did not create.
// +kubebuilder:validation:Enum=WhenFree;WhileHeld
type LeaseAdoption string

const (
	// LeaseAdoptionWhenFree adopts such a Lease only once nobody holds it
	// (no holder, or a holder the controller has seen lapse).
	LeaseAdoptionWhenFree LeaseAdoption = "WhenFree"
	// LeaseAdoptionWhileHeld adopts it at once, with its live holder, for
	// a Lease that client-go leader election already uses.
	LeaseAdoptionWhileHeld LeaseAdoption = "WhileHeld"
)

// DistributedLockSpec is the desired state of a DistributedLock.
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
	// cannot be changed after creation (setting it to the name it already
	// defaults to is not a change).
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

	// leaseAdoption says when the lock adopts an existing Lease of its
	// leaseName that no object controls and frontdesk did not create:
	// WhenFree (the default) waits until nobody holds it; WhileHeld adopts
	// it with its live holder (a Lease that client-go leader election
	// uses). A Lease frontdesk did not create is never deleted: when the
	// lock is deleted it is handed back as it is.
	// +optional
	// +kubebuilder:default=WhenFree
	LeaseAdoption LeaseAdoption `json:"leaseAdoption,omitempty"`

	// podStartTimeoutSeconds bounds how long a pod that runs holding this
	// lock (annotation locks.frontdesk.dev/runs-holding) may take to start
	// once the controller granted it the lock and removed its gate: a pod
	// still unscheduled, or whose containers have not started, that long
	// after, is deleted by the controller (its Job, if any, makes another,
	// which queues again), and its grant ends once the pod is proven gone,
	// so it never runs later without the lock. Default 300.
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	PodStartTimeoutSeconds int32 `json:"podStartTimeoutSeconds,omitempty"`

	// failover says what may end a grant its holder did not release:
	// Proof (the default) ends it at once when the holder's pod is proven
	// dead, as its kubelet reports it (the pod Succeeded or Failed with
	// every container terminated, or gone after such a report), and
	// otherwise when the lease runs out; Lease ends it only when the lease
	// runs out. A grant is tied to a pod by the pod-bound ServiceAccount
	// token that made it. Choose Lease when a holder's process may outlive
	// its pod's containers (a pod's token used outside the pod). The
	// rules, and what is not proof, are in docs/design.md ("Failover on
	// proof").
	// +optional
	// +kubebuilder:default=Proof
	Failover Failover `json:"failover,omitempty"`
}

// Failover says what may end a grant its holder did not release.
// +kubebuilder:validation:Enum=Proof;Lease
type Failover string

const (
	// FailoverProof ends a grant when its holder's pod is proven dead, or
	// when its lease runs out.
	FailoverProof Failover = "Proof"
	// FailoverLease ends a grant only when its lease runs out.
	FailoverLease Failover = "Lease"
)

// CandidatesSpec selects the pods the controller holds the lock for.
type CandidatesSpec struct {
	// podSelector selects candidate pods in the lock's namespace, as a
	// Kubernetes label selector (matchLabels, matchExpressions). An empty
	// selector selects every pod in the namespace.
	// +required
	PodSelector PodSelector `json:"podSelector"`

	// handOffDelaySeconds is how long the controller waits, after it
	// revokes the grant of a holder pod that stopped being eligible (not
	// Ready, terminating, no longer selected), before it grants the lock to
	// the next candidate, unless the old pod is gone (deleted) sooner. The
	// old pod has no grant Context: its marks are removed at revocation,
	// and it learns of that only when its downward-API files refresh.
	// Unset means the lock's lease duration, the safe value; shorter values
	// trade that safety for a faster hand-off.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	HandOffDelaySeconds *int32 `json:"handOffDelaySeconds,omitempty"`
}

// PodSelector is a label selector with the JSON form of a Kubernetes
// LabelSelector, bounded so that the apiserver can check every key and value
// at admission (a selector that cannot select pods is refused, not accepted
// and then ignored).
// +kubebuilder:validation:XValidation:rule="!has(self.matchLabels) || self.matchLabels.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="podSelector.matchLabels keys must be valid label keys: an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
type PodSelector struct {
	// matchLabels selects pods that carry every one of these labels.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// matchExpressions selects pods that meet every one of these
	// requirements.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	MatchExpressions []PodSelectorRequirement `json:"matchExpressions,omitempty"`
}

// PodSelectorRequirement is one requirement of a PodSelector, as in a
// Kubernetes LabelSelector.
// +kubebuilder:validation:XValidation:rule="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",message="podSelector.matchExpressions[]: In and NotIn need values; Exists and DoesNotExist take none"
type PodSelectorRequirement struct {
	// key is the label key the requirement applies to.
	// +required
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	Key string `json:"key"`

	// operator is how the key relates to the values: In, NotIn, Exists or
	// DoesNotExist.
	// +required
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`

	// values are the label values for In and NotIn; empty for Exists and
	// DoesNotExist.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Values []LabelValue `json:"values,omitempty"`
}

// LabelValue is a Kubernetes label value: at most 63 letters, digits, '-',
// '_' or '.', starting and ending with a letter or digit, or empty.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`
type LabelValue string

// LabelSelector is the selector as the Kubernetes libraries take it.
func (s *PodSelector) LabelSelector() *metav1.LabelSelector {
	out := &metav1.LabelSelector{}
	if s.MatchLabels != nil {
		out.MatchLabels = make(map[string]string, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = string(v)
		}
	}
	for _, r := range s.MatchExpressions {
		req := metav1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator}
		for _, v := range r.Values {
			req.Values = append(req.Values, string(v))
		}
		out.MatchExpressions = append(out.MatchExpressions, req)
	}
	return out
}

// DistributedLockStatus is the state of a DistributedLock as observed by the
// controller from its Lease.
type DistributedLockStatus struct {
	// holder is the identity that holds the lock, or empty when nobody does.
	// A holder whose lease has lapsed stays here until another client takes
	// the lock over; the Held condition tells whether the grant is live.
	// +optional
	Holder string `json:"holder,omitempty"`

	// fencingToken is the highest fencing token ever granted for this lock:
	// the Lease's token epoch times 2^31 plus its spec.leaseTransitions. It
	// never decreases, even when the Lease is deleted and recreated, or the
	// lock itself is.
	// +optional
	// +kubebuilder:validation:Minimum=0
	FencingToken int64 `json:"fencingToken"`

	// acquireTime is when the current holder acquired the lock, as written by
	// that holder into the Lease.
	// +optional
	AcquireTime *metav1.MicroTime `json:"acquireTime,omitempty"`

	// renewTime is the holder's renewTime, as written by the holder into the
	// Lease, when the status last changed (a grant, a release, an expiry):
	// routine renewals are written to the Lease only, never to status. When
	// Held is Expired it names exactly the record that lapsed.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`

	// leaseName is the name of the Lease that backs this lock.
	// +optional
	LeaseName string `json:"leaseName,omitempty"`

	// holderPod is the pod in the lock's namespace that the live holder's
	// identity names (the part before the first "_"), when that pod exists.
	// The controller annotates and labels it (see docs/annotations.md).
	// +optional
	HolderPod string `json:"holderPod,omitempty"`

	// gatedPods is how many pods wait, gated, to run holding this lock
	// (annotation locks.frontdesk.dev/runs-holding and the scheduling gate
	// locks.frontdesk.dev/admission).
	// +optional
	GatedPods int32 `json:"gatedPods,omitempty"`

	// oldestGatedPod is the gated pod that has waited longest (by creation).
	// +optional
	OldestGatedPod string `json:"oldestGatedPod,omitempty"`

	// waiting is how many places the lock's queue held at the last status
	// change (waiters of the library and kubectl dlock, and gated pods the
	// controller queued). A registration alone writes no status: kubectl
	// dlock describe reads the queue itself.
	// +optional
	Waiting int32 `json:"waiting,omitempty"`

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
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it is the value of the locks.frontdesk.dev/lock label on the lock's Lease"
// +kubebuilder:validation:XValidation:rule="(has(self.spec) && has(self.spec.leaseName) && size(self.spec.leaseName) > 0 ? self.spec.leaseName : self.metadata.name) == (has(oldSelf.spec) && has(oldSelf.spec.leaseName) && size(oldSelf.spec.leaseName) > 0 ? oldSelf.spec.leaseName : oldSelf.metadata.name)",message="spec.leaseName is immutable (unset, it is the lock's own name): delete the lock and create one with the new leaseName"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.fencingToken) || (has(self.status) && has(self.status.fencingToken) && self.status.fencingToken >= oldSelf.status.fencingToken)",message="status.fencingToken must never decrease, and cannot be removed"
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder`
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.fencingToken`
// +kubebuilder:printcolumn:name="Held",type=string,JSONPath=`.status.conditions[?(@.type=="Held")].status`
// +kubebuilder:printcolumn:name="Lease",type=integer,JSONPath=`.spec.leaseDurationSeconds`,description="Lease duration in seconds: a holder that stops renewing lapses this long after its last renewal (renewals are not written to status)"
// +kubebuilder:printcolumn:name="Acquired",type=date,JSONPath=`.status.acquireTime`,description="When the current grant was made, as written by its grantor"
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.waiting`,priority=1,description="Places in the queue at the last status change"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="LeaseName",type=string,JSONPath=`.status.leaseName`,priority=1
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

// EffectivePodStartTimeout is spec.podStartTimeoutSeconds, or its default
// when unset.
func (l *DistributedLock) EffectivePodStartTimeout() time.Duration {
	if l.Spec.PodStartTimeoutSeconds > 0 {
		return time.Duration(l.Spec.PodStartTimeoutSeconds) * time.Second
	}
	return DefaultPodStartTimeoutSeconds * time.Second
}

// FailsOverOnProof reports whether a proven-dead holder's grant ends
// before its lease (spec.failover Proof, or unset for objects that
// bypassed apiserver defaulting).
func (l *DistributedLock) FailsOverOnProof() bool {
	return l.Spec.Failover != FailoverLease
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
