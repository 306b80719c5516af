package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// A pod runs holding a lock only if it could have used the lock itself:
// whoever may create pods must not get the controller to hold a lock on a
// pod's behalf that the pod's ServiceAccount may not take. Before it queues
// a gated pod, the controller asks the apiserver (SubjectAccessReviews)
// whether the pod's ServiceAccount may read the lock and update its Lease,
// what frontdesk-lock-user grants; a pod whose ServiceAccount may not stays
// gated, with a warning saying what to bind. Answers are remembered for
// accessCheckInterval.

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// accessCheckInterval is how long an answer that a ServiceAccount may use a
// lock is remembered; deniedCheckInterval, one that it may not (a binding
// made after the pod's warning takes effect that much later at most).
const (
	accessCheckInterval = 30 * time.Second
	deniedCheckInterval = 5 * time.Second
)

// lockAccess remembers, per ServiceAccount and lock, whether the one may
// use the other, and since when.
type lockAccess struct {
	mu      sync.Mutex
	answers map[string]accessAnswer
}

type accessAnswer struct {
	allowed bool
	at      time.Time
}

func newLockAccess() *lockAccess { return &lockAccess{answers: map[string]accessAnswer{}} }

// podMayUseLock reports whether the pod's ServiceAccount may use lock,
// whose Lease is leaseName, and when to ask again if it may not.
func (r *DistributedLockReconciler) podMayUseLock(ctx context.Context, lock *locksv1alpha1.DistributedLock, leaseName string,
	pod *corev1.Pod, now time.Time) (bool, error) {
	sa := serviceAccountOf(pod)
	key := pod.Namespace + "/" + sa + "/" + lock.Name + "/" + leaseName
	r.access.mu.Lock()
	known, ok := r.access.answers[key]
	r.access.mu.Unlock()
	if ok && (known.allowed && now.Sub(known.at) < accessCheckInterval || !known.allowed && now.Sub(known.at) < deniedCheckInterval) {
		if !known.allowed {
			r.warnNotPermitted(lock, leaseName, pod, sa) // every pod refused, also on a remembered answer
		}
		return known.allowed, nil
	}
	allowed := true
	for _, attrs := range []authorizationv1.ResourceAttributes{
		{Namespace: lock.Namespace, Verb: "get", Group: locksv1alpha1.GroupVersion.Group, Resource: "distributedlocks", Name: lock.Name},
		{Namespace: lock.Namespace, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: leaseName},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + pod.Namespace + ":" + sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + pod.Namespace, "system:authenticated"},
			ResourceAttributes: &attrs,
		}}
		if err := r.Create(ctx, review); err != nil {
			return false, fmt.Errorf("asking whether ServiceAccount %s/%s may use lock %s: %w", pod.Namespace, sa, lock.Name, err)
		}
		allowed = allowed && review.Status.Allowed
	}
	r.access.mu.Lock()
	r.access.answers[key] = accessAnswer{allowed: allowed, at: now}
	for k, a := range r.access.answers {
		if now.Sub(a.at) > 10*accessCheckInterval {
			delete(r.access.answers, k)
		}
	}
	r.access.mu.Unlock()
	if !allowed {
		r.warnNotPermitted(lock, leaseName, pod, sa)
	}
	return allowed, nil
}

// warnNotPermitted warns the pod, once, that its ServiceAccount sa may not
// use the lock.
func (r *DistributedLockReconciler) warnNotPermitted(lock *locksv1alpha1.DistributedLock, leaseName string, pod *corev1.Pod, sa string) {
	r.warnPodOnce(pod, string(pod.UID)+"/access/"+lock.Name, EventNotPermitted, fmt.Sprintf(
		"ServiceAccount %s may not use DistributedLock %s (get the lock, update its Lease %s), so the pod cannot run holding it: "+
			"it stays gated. Bind frontdesk-lock-user to it: kubectl create rolebinding %s-locks -n %s --clusterrole=frontdesk-lock-user "+
			"--serviceaccount=%s:%s", sa, lock.Name, leaseName, sa, pod.Namespace, pod.Namespace, sa))
}
