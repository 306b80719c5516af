package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestPodNotesProveOnlyWhatTheWatchShowed(t *testing.T) {
	pod := func(uid, node string, grace *int64) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID("u-" + uid)}, Spec: corev1.PodSpec{NodeName: node}}
		if grace != nil {
			p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &metav1.Time{}, grace
		}
		return p
	}
	stopped := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers = []corev1.Container{{Name: "work"}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}}
		return p
	}
	running := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers = []corev1.Container{{Name: "work"}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		return p
	}
	start := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	n := newPodNotes()
	// Graceful: seen terminating with a grace period on its node, then
	// deleted (the kubelet's grace-0 delete).
	n.saw(pod("graceful", "n1", ptr.To[int64](30)), true)
	n.deleted(stopped(pod("graceful", "n1", ptr.To[int64](0))), false, true, start)
	// Graceful, then forced while its containers still ran (a partitioned
	// kubelet): no proof.
	n.saw(pod("graceful-then-forced", "n1", ptr.To[int64](30)), true)
	n.deleted(running(pod("graceful-then-forced", "n1", ptr.To[int64](0))), false, true, start)
	// Force: deleted with grace 0 straight from running.
	n.saw(pod("force", "n1", ptr.To[int64](0)), true)
	n.deleted(pod("force", "n1", ptr.To[int64](0)), false, true, start)
	// Unbound: deleted before any node.
	n.deleted(pod("unbound", "", ptr.To[int64](0)), false, true, start)
	// Its containers reported stopped before the deletion (a crash the
	// kubelet may have restarted since, cut off): the graceful deletion,
	// forced, proves nothing.
	n.saw(stopped(pod("stale", "n1", ptr.To[int64](30))), true)
	n.saw(pod("stale", "n1", ptr.To[int64](30)), true)
	n.deleted(stopped(pod("stale", "n1", ptr.To[int64](0))), false, true, start)
	// Finished (the kubelet's terminal phase) before the deletion: proven.
	finishedFirst := stopped(pod("finished", "n1", ptr.To[int64](30)))
	finishedFirst.Status.Phase = corev1.PodSucceeded
	n.saw(finishedFirst, true)
	n.deleted(stopped(pod("finished", "n1", ptr.To[int64](0))), false, true, start)
	// A tombstone proves nothing, even after a graceful start.
	n.saw(pod("tombstone", "n1", ptr.To[int64](30)), true)
	n.deleted(pod("tombstone", "n1", nil), true, true, start)

	for uid, want := range map[string]podEnd{"graceful": endGraceful, "force": endUnknown, "unbound": endNeverBound,
		"tombstone": endUnknown, "never-seen": endUnknown, "graceful-then-forced": endUnknown, "stale": endUnknown,
		"finished": endGraceful} {
		if got := n.endOf(pod(uid, "", nil).UID); got != want {
			t.Errorf("%s: end %v, want %v", uid, got, want)
		}
	}
	// Ends are forgotten after deathRetention, at the next deletion noted.
	n.deleted(pod("later", "", ptr.To[int64](0)), false, true, start.Add(deathRetention+time.Second))
	if got := n.endOf(pod("graceful", "", nil).UID); got != endUnknown {
		t.Errorf("graceful, after the retention: end %v, want it forgotten", got)
	}
	if got := n.endOf(pod("later", "", nil).UID); got != endNeverBound {
		t.Errorf("later: end %v, want %v", got, endNeverBound)
	}
}
