package controllers

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// leaseEvents maps Lease events to the locks they back. A routine Lease
// write, one that only renews the current grant (renewTime moved) or changes
// the queue of waiters, changes nothing that the lock's status shows: it is
// observed here, which restarts the controller's expiry clock for the grant
// exactly as a reconcile would, and no reconcile is queued, so a renewal
// costs the apiserver no status write and the controller no pass. A renewal
// of a grant the controller had already seen lapse is news (status says
// Expired) and is reconciled.
func (r *DistributedLockReconciler) leaseEvents() handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	enqueue := func(ctx context.Context, obj client.Object, q queue) {
		for _, req := range r.locksForLease(ctx, obj) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { enqueue(ctx, e.Object, q) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			old, oldOK := e.ObjectOld.(*coordinationv1.Lease)
			cur, curOK := e.ObjectNew.(*coordinationv1.Lease)
			if oldOK && curOK {
				r.notePassedPlaces(ctx, old, cur)
				if routineWrite(old, cur) && !r.observeRoutineWrite(ctx, cur) {
					return
				}
			}
			enqueue(ctx, e.ObjectNew, q)
		},
		DeleteFunc:  func(ctx context.Context, e event.DeleteEvent, q queue) { enqueue(ctx, e.Object, q) },
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q queue) { enqueue(ctx, e.Object, q) },
	}
}

// routineWrite reports whether cur differs from old only by a renewal
// (renewTime) or a change of the queue of waiters (its places and front
// labels).
func routineWrite(old, cur *coordinationv1.Lease) bool {
	return equality.Semantic.DeepEqual(withoutRoutine(old), withoutRoutine(cur))
}

// withoutRoutine is l without what routine writes change.
func withoutRoutine(l *coordinationv1.Lease) *coordinationv1.Lease {
	out := l.DeepCopy()
	out.ResourceVersion, out.ManagedFields = "", nil
	out.Spec.RenewTime = nil
	for key := range out.Annotations {
		if lease.IsQueueKey(key) {
			delete(out.Annotations, key)
		}
	}
	if len(out.Annotations) == 0 {
		out.Annotations = nil
	}
	lease.DropFrontLabels(out) // they name the queue's front
	return out
}

// observeRoutineWrite records cur for every lock it backs, on the
// controller's clock, and reports whether a reconcile is due anyway: one of
// those locks had already been seen to lapse.
func (r *DistributedLockReconciler) observeRoutineWrite(ctx context.Context, cur *coordinationv1.Lease) bool {
	locks, err := r.locksBackedBy(ctx, cur)
	if err != nil {
		return true
	}
	now := r.Clock.Now()
	due := false
	for i := range locks {
		key := client.ObjectKeyFromObject(&locks[i]).String()
		if prev, ok := r.observations.Last(key); ok && !now.Before(prev.Deadline(lockDuration(&locks[i]))) {
			due = true
			continue
		}
		r.observations.Observe(key, lease.RecordOf(cur), now)
	}
	return due
}

// notePassedPlaces notes, for every lock cur backs, the places of waiters
// that the grant in cur passed over (see passedOver), judged by how long
// the controller had seen the lock free before it.
func (r *DistributedLockReconciler) notePassedPlaces(ctx context.Context, old, cur *coordinationv1.Lease) {
	if lease.Token(cur) != lease.Token(old)+1 {
		return
	}
	locks, err := r.locksBackedBy(ctx, cur)
	if err != nil {
		return
	}
	now := r.Clock.Now()
	for i := range locks {
		key := client.ObjectKeyFromObject(&locks[i])
		// The free time is measured from the controller's sighting of the
		// very record old shows: another (a reconcile lagging behind the
		// watch) would say nothing about how long old was free.
		prev, ok := r.observations.Last(key.String())
		if !ok || prev.Record.Holder != "" || !prev.Record.Equal(lease.RecordOf(old)) {
			continue
		}
		turn := lease.TurnLength(lockDuration(&locks[i]))
		r.passed.note(key, passedOver(old, cur, now.Sub(prev.ObservedAt), turn))
	}
}
