package controllers

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A renewal, or a change of the queue of waiters (its places and the
// labels naming its front), needs no reconcile; anything that changes the
// grant or what ties the Lease to its lock does.
func TestRoutineWriteIsRenewalOrQueueOnly(t *testing.T) {
	base := makeLease("a", 4, 10, t0, t0)
	base.Labels = map[string]string{locksv1alpha1.LockNameLabel: "billing"}
	queued := lease.SetQueue(base.DeepCopy(), []lease.Waiter{{Identity: "b", Ticket: "tb"}})
	for _, tc := range []struct {
		name    string
		old     *coordinationv1.Lease
		edit    func(*coordinationv1.Lease) *coordinationv1.Lease
		routine bool
	}{
		{"renewal", base, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			return lease.Renew(l, 10*time.Second, t0.Add(3*time.Second))
		}, true},
		{"first waiter registers", base, func(*coordinationv1.Lease) *coordinationv1.Lease { return queued }, true},
		{"a second waiter registers", queued, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			return lease.SetQueue(l.DeepCopy(), append(lease.Queue(l), lease.Waiter{Identity: "c", Ticket: "tc", Principal: "user=c"}))
		}, true},
		{"last waiter leaves", queued, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			return lease.SetQueue(l.DeepCopy(), nil)
		}, true},
		{"the controller marks the grant lapsed", base, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			out := l.DeepCopy()
			out.Annotations = map[string]string{locksv1alpha1.LapsedAnnotation: "4"}
			return out
		}, false},
		{"a new grant", base, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			out, _ := lease.Grant(l, "b", 10*time.Second, t0.Add(time.Second))
			return out
		}, false},
		{"the lock label removed", base, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			out := l.DeepCopy()
			delete(out.Labels, locksv1alpha1.LockNameLabel)
			return out
		}, false},
		{"another label added", base, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			out := l.DeepCopy()
			out.Labels["team"] = "payments"
			return out
		}, false},
		{"deletion started", base, func(l *coordinationv1.Lease) *coordinationv1.Lease {
			out := l.DeepCopy()
			out.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
			return out
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := routineWrite(tc.old, tc.edit(tc.old)); got != tc.routine {
				t.Errorf("routineWrite = %v, want %v", got, tc.routine)
			}
		})
	}
}
