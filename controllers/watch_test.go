package controllers

import (
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A renewal, or a change of the queue of waiters (its places and the
// labels naming its front), needs no reconcile; anything that changes the
// grant or what ties the Lease to its lock does.
func TestRoutineWriteIsRenewalOrQueueOnly(t *testing.T) {
	base := makeLease("a", 4, 10, t0, t0)
	base.Labels = map[string]string{locksv1alpha1.LockNameLabel: "billing"}
	queued := lease.SetQueue(base.DeepCopy(), []lease.Waiter{{Principal: "user=b", Identity: "b", Ticket: "tb"}})
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
			out, _ := lease.Grant(l, "b", "user=test", 10*time.Second, t0.Add(time.Second))
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
			out.DeletionTimestamp = new(metav1.NewTime(t0))
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

// The controller removes the places a takeover passed over only when the
// lock had been free for their turns; and the head of a free lock's queue
// once its turn passed with nobody taking the lock.
func TestPassedPlaces(t *testing.T) {
	turn := time.Second
	old := makeLease("", 4, 10, t0, t0)
	old.Labels = map[string]string{locksv1alpha1.LockNameLabel: "billing"}
	old = lease.SetQueue(old, []lease.Waiter{{Principal: "user=a", Identity: "a", Ticket: "ta"}, {Principal: "user=b", Identity: "b", Ticket: "tb"}, {Principal: "user=c", Identity: "c", Ticket: "tc"}})
	took := func(l *coordinationv1.Lease, identity string, keep ...string) *coordinationv1.Lease {
		out, _ := lease.Grant(l, identity, "user=test", 10*time.Second, t0)
		var q []lease.Waiter
		for _, w := range lease.Queue(l) {
			if slices.Contains(keep, w.Ticket) {
				q = append(q, w)
			}
		}
		return lease.SetQueue(out, q)
	}
	cur := took(old, "c", "ta", "tb")
	if got := passedOver(old, cur, 2*turn, turn); !slices.Equal(got, []string{"ta", "tb"}) {
		t.Errorf("c took it at its turn: passed %v, want ta tb", got)
	}
	if got := passedOver(old, cur, turn, turn); got != nil {
		t.Errorf("c took it a turn early: passed %v, want none", got)
	}
	outsider := took(old, "x", "ta", "tb", "tc")
	if got := passedOver(old, outsider, 3*turn, turn); !slices.Equal(got, []string{"ta", "tb", "tc"}) {
		t.Errorf("a caller outside the queue after every turn: passed %v", got)
	}
	handed, _ := lease.Grant(old, "a", "user=test", 10*time.Second, t0)
	handed.Annotations[locksv1alpha1.TicketAnnotation] = "ta"
	if got := passedOver(old, handed, 9*turn, turn); got != nil {
		t.Errorf("a hand-off passes nobody over: %v", got)
	}
	q := lease.Queue(old)
	if got, next := expiredFront(q, turn, turn); got != nil || next != turn/2 {
		t.Errorf("head within its turn: %v, next %s", got, next)
	}
	if got, _ := expiredFront(q, 2*turn, turn); !slices.Equal(got, []string{"ta"}) {
		t.Errorf("head past its turn: %v, want ta alone", got)
	}
}
