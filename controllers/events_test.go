package controllers

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

func reasonsOf(evs []lockEvent) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, ev.reason)
	}
	return out
}

func TestStatusEventsBesidesLeaseEvents(t *testing.T) {
	ev := func(reason string) lockEvent { return lockEvent{corev1.EventTypeNormal, reason, reason} }
	cases := []struct {
		name        string
		leaseEvents []string
		status      []string
		want        []string
	}{
		{"nothing to explain", nil, []string{EventReleased}, []string{EventReleased}},
		{"a hand-off is not a takeover", []string{EventHandedOff}, []string{EventTakenOver}, nil},
		{"a recreated Lease is not a release", []string{EventLeaseRecreated}, []string{EventReleased}, nil},
		{"a restored floor is not a break", []string{EventTokenFloorRestored}, []string{EventBroken}, nil},
		{"a grant in the same pass stays", []string{EventLeaseRecreated}, []string{EventAcquired}, []string{EventAcquired}},
	}
	for _, c := range cases {
		var lease, status []lockEvent
		for _, r := range c.leaseEvents {
			lease = append(lease, ev(r))
		}
		for _, r := range c.status {
			status = append(status, ev(r))
		}
		if got := reasonsOf(statusEventsBesides(lease, status)); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestNewLeaseEventsDropsRepeatedWarnings(t *testing.T) {
	old := &locksv1alpha1.DistributedLockStatus{Conditions: []metav1.Condition{{
		Type: locksv1alpha1.ConditionReady, Reason: locksv1alpha1.ReasonLeaseInUse}}}
	evs := []lockEvent{{corev1.EventTypeWarning, EventLeaseConflict, "in use"}, {corev1.EventTypeNormal, EventLeaseAdopted, "adopted"}}
	if got := reasonsOf(newLeaseEvents(old, locksv1alpha1.ReasonLeaseInUse, evs)); !slices.Equal(got, []string{EventLeaseAdopted}) {
		t.Errorf("same reason: got %v, want only the adoption", got)
	}
	if got := reasonsOf(newLeaseEvents(old, locksv1alpha1.ReasonLeaseOwnedByOther, evs)); len(got) != 2 {
		t.Errorf("new reason: got %v, want both events", got)
	}
}
