package manager

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
)

func TestSlimPodKeepsWhatTheControllerReads(t *testing.T) {
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	meta := metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: "u1", ResourceVersion: "7",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"},
		DeletionTimestamp: &metav1.Time{}, Finalizers: []string{"f"}}
	full := &corev1.Pod{
		ObjectMeta: *meta.DeepCopy(),
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "app:1"}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: "g"}}, ServiceAccountName: "billing", Hostname: "h"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: ready, PodIP: "10.0.0.1", HostIP: "10.1.0.1",
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Image: "app:1", ContainerID: "c1",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error", Message: "long"}}}}},
	}
	full.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{}}}`)},
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status",
			FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:containerStatuses":{},"f:phase":{}}}`)},
	}

	got, err := slimPod(full)
	if err != nil {
		t.Fatal(err)
	}
	pod := got.(*corev1.Pod)
	meta.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status",
		FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`)}}
	if !apiequality.Semantic.DeepEqual(pod.ObjectMeta, meta) {
		t.Errorf("metadata changed beyond managedFields (of which only who set the phase stays):\n got %+v\nwant %+v", pod.ObjectMeta, meta)
	}
	if pod.Status.Phase != corev1.PodRunning || !apiequality.Semantic.DeepEqual(pod.Status.Conditions, ready) {
		t.Errorf("status = %+v, want phase Running and the Ready condition", pod.Status)
	}
	want := corev1.PodSpec{NodeName: "n1", SchedulingGates: []corev1.PodSchedulingGate{{Name: "g"}},
		Containers: []corev1.Container{{Name: "app"}}, ServiceAccountName: "billing"}
	if !apiequality.Semantic.DeepEqual(pod.Spec, want) || pod.Status.PodIP != "" || pod.Status.HostIP != "" {
		t.Errorf("spec %+v (but nodeName, schedulingGates, serviceAccountName and container names) and status %+v should be dropped", pod.Spec, pod.Status)
	}
	wantStatuses := []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"}}}}
	if !apiequality.Semantic.DeepEqual(pod.Status.ContainerStatuses, wantStatuses) {
		t.Errorf("container statuses %+v, want each container's name and whether it terminated (exit code and reason)", pod.Status.ContainerStatuses)
	}
}

func TestSlimPodPassesOtherObjectsThrough(t *testing.T) {
	for _, obj := range []any{
		cache.DeletedFinalStateUnknown{Key: "shop/web-0"},
		&corev1.ConfigMap{Data: map[string]string{"k": "v"}},
	} {
		got, err := slimPod(obj)
		if err != nil {
			t.Fatal(err)
		}
		if !apiequality.Semantic.DeepEqual(got, obj) {
			t.Errorf("slimPod(%T) = %+v, want it unchanged", obj, got)
		}
	}
}

// The manager caches only the Leases of locks and participant pods.
func TestCacheIsScopedToFrontdeskObjects(t *testing.T) {
	opts := cacheOptions()
	for obj, want := range map[string]map[string]bool{
		"pod": {
			"locks.frontdesk.dev/participant=true":  true,
			"locks.frontdesk.dev/participant=false": false,
			"app=web":                               false,
		},
		"lease": {
			"locks.frontdesk.dev/lock=billing": true,
			"component=kubelet":                false,
		},
	} {
		var sel labels.Selector
		for o, by := range opts.ByObject {
			switch o.(type) {
			case *corev1.Pod:
				if obj == "pod" {
					sel = by.Label
				}
			case *coordinationv1.Lease:
				if obj == "lease" {
					sel = by.Label
				}
			}
		}
		if sel == nil {
			t.Fatalf("no label selector for %s", obj)
		}
		for set, match := range want {
			l, err := labels.ConvertSelectorToLabelsMap(set)
			if err != nil {
				t.Fatal(err)
			}
			if got := sel.Matches(l); got != match {
				t.Errorf("%s cache selector %q on %s: %v, want %v", obj, sel, set, got, match)
			}
		}
	}
}

func TestHolderPodKeepsWhatTheProofReads(t *testing.T) {
	gc := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC", Message: "long"}
	terminated := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}
	phase := func(manager string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status",
			FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`)}
	}
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "shop", UID: "u1", ResourceVersion: "9",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"}, DeletionTimestamp: &metav1.Time{},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{}}`)},
				phase("kubelet"), phase("PodGC")}},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "billing",
			InitContainers:      []corev1.Container{{Name: "setup", Image: "i"}},
			Containers:          []corev1.Container{{Name: "app", Image: "app:1"}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "d"}}}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, PodIP: "10.0.0.1",
			Conditions:                 []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}, gc},
			InitContainerStatuses:      []corev1.ContainerStatus{{Name: "setup", State: terminated, Image: "i"}},
			ContainerStatuses:          []corev1.ContainerStatus{{Name: "app", State: terminated, ContainerID: "c1"}},
			EphemeralContainerStatuses: []corev1.ContainerStatus{{Name: "debug", State: terminated}}},
	}
	got, err := holderPod(full)
	if err != nil {
		t.Fatal(err)
	}
	slimTerminated := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "shop", UID: "u1", ResourceVersion: "9", DeletionTimestamp: &metav1.Time{},
			ManagedFields: []metav1.ManagedFieldsEntry{phase("kubelet"), phase("PodGC")}},
		Spec: corev1.PodSpec{ServiceAccountName: "billing", InitContainers: []corev1.Container{{Name: "setup"}},
			Containers:          []corev1.Container{{Name: "app"}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug"}}}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed,
			Conditions:                 []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC"}},
			InitContainerStatuses:      []corev1.ContainerStatus{{Name: "setup", State: slimTerminated}},
			ContainerStatuses:          []corev1.ContainerStatus{{Name: "app", State: slimTerminated}},
			EphemeralContainerStatuses: []corev1.ContainerStatus{{Name: "debug", State: slimTerminated}}},
	}
	if !apiequality.Semantic.DeepEqual(got, want) {
		t.Errorf("holderPod:\n got %+v\nwant %+v", got, want)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "shop/holder", Obj: full}
	if out, _ := holderPod(tomb); out != tomb {
		t.Error("a tombstone was changed")
	}
}
