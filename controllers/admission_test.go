package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

// recordedEvent is an Event as the reconciler recorded it.
type recordedEvent struct {
	regarding, reason, note string
}

// eventLog is an events.EventRecorder that keeps what it is given.
type eventLog struct{ events []recordedEvent }

func (l *eventLog) Eventf(regarding, _ runtime.Object, _, reason, _, note string, args ...any) {
	name := "<none>"
	if o, ok := regarding.(client.Object); ok && o.GetName() != "" {
		name = o.GetName()
	}
	l.events = append(l.events, recordedEvent{name, reason, fmt.Sprintf(note, args...)})
}

// admittedGrant is the Lease of a lock whose grant the controller holds
// for pod, with token.
func admittedGrant(pod *corev1.Pod, token int32) *coordinationv1.Lease {
	identity := candidateIdentity(pod)
	return testutil.MakeLease("billing", pod.Namespace).Token(token).Duration(30).Held(identity, t0, t0).
		Annotation(locksv1alpha1.AdmittedGrantAnnotation, admittedMark(identity, int64(token))).Obj()
}

// admissionSetup is a reconciler whose client (and APIReader) stores a
// gated pod of each name, created a second apart from t0 on, and those
// pods as its cache lists them, oldest first.
func admissionSetup(ns string, names ...string) (*DistributedLockReconciler, client.Client, *clocktesting.FakePassiveClock,
	*eventLog, []corev1.Pod) {
	cached := make([]corev1.Pod, 0, len(names))
	objs := make([]client.Object, 0, len(names))
	for i, name := range names {
		p := testutil.MakeGatedPod(name, ns, "billing")
		p.UID = types.UID("uid-" + name)
		p.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration(i) * time.Second))
		cached = append(cached, *p)
		objs = append(objs, p.DeepCopy())
	}
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	clk := clocktesting.NewFakePassiveClock(t0)
	rec := &eventLog{}
	r := &DistributedLockReconciler{Client: c, APIReader: c, Recorder: rec, Clock: clk, memories: &memories{podNotes: newPodNotes()}}
	return r, c, clk, rec, cached
}

// Three gated pods admitted in turn, oldest first: each admission's
// Events, wait observation and the pods left waiting are about the pod
// admitted, whichever place it had among the waiting pods.
func TestAdmitHolderReportsThePodItAdmitted(t *testing.T) {
	names := []string{"a", "b", "c"}
	r, c, clk, rec, cached := admissionSetup("admit-holder", names...)
	lock := testutil.MakeLock("billing", "admit-holder").LeaseDuration(30).Obj()
	res := admissionResult{gated: cached}
	ctx := context.Background()
	for i, name := range names {
		pod := res.gated[0]
		now := t0.Add(time.Duration(10*(i+1)) * time.Second)
		clk.SetTime(now)
		res.lease, res.events = admittedGrant(&pod, int32(i+1)), nil
		rec.events = nil
		count := testutil.ToFloat64(metrics.Registry, "frontdesk_pod_admission_wait_seconds_count")
		sum := testutil.ToFloat64(metrics.Registry, "frontdesk_pod_admission_wait_seconds_sum")

		if err := r.admitHolder(ctx, &pass{lock: lock, now: now}, &res, true); err != nil {
			t.Fatalf("admitting pod %s: %v", name, err)
		}
		wait := now.Sub(pod.CreationTimestamp.Time)
		want := fmt.Sprintf("admitted pod %s with fencing token %d after %s gated", name, i+1, wait)
		if len(rec.events) != 1 || rec.events[0] != (recordedEvent{name, EventPodAdmitted, want}) {
			t.Errorf("admitting pod %s: recorded %+v, want one Event on pod %s: %q", name, rec.events, name, want)
		}
		if len(res.events) != 1 || res.events[0].note != want {
			t.Errorf("admitting pod %s: lock events %+v, want %q", name, res.events, want)
		}
		if got := testutil.ToFloat64(metrics.Registry, "frontdesk_pod_admission_wait_seconds_count") - count; got != 1 {
			t.Errorf("admitting pod %s: %v wait observations, want 1", name, got)
		}
		if got := testutil.ToFloat64(metrics.Registry, "frontdesk_pod_admission_wait_seconds_sum") - sum; got != wait.Seconds() {
			t.Errorf("admitting pod %s: observed a wait of %vs, want %vs", name, got, wait.Seconds())
		}
		if got, want := podNames(res.gated), names[i+1:]; !slices.Equal(got, want) {
			t.Errorf("admitting pod %s: pods left waiting %v, want %v", name, got, want)
		}
		stored := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(&pod), stored); err != nil {
			t.Fatal(err)
		}
		if gated(stored) || stored.Annotations[locksv1alpha1.TokenAnnotationKey("billing")] != strconv.Itoa(i+1) {
			t.Errorf("admitting pod %s: stored gates %v, annotations %v", name, stored.Spec.SchedulingGates, stored.Annotations)
		}
		if r.podNotes.firstWarning(string(pod.UID) + "/ungated/billing") {
			t.Errorf("admitting pod %s: its not-gated warning is not silenced", name)
		}
	}
}

// A pass whose cache still shows the pod gated after an earlier pass
// admitted it (the apiserver has it ungated) reports no second admission.
func TestAdmitHolderReportsAPodAdmittedEarlierOnlyOnce(t *testing.T) {
	r, c, clk, rec, cached := admissionSetup("admitted-earlier", "a", "b")
	lock := testutil.MakeLock("billing", "admitted-earlier").LeaseDuration(30).Obj()
	ctx := context.Background()
	clk.SetTime(t0.Add(10 * time.Second))
	res := admissionResult{lease: admittedGrant(&cached[0], 1), gated: slices.Clone(cached)}
	if err := r.admitHolder(ctx, &pass{lock: lock, now: clk.Now()}, &res, true); err != nil {
		t.Fatal(err)
	}
	count := testutil.ToFloat64(metrics.Registry, "frontdesk_pod_admission_wait_seconds_count")
	rec.events = nil

	stale := admissionResult{lease: res.lease, gated: slices.Clone(cached)}
	if err := r.admitHolder(ctx, &pass{lock: lock, now: clk.Now()}, &stale, true); err != nil {
		t.Fatal(err)
	}
	if len(rec.events) != 0 || len(stale.events) != 0 {
		t.Errorf("admission reported again: events %+v, lock events %+v", rec.events, stale.events)
	}
	if got := testutil.ToFloat64(metrics.Registry, "frontdesk_pod_admission_wait_seconds_count") - count; got != 0 {
		t.Errorf("%v more wait observations, want none", got)
	}
	if got := podNames(stale.gated); !slices.Equal(got, []string{"b"}) {
		t.Errorf("pods left waiting %v, want [b]", got)
	}
	stored := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&cached[0]), stored); err != nil || gated(stored) {
		t.Errorf("pod a: %v, gates %v", err, stored.Spec.SchedulingGates)
	}
}

func podNames(pods []corev1.Pod) []string {
	names := make([]string, 0, len(pods))
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}
