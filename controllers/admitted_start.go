package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// An admitted pod that does not start (no node fits it, its image never
// comes) would hold its lock for ever: the controller renews its grant
// until the pod is finished. So once it has been ungated for the lock's
// spec.podStartTimeoutSeconds, as the controller observed it, without
// being scheduled or any of its containers started, the controller deletes
// it, with preconditions on its UID and resourceVersion: a pod that was
// bound or started meanwhile is judged again, never deleted on an old
// reading. A pod deleted while unbound never ran, and its grant ends at
// once; a bound one is stopped by its kubelet, and its grant ends on that
// proof, or a lease duration after its node stopped reporting. Either way
// the grant ends only when the pod can no longer run with it: a deleted
// pod never starts later without the lock. (Only ending the grant, and
// leaving the pod, would let it start later, unfenced.)

// +kubebuilder:rbac:groups="",resources=pods,verbs=delete

// enforceStart deletes the admitted pod identity names once it has gone
// unstarted for the lock's start timeout, and returns how long until it
// is due otherwise (zero: nothing to wait for), and the event of a
// deletion.
func (r *DistributedLockReconciler) enforceStart(ctx context.Context, p *pass, pods []corev1.Pod,
	identity string) (time.Duration, *lockEvent, error) {
	lock, now := p.lock, p.now
	uid := locksv1alpha1.PodUIDOf(identity)
	pod := podByIdentity(pods, identity)
	if pod == nil || pod.DeletionTimestamp != nil || gated(pod) || podStarted(pod) {
		r.podNotes.clear("unstarted/" + uid)
		return 0, nil, nil
	}
	due := r.podNotes.sinceFirst("unstarted/"+uid, now).Add(lock.EffectivePodStartTimeout())
	if now.Before(due) {
		return due.Sub(now), nil, nil
	}
	where := "unscheduled"
	if pod.Spec.NodeName != "" {
		where = "on node " + pod.Spec.NodeName + " with no container started"
	}
	rv := pod.ResourceVersion
	err := r.Delete(ctx, &corev1.Pod{ObjectMeta: pod.ObjectMeta}, client.Preconditions{UID: &pod.UID, ResourceVersion: &rv})
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return time.Second, nil, nil // bound, started or gone meanwhile: judged again
	case err != nil:
		return 0, nil, fmt.Errorf("deleting admitted pod %s, which did not start: %w", pod.Name, err)
	}
	msg := fmt.Sprintf("pod %s did not start within %s of its admission (%s): deleted it; its grant ends once it is gone "+
		"(spec.podStartTimeoutSeconds)", pod.Name, lock.EffectivePodStartTimeout(), where)
	r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, EventPodStartTimedOut, "Admit", "%s", msg)
	return time.Second, &lockEvent{corev1.EventTypeWarning, EventPodStartTimedOut, msg}, nil
}

// podStarted reports whether the pod was scheduled and started: its phase
// is past Pending, or one of its containers (init containers included) runs
// or ran.
func podStarted(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
		return true
	}
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range statuses {
			if cs.State.Running != nil || cs.State.Terminated != nil {
				return true
			}
		}
	}
	return false
}
