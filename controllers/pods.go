package controllers

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// holderPodName is the pod the live holder's identity names, if it exists
// in the lock's namespace and is not terminating; "" otherwise.
func (r *DistributedLockReconciler) holderPodName(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	st *locksv1alpha1.DistributedLockStatus) (string, error) {
	if st.Holder == "" || !meta.IsStatusConditionTrue(st.Conditions, locksv1alpha1.ConditionHeld) {
		return "", nil
	}
	pod := &corev1.Pod{}
	name := locksv1alpha1.PodNameOf(st.Holder)
	if err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: name}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("reading holder pod %s: %w", name, err)
	}
	if pod.DeletionTimestamp != nil {
		return "", nil
	}
	return pod.Name, nil
}

// markHolderPod puts the lock's label and annotations on the holder pod and
// takes them off every other pod. The old holder is cleared first, so a
// Service never selects two holders.
func (r *DistributedLockReconciler) markHolderPod(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	st *locksv1alpha1.DistributedLockStatus) error {
	key := locksv1alpha1.HolderLabelKey(lock.Name)
	exists, err := labels.NewRequirement(key, selection.Exists, nil)
	if err != nil {
		return fmt.Errorf("building selector for %s: %w", key, err)
	}
	var marked corev1.PodList
	if err := r.List(ctx, &marked, client.InNamespace(lock.Namespace),
		client.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*exists)}); err != nil {
		return fmt.Errorf("listing pods marked as holders: %w", err)
	}
	for i := range marked.Items {
		if pod := &marked.Items[i]; pod.Name != st.HolderPod {
			if err := r.patchPodMarks(ctx, pod, lock.Name, nil); err != nil {
				return err
			}
		}
	}
	if st.HolderPod == "" {
		return nil
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: st.HolderPod}, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	marks := map[string]string{locksv1alpha1.TokenAnnotationKey(lock.Name): strconv.FormatInt(st.FencingToken, 10)}
	if st.AcquireTime != nil {
		marks[locksv1alpha1.AcquiredAnnotationKey(lock.Name)] = st.AcquireTime.UTC().Format(time.RFC3339Nano)
	}
	return r.patchPodMarks(ctx, pod, lock.Name, marks)
}

// patchPodMarks sets the lock's label and the given annotations on pod, or
// removes them all when annotations is nil. It writes only on a change.
func (r *DistributedLockReconciler) patchPodMarks(ctx context.Context, pod *corev1.Pod, lockName string, annotations map[string]string) error {
	patched := pod.DeepCopy()
	labelKey := locksv1alpha1.HolderLabelKey(lockName)
	tokenKey, acquiredKey := locksv1alpha1.TokenAnnotationKey(lockName), locksv1alpha1.AcquiredAnnotationKey(lockName)
	if annotations == nil {
		delete(patched.Labels, labelKey)
		delete(patched.Annotations, tokenKey)
		delete(patched.Annotations, acquiredKey)
	} else {
		if patched.Labels == nil {
			patched.Labels = map[string]string{}
		}
		if patched.Annotations == nil {
			patched.Annotations = map[string]string{}
		}
		patched.Labels[labelKey] = "true"
		for k, v := range annotations {
			patched.Annotations[k] = v
		}
	}
	if labels.Equals(pod.Labels, patched.Labels) && labels.Equals(pod.Annotations, patched.Annotations) {
		return nil
	}
	if err := r.Patch(ctx, patched, client.MergeFrom(pod)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("marking pod %s for lock %s: %w", pod.Name, lockName, err)
	}
	return nil
}
