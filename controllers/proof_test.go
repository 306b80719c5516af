package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// finishedPod is a pod of the given phase whose one application container
// has the given state.
func finishedPod(phase corev1.PodPhase, state corev1.ContainerState) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "ns", UID: "u1"},
		Spec:       corev1.PodSpec{ServiceAccountName: "app", Containers: []corev1.Container{{Name: "app"}}},
		Status: corev1.PodStatus{Phase: phase,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", State: state}}},
	}
}

var (
	terminated = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}
	running    = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	waiting    = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
)

func TestFinishedIsOnlyTheKubeletsReportOfATerminalPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  func() *corev1.Pod
		want bool
	}{
		{"failed, its container terminated", func() *corev1.Pod { return finishedPod(corev1.PodFailed, terminated) }, true},
		{"succeeded, its container terminated", func() *corev1.Pod { return finishedPod(corev1.PodSucceeded, terminated) }, true},
		{"running with its container terminated (it may restart)", func() *corev1.Pod { return finishedPod(corev1.PodRunning, terminated) }, false},
		{"failed with its container still running (the pod garbage collector)", func() *corev1.Pod { return finishedPod(corev1.PodFailed, running) }, false},
		{"failed with its container waiting (it may have restarted since)", func() *corev1.Pod { return finishedPod(corev1.PodFailed, waiting) }, false},
		{"failed with no container status", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Status.ContainerStatuses = nil
			return p
		}, false},
		{"failed, marked by the pod garbage collector", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC"}}
			return p
		}, false},
		{"failed, evicted by the kubelet", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TerminationByKubelet"}}
			return p
		}, true},
		{"a second container without a status", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar"})
			return p
		}, false},
		{"a sidecar still running", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Spec.InitContainers = []corev1.Container{{Name: "proxy"}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", State: running}}
			return p
		}, false},
		{"an init container that never ran", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Spec.InitContainers = []corev1.Container{{Name: "setup"}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "setup", State: waiting}}
			return p
		}, false},
		{"init container and sidecar terminated too", func() *corev1.Pod {
			p := finishedPod(corev1.PodSucceeded, terminated)
			p.Spec.InitContainers = []corev1.Container{{Name: "setup"}, {Name: "proxy"}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "setup", State: terminated}, {Name: "proxy", State: terminated}}
			return p
		}, true},
		{"an ephemeral container still running", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug"}}}
			p.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debug", State: running}}
			return p
		}, false},
		{"an ephemeral container without a status", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug"}}}
			return p
		}, false},
		{"a pod with no containers", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Spec.Containers, p.Status.ContainerStatuses = nil, nil
			return p
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := finished(tc.pod()); got != tc.want {
				t.Errorf("finished = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDeathsAreRememberedForTheirPodsServiceAccountAndForAWhile(t *testing.T) {
	start := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	d := newDeaths()
	pod := finishedPod(corev1.PodFailed, terminated)
	user := "user=system:serviceaccount:ns:app"
	if d.deleted(pod.UID, user, start) {
		t.Fatal("a pod never seen deleted is proven dead")
	}
	d.note(pod, start)
	if !d.deleted(pod.UID, user, start.Add(deathRetention)) {
		t.Error("a pod seen deleted finished is not proven dead within the retention")
	}
	if d.deleted(pod.UID, "user=system:serviceaccount:ns:other", start) {
		t.Error("a death is proven for a principal of another ServiceAccount")
	}
	if d.deleted("u2", user, start) {
		t.Error("a death is proven for another UID")
	}
	if d.deleted(pod.UID, user, start.Add(deathRetention+time.Second)) {
		t.Error("a death is still proven after the retention")
	}
	other := finishedPod(corev1.PodFailed, terminated)
	other.UID = "u3"
	d.note(other, start.Add(deathRetention+time.Second))
	if _, kept := d.of[pod.UID]; kept {
		t.Error("a note older than the retention was not forgotten when another was taken")
	}
	defaulted := finishedPod(corev1.PodFailed, terminated)
	defaulted.Spec.ServiceAccountName = ""
	if got := serviceAccountUser(defaulted); got != "user=system:serviceaccount:ns:default" {
		t.Errorf("serviceAccountUser without a ServiceAccount = %q, want the namespace's default", got)
	}
}
