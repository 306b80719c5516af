package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// phaseBy is the managed-fields entry of manager's status write that set
// the phase.
func phaseBy(manager string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status",
		FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:containerStatuses":{},"f:phase":{}}}`)}
}

// finishedPod is a pod of the given phase, as the kubelet set it, whose one
// application container has the given state.
func finishedPod(phase corev1.PodPhase, state corev1.ContainerState) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "ns", UID: "u1",
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
					FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{}}}`)},
				phaseBy("kubelet"),
			}},
		Spec: corev1.PodSpec{ServiceAccountName: "app", Containers: []corev1.Container{{Name: "app"}}},
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
		{"Failed as the pod garbage collector set it, over the kubelet's terminated statuses", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.ManagedFields = []metav1.ManagedFieldsEntry{phaseBy("PodGC")}
			return p
		}, false},
		{"Failed with no record of who set the phase", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.ManagedFields = nil
			return p
		}, false},
		{"the kubelet manages the status but not the phase", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.ManagedFields = []metav1.ManagedFieldsEntry{phaseBy("PodGC"), {Manager: "kubelet", Subresource: "status",
				FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:containerStatuses":{}}}`)}}
			return p
		}, false},
		{"the kubelet and another manager share the phase", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.ManagedFields = append(p.ManagedFields, phaseBy("PodGC"))
			return p
		}, true},
		{"terminated as ContainerStatusUnknown (the kubelet's guess)", func() *corev1.Pod {
			return finishedPod(corev1.PodFailed, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown"}})
		}, false},
		{"a status for another container than the spec's", func() *corev1.Pod {
			p := finishedPod(corev1.PodFailed, terminated)
			p.Status.ContainerStatuses[0].Name = "other"
			return p
		}, false},
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
	if _, ok := d.deleted(pod.UID, user, start); ok {
		t.Fatal("a pod never seen deleted is proven dead")
	}
	if got := d.sawFinished(pod, start); got.finishedSince != start {
		t.Errorf("finished since %v, want %v", got.finishedSince, start)
	}
	if got := d.sawFinished(pod, start.Add(time.Minute)); got.finishedSince != start {
		t.Errorf("a second sighting moved finished-since to %v, want the first, %v", got.finishedSince, start)
	}
	if _, ok := d.deleted(pod.UID, user, start); ok {
		t.Error("a finished pod not deleted is proven deleted")
	}
	deletedAt := start.Add(2 * time.Minute)
	d.sawDeleted(pod, true, deletedAt)
	if got, ok := d.deleted(pod.UID, user, deletedAt.Add(deathRetention)); !ok || got.finishedSince != start {
		t.Errorf("a pod seen deleted finished: %+v, %v; want proven, finished since %v", got, ok, start)
	}
	if _, ok := d.deleted(pod.UID, "user=system:serviceaccount:ns:other", deletedAt); ok {
		t.Error("a death is proven for a principal of another ServiceAccount")
	}
	if _, ok := d.deleted("u2", user, deletedAt); ok {
		t.Error("a death is proven for another UID")
	}
	if _, ok := d.deleted(pod.UID, user, deletedAt.Add(deathRetention+time.Second)); ok {
		t.Error("a death is still proven after the retention")
	}
	other := finishedPod(corev1.PodFailed, terminated)
	other.UID = "u3"
	d.sawDeleted(other, false, deletedAt.Add(deathRetention+time.Second))
	if _, kept := d.of[pod.UID]; kept {
		t.Error("a deletion older than the retention was not forgotten when another was noted")
	}
	d.sawFinished(other, start)
	d.sawDeleted(other, false, start)
	if _, kept := d.of[other.UID]; kept {
		t.Error("a pod deleted without proof (a tombstone) is still noted finished")
	}
	defaulted := finishedPod(corev1.PodFailed, terminated)
	defaulted.Spec.ServiceAccountName = ""
	if got := serviceAccountUser(defaulted); got != "user=system:serviceaccount:ns:default" {
		t.Errorf("serviceAccountUser without a ServiceAccount = %q, want the namespace's default", got)
	}
}

func TestTheFirstSightingOfATerminalPhaseSaysWhoSetIt(t *testing.T) {
	start := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	ph := newPhases()
	running := finishedPod(corev1.PodRunning, running)
	if !ph.saw(running) || !ph.noted(running) {
		t.Error("a pod not terminal is judged as set by another manager")
	}
	byKubelet := finishedPod(corev1.PodFailed, terminated)
	byKubelet.UID = "by-kubelet"
	if ph.noted(byKubelet) {
		t.Error("a terminal phase no handler noted yet counts as the kubelet's for a pass")
	}
	if !ph.saw(byKubelet) || !ph.noted(byKubelet) {
		t.Error("a phase first seen set by the kubelet is not judged the kubelet's")
	}
	byGC := finishedPod(corev1.PodFailed, terminated)
	byGC.ManagedFields = []metav1.ManagedFieldsEntry{phaseBy("PodGC")}
	if ph.saw(byGC) {
		t.Error("a phase first seen set by the pod garbage collector is judged the kubelet's")
	}
	forged := byGC.DeepCopy()
	forged.ManagedFields = append(forged.ManagedFields, phaseBy("kubelet")) // an entry added by hand
	if ph.saw(forged) || ph.noted(forged) || ph.verdict(forged) {
		t.Error("an entry naming the kubelet added after the first sighting changed the verdict")
	}
	if ph.forget(forged, start) {
		t.Error("forget reports the kubelet for a phase first seen set by another manager")
	}
	if ph.forget(forged, start.Add(time.Second)) {
		t.Error("the other cache's forget of the same deletion reports the kubelet")
	}
	if ph.saw(forged) || ph.verdict(forged) {
		t.Error("a late event of the deleted pod (the other cache's) is judged anew")
	}
	gone := finishedPod(corev1.PodFailed, terminated)
	gone.UID = "never-seen"
	if !ph.forget(gone, start.Add(deathRetention+time.Second)) {
		t.Error("a pod never seen terminal is not judged by what its final state shows")
	}
	if _, kept := ph.of[forged.UID]; kept {
		t.Error("the note of a pod deleted longer than the retention ago was kept")
	}
}
