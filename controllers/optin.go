package controllers

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// Pods that opt in to admission wrongly get a Warning event each, once per
// pod and mistake (this process's memory): the gate without a lock named,
// a lock named that does not exist (the pod stays gated, and is admitted
// once the lock exists), a lock named without the gate (the pod cannot be
// held back, so it is not admitted as a holder).

// missingLockWarning is the warning key of a gated pod naming lock, which
// does not exist.
func missingLockWarning(uid types.UID, lock string) string { return string(uid) + "/missing/" + lock }

// warnOptInMistakes warns about pod's opt-in mistakes, given the locks of
// its namespace.
func (r *DistributedLockReconciler) warnOptInMistakes(pod *corev1.Pod, locks []locksv1alpha1.DistributedLock) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	name := pod.Annotations[locksv1alpha1.RunsHoldingAnnotation]
	exists := slices.ContainsFunc(locks, func(l locksv1alpha1.DistributedLock) bool { return l.Name == name })
	switch {
	case gated(pod) && name == "":
		r.warnPodOnce(pod, string(pod.UID)+"/unnamed", EventNoLockNamed, fmt.Sprintf(
			"the pod carries the scheduling gate %s but no %s annotation: it stays gated; name the lock to run holding, or remove the gate",
			locksv1alpha1.AdmissionGate, locksv1alpha1.RunsHoldingAnnotation))
	case gated(pod) && !exists:
		r.warnPodOnce(pod, missingLockWarning(pod.UID, name), EventLockMissing, fmt.Sprintf(
			"DistributedLock %s (annotation %s) does not exist in namespace %s: the pod stays gated until it does",
			name, locksv1alpha1.RunsHoldingAnnotation, pod.Namespace))
	case name != "" && !gated(pod) && pod.Annotations[locksv1alpha1.TokenAnnotationKey(name)] == "":
		r.warnPodOnce(pod, string(pod.UID)+"/ungated/"+name, EventNotGated, fmt.Sprintf(
			"the pod names lock %s in %s but carries no scheduling gate %s: it cannot be held back, so it is not admitted as a holder; "+
				"add the gate to the pod template", name, locksv1alpha1.RunsHoldingAnnotation, locksv1alpha1.AdmissionGate))
	}
}

// warnPodOnce records a Warning event on pod unless one with key was sent.
func (r *DistributedLockReconciler) warnPodOnce(pod *corev1.Pod, key, reason, msg string) {
	if r.podNotes.firstWarning(key) {
		r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, reason, "Admit", "%s", msg)
	}
}

// warnWaitingForMissingLock warns each gated pod that names the lock key,
// which does not exist (it was deleted): the pods stay gated.
func (r *DistributedLockReconciler) warnWaitingForMissingLock(ctx context.Context, key types.NamespacedName) error {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(key.Namespace)); err != nil {
		return fmt.Errorf("listing pods waiting for lock %s: %w", key.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Annotations[locksv1alpha1.RunsHoldingAnnotation] == key.Name && waitingForAdmission(p) {
			r.warnPodOnce(p, missingLockWarning(p.UID, key.Name), EventLockMissing, fmt.Sprintf(
				"DistributedLock %s does not exist (it was deleted): the pod stays gated until a lock of that name exists", key.Name))
		}
	}
	return nil
}

// setGatedPods shows the pods waiting gated in status: how many, and the
// oldest.
func setGatedPods(st *locksv1alpha1.DistributedLockStatus, waiting []corev1.Pod) {
	st.GatedPods, st.OldestGatedPod = int32(len(waiting)), ""
	if len(waiting) > 0 {
		st.OldestGatedPod = waiting[0].Name
	}
}
