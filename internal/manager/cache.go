package manager

import (
	"net/http"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
)

// cacheOptions keeps the informer cache to what the controller reads, so
// that the manager does not watch the whole cluster:
//   - Leases that carry the lock label only (the Leases of locks and their
//     records), not node heartbeats or other controllers' leader election;
//     a Lease a lock is about to adopt is read from the apiserver;
//   - pods labelled locks.frontdesk.dev/participant=true only (candidates and
//     pods that may be marked as holders), cached slim;
//   - managedFields of nothing: never read, a good part of each object.
func cacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:           {Label: labels.SelectorFromSet(labels.Set{locksv1alpha1.ParticipantLabel: "true"}), Transform: slimPod},
			&coordinationv1.Lease{}: {Label: labels.NewSelector().Add(mustRequirement(locksv1alpha1.LockNameLabel, selection.Exists))},
		},
	}
}

// slimStatuses are the container statuses with only each one's name, and
// whether it runs (since when) or terminated (its exit code and reason).
func slimStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	if in == nil {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(in))
	for i, cs := range in {
		out[i] = corev1.ContainerStatus{Name: cs.Name}
		if r := cs.State.Running; r != nil {
			out[i].State.Running = &corev1.ContainerStateRunning{StartedAt: r.StartedAt}
		}
		if t := cs.State.Terminated; t != nil {
			out[i].State.Terminated = &corev1.ContainerStateTerminated{ExitCode: t.ExitCode, Reason: t.Reason}
		}
	}
	return out
}

func mustRequirement(key string, op selection.Operator, values ...string) labels.Requirement {
	r, err := labels.NewRequirement(key, op, values)
	if err != nil {
		panic(err) // a constant key and operator
	}
	return *r
}

// slimPod is the cache transform for pods: it keeps the metadata (of
// managedFields, only who set status.phase: phaseManagers), status.phase and status.conditions, the spec's nodeName,
// schedulingGates and serviceAccountName (whose access to a lock the
// controller checks before it admits a pod), and of each container its
// name and whether its status (and each init container's) says it started
// or terminated (that an admitted pod started; the proof that it stopped),
// which is all the controller reads, and drops the rest of the spec and
// status. The controller patches pods (marks, by
// merge patch) or updates a pod it read from the apiserver (admission),
// never a cached copy, so the cached copies need no more. Other
// objects, such as cache tombstones, pass through unchanged.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	pod.ManagedFields = phaseManagers(pod)
	containers := make([]corev1.Container, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		containers[i] = corev1.Container{Name: c.Name}
	}
	pod.Spec = corev1.PodSpec{NodeName: pod.Spec.NodeName, SchedulingGates: pod.Spec.SchedulingGates, Containers: containers,
		ServiceAccountName: pod.Spec.ServiceAccountName}
	pod.Status = corev1.PodStatus{Phase: pod.Status.Phase, Conditions: pod.Status.Conditions,
		ContainerStatuses: slimStatuses(pod.Status.ContainerStatuses), InitContainerStatuses: slimStatuses(pod.Status.InitContainerStatuses)}
	return pod, nil
}

// holderPodCacheOptions is the cache of every pod that the controller
// reads to prove a holder dead (controllers' HolderPods): all pods, since a
// grant's pod need not be labelled, each kept to what the proof reads
// (holderPod).
func holderPodCacheOptions(scheme *runtime.Scheme, mapper meta.RESTMapper, httpClient *http.Client) cache.Options {
	return cache.Options{
		Scheme:     scheme,
		Mapper:     mapper,
		HTTPClient: httpClient,
		ByObject:   map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: holderPod}},
	}
}

// holderPod is the cache transform of the holder-pod cache: of a pod it
// keeps its name, namespace, UID, resourceVersion and deletion timestamp,
// who set its phase (phaseManagers),
// its ServiceAccount, the names of its containers (init, application,
// ephemeral), its phase, its DisruptionTarget condition, and whether each
// container's status says it runs or terminated; no labels, annotations
// or the rest of the spec. Other objects, such as cache tombstones, pass
// through unchanged.
func holderPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, DeletionTimestamp: pod.DeletionTimestamp, ManagedFields: phaseManagers(pod)},
		Spec: corev1.PodSpec{ServiceAccountName: pod.Spec.ServiceAccountName,
			InitContainers:      make([]corev1.Container, len(pod.Spec.InitContainers)),
			Containers:          make([]corev1.Container, len(pod.Spec.Containers)),
			EphemeralContainers: make([]corev1.EphemeralContainer, len(pod.Spec.EphemeralContainers))},
		Status: corev1.PodStatus{Phase: pod.Status.Phase,
			InitContainerStatuses:      slimStatuses(pod.Status.InitContainerStatuses),
			ContainerStatuses:          slimStatuses(pod.Status.ContainerStatuses),
			EphemeralContainerStatuses: slimStatuses(pod.Status.EphemeralContainerStatuses)},
	}
	for i, c := range pod.Spec.InitContainers {
		slim.Spec.InitContainers[i].Name = c.Name
	}
	for i, c := range pod.Spec.Containers {
		slim.Spec.Containers[i].Name = c.Name
	}
	for i, c := range pod.Spec.EphemeralContainers {
		slim.Spec.EphemeralContainers[i].Name = c.Name
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			slim.Status.Conditions = append(slim.Status.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason})
		}
	}
	return slim, nil
}

// phaseFields is what phaseManagers keeps of a managed-fields entry.
var phaseFields = metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`)

// phaseManagers are the entries of pod's managedFields that own
// status.phase, each with only that field: the controller proves a pod
// finished only if the kubelet set its phase.
func phaseManagers(pod *corev1.Pod) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for _, e := range pod.ManagedFields {
		if controllers.OwnsPodPhase(e) {
			out = append(out, metav1.ManagedFieldsEntry{Manager: e.Manager, Operation: e.Operation, Subresource: e.Subresource,
				FieldsType: e.FieldsType, FieldsV1: phaseFields})
		}
	}
	return out
}
