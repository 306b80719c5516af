package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch;update

// holderPodName is the pod the live holder's identity names, if it exists
// in the lock's namespace, is not terminating, has the UID the identity
// carries ("<pod>_<uid>[_<suffix>]") and is the holder: the controller holds
// the grant for it (controllerGrant: candidates mode, where the lock's own
// selector chose it, or an admitted pod), or the grant is bound to that
// very pod (its principal, from the token the pod's ServiceAccount got
// bound to it, names the pod's UID) and the pod consents (it lists the lock
// in its locks.frontdesk.dev/may-hold annotation). "" otherwise. An
// identity is a name anyone can write: a participant that holds the lock
// under another pod's identity gets that pod no marks, and refused says
// why, once per grant. A holder whose grant token is below the highest
// token seen (a newer grant is on its way) gets no pod: its marks would
// carry a token that is not its own.
func (r *DistributedLockReconciler) holderPodName(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	st *locksv1alpha1.DistributedLockStatus, grant grantOwner) (name string, refused *lockEvent, err error) {
	uid := locksv1alpha1.PodUIDOf(st.Holder)
	if uid == "" || !meta.IsStatusConditionTrue(st.Conditions, locksv1alpha1.ConditionHeld) || grant.token < st.FencingToken {
		return "", nil, nil
	}
	pod := &corev1.Pod{}
	podName := locksv1alpha1.PodNameOf(st.Holder)
	if err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: podName}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil, nil
		}
		return "", nil, fmt.Errorf("reading holder pod %s: %w", podName, err)
	}
	if pod.DeletionTimestamp != nil || string(pod.UID) != uid || !grant.controllers && !locksv1alpha1.MayHold(pod.Annotations, lock.Name) {
		return "", nil, nil
	}
	if !grant.controllers && lease.PrincipalPodUID(grant.principal) != uid {
		return "", r.notMarkedOnce(lock, pod, st.Holder, grant), nil
	}
	return pod.Name, nil, nil
}

// grantOwner is what the live grant says of who holds it: its token, its
// principal (locks.frontdesk.dev/holder-principal), and whether the
// controller holds it on a pod's behalf.
type grantOwner struct {
	token       int64
	principal   string
	controllers bool
}

// notMarkedOnce is the warning that pod is not marked as the holder whose
// identity names it, because the grant is bound to another principal: once
// per grant.
func (r *DistributedLockReconciler) notMarkedOnce(lock *locksv1alpha1.DistributedLock, pod *corev1.Pod, holder string, grant grantOwner) *lockEvent {
	if !r.podNotes.firstWarning(fmt.Sprintf("%s/notmarked/%s/%d", pod.UID, lock.Name, grant.token)) {
		return nil
	}
	bound := grant.principal
	if bound == "" {
		bound = "no principal"
	}
	return &lockEvent{corev1.EventTypeWarning, EventPodNotMarked, fmt.Sprintf(
		"holder %s (fencing token %d) names pod %s, but its grant is bound to %s, not to that pod (pod=%s): the pod is not marked as the holder; "+
			"a pod is marked only for a grant its own ServiceAccount token made", holder, grant.token, pod.Name, bound, pod.UID)}
}

// markHolderPod puts the lock's label and annotations (with the holder's
// grant token) on the holder pod and takes them off every other pod. The old
// holders are cleared first, so a Service never selects two holders: the
// previously recorded holder pod by a patch that does not depend on the
// cache (which may not show its label yet), the others as the cache lists
// them.
func (r *DistributedLockReconciler) markHolderPod(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	previousPod string, st *locksv1alpha1.DistributedLockStatus, grantToken int64) error {
	if previousPod != "" && previousPod != st.HolderPod {
		if err := r.clearPodMarks(ctx, lock, previousPod); err != nil {
			return err
		}
	}
	if err := r.clearOtherPodMarks(ctx, lock, st.HolderPod); err != nil {
		return err
	}
	if st.HolderPod == "" {
		return nil
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: st.HolderPod}, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	marks := map[string]string{locksv1alpha1.TokenAnnotationKey(lock.Name): strconv.FormatInt(grantToken, 10)}
	if st.AcquireTime != nil {
		marks[locksv1alpha1.AcquiredAnnotationKey(lock.Name)] = st.AcquireTime.UTC().Format(time.RFC3339Nano)
	}
	return r.patchPodMarks(ctx, pod, lock.Name, marks)
}

// clearOtherPodMarks removes the lock's marks from every pod the cache
// lists as marked, except keep.
func (r *DistributedLockReconciler) clearOtherPodMarks(ctx context.Context, lock *locksv1alpha1.DistributedLock, keep string) error {
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
		if pod := &marked.Items[i]; pod.Name != keep {
			if err := r.patchPodMarks(ctx, pod, lock.Name, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// clearAllPodMarks removes the lock's marks from every pod (the lock is
// going away): the recorded holder pod by a patch that does not depend on
// the cache, the others as the cache lists them.
func (r *DistributedLockReconciler) clearAllPodMarks(ctx context.Context, lock *locksv1alpha1.DistributedLock) error {
	if lock.Status.HolderPod != "" {
		if err := r.clearPodMarks(ctx, lock, lock.Status.HolderPod); err != nil {
			return err
		}
	}
	return r.clearOtherPodMarks(ctx, lock, "")
}

// clearPodMarks removes the lock's label and annotations from the named pod
// with a merge patch that always sends the removals.
func (r *DistributedLockReconciler) clearPodMarks(ctx context.Context, lock *locksv1alpha1.DistributedLock, podName string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]any{locksv1alpha1.HolderLabelKey(lock.Name): nil},
		"annotations": map[string]any{
			locksv1alpha1.TokenAnnotationKey(lock.Name):    nil,
			locksv1alpha1.AcquiredAnnotationKey(lock.Name): nil,
		},
	}})
	if err != nil {
		return err
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: podName}}
	if err := r.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("clearing pod %s of lock %s: %w", podName, lock.Name, err)
	}
	return nil
}

// patchPodMarks sets the lock's label and the given annotations on pod, or
// removes them all when annotations is nil. It writes only on a change.
// Setting them is conditional on pod's UID (pod comes from the cache, where
// the UID was checked): a pod of the same name that replaced it is not
// marked with a grant that is not its own. Removing them is not: marks
// must go from whichever pod has the name.
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
		maps.Copy(patched.Annotations, annotations)
	}
	if labels.Equals(pod.Labels, patched.Labels) && labels.Equals(pod.Annotations, patched.Annotations) {
		return nil
	}
	patch := client.MergeFrom(pod)
	if annotations != nil {
		// A merge patch that carries the UID: the apiserver refuses it
		// when the pod of that name has another one.
		withUID := pod.DeepCopy()
		withUID.UID = ""
		patch = client.MergeFrom(withUID)
	}
	err := r.Patch(ctx, patched, patch)
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	case uidRefused(err):
		return fmt.Errorf("not marking pod %s for lock %s: a pod of that name with another UID replaced UID %s "+
			"(the next pass reads it afresh): %w", pod.Name, lockName, pod.UID, err)
	}
	return fmt.Errorf("marking pod %s for lock %s: %w", pod.Name, lockName, err)
}

// uidRefused reports whether err is the apiserver refusing a patch because
// it would change metadata.uid: the object of that name has another UID.
func uidRefused(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	return slices.ContainsFunc(status.Status().Details.Causes, func(c metav1.StatusCause) bool { return c.Field == "metadata.uid" })
}
