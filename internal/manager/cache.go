package manager

import (
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cacheOptions keeps the informer cache to what the controller reads.
// managedFields are never read: not caching them saves a good part of the
// memory per lock, Lease and pod. Pods are watched cluster-wide (candidates
// mode, holder marks), so they are cached slim.
func cacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: slimPod}},
	}
}

// slimPod is the cache transform for pods: it keeps the metadata (without
// managedFields), status.phase and status.conditions, which is all the
// controller reads, and drops the spec and the rest of the status. Pods
// are only ever patched by the controller (annotations and labels, by merge
// patch), never updated whole, so the cached copies need no more. Other
// objects, such as cache tombstones, pass through unchanged.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	pod.ManagedFields = nil
	pod.Spec = corev1.PodSpec{}
	pod.Status = corev1.PodStatus{Phase: pod.Status.Phase, Conditions: pod.Status.Conditions}
	return pod, nil
}
