package controllers

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestPendingEventsWaitForTheSameLockOnly(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "leader"}
	revoked := lockEvent{corev1.EventTypeNormal, EventRevoked, "revoked"}
	handed := lockEvent{corev1.EventTypeNormal, EventHandedOff, "handed"}
	conflict := lockEvent{corev1.EventTypeWarning, EventLeaseConflict, "foreign"}
	cases := []struct {
		name    string
		kept    [][]lockEvent // one failed pass each, all of UID "a"
		takeUID types.UID
		want    []string
	}{
		{"nothing kept", nil, "a", nil},
		{"two failed passes, in order", [][]lockEvent{{revoked}, {handed}}, "a", []string{EventRevoked, EventHandedOff}},
		{"recurring warnings are not kept", [][]lockEvent{{conflict, handed}}, "a", []string{EventHandedOff}},
		{"a lock created again does not inherit them", [][]lockEvent{{handed}}, "b", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPendingEvents()
			for _, evs := range tc.kept {
				p.keep(key, "a", evs)
			}
			if got := reasonsOf(p.take(key, tc.takeUID)); !slices.Equal(got, tc.want) {
				t.Errorf("took %v, want %v", got, tc.want)
			}
			if again := p.take(key, "a"); len(again) != 0 {
				t.Errorf("taken twice: %v", reasonsOf(again))
			}
		})
	}
}
