package testutil

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// MakePod returns a minimal pod with the given labels, a participant
// (locks.frontdesk.dev/participant=true: the pods frontdesk watches), that
// runs as ServiceAccount "default" (what a cluster's ServiceAccount
// admission sets; a token bound to the pod is that ServiceAccount's). No
// kubelet runs in the tests: drive its status with SetPodReady.
func MakePod(name, namespace string, labels map[string]string) *corev1.Pod {
	all := map[string]string{locksv1alpha1.ParticipantLabel: "true"}
	maps.Copy(all, labels)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: all},
		Spec: corev1.PodSpec{ServiceAccountName: "default",
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}
}

// SetPodReady sets the pod's phase to Running and its Ready condition.
func SetPodReady(pod *corev1.Pod, ready bool) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
}

// MakeGatedPod returns a participant pod that runs holding lockName: the
// locks.frontdesk.dev/runs-holding annotation, the admission scheduling
// gate, and $FENCING_TOKEN from its token annotation.
func MakeGatedPod(name, namespace, lockName string) *corev1.Pod {
	pod := MakePod(name, namespace, nil)
	pod.Annotations = map[string]string{locksv1alpha1.RunsHoldingAnnotation: lockName}
	pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: locksv1alpha1.AdmissionGate}}
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "FENCING_TOKEN", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + locksv1alpha1.TokenAnnotationKey(lockName) + "']"}}}}
	return pod
}
