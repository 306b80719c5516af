package controllers

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A grant ends by its holder's release, by a break, or by the controller
// ending it as lapsed: nobody else may declare it lapsed, since admission,
// which guards the Lease, has no clock. The controller judges expiry on its
// own monotonic clock (a record unchanged for the lease duration since it
// first saw it), so it ends the grant only after the holder's own safe
// window ended: the holder counts its window from the start of its last
// write, and the controller's count starts when it first sees that write.
// It ends it as a release would (the token kept, the Lease free), with the
// mark locks.frontdesk.dev/lapsed naming the token, so that status tells a
// lapse from a release; the waiters then take their turns.

// markLapsed ends the grant on the pass's Lease l as lapsed when the
// controller has seen its record go unrenewed for the lease duration, or
// at once when the pod whose token made it is proven dead (proof.go),
// unless the grant is the controller's own (candidates mode, admitted pods:
// it renews those, and ends them by its own rules). It returns the Lease as
// written, or l when there was nothing to write, how long until the lapse
// is due otherwise (zero for never), and the event of a proven death.
func (r *DistributedLockReconciler) markLapsed(ctx context.Context, p *pass) (*coordinationv1.Lease, time.Duration, *lockEvent, error) {
	lock, l, obs, now := p.lock, p.state.lease, p.obs, p.now
	rec := obs.Record
	if l == nil || rec.Holder == "" || rec.Lapsed || !ownedBy(l, lock) ||
		r.isCandidateGrant(l) || isAdmittedGrant(l) {
		return l, 0, nil, nil
	}
	var why, proof string
	if deadline := obs.Deadline(lockDuration(lock)); now.Before(deadline) {
		if why, proof = r.holderDeathProof(ctx, p); proof == "" {
			return l, deadline.Sub(now), nil, nil
		}
	}
	patch := lease.LapsePatch(l)
	if proof != "" {
		patch = lease.ProvenDeadPatch(l)
	}
	marked := l.DeepCopy()
	err := r.Patch(ctx, marked, client.RawPatch(types.JSONPatchType, patch.Bytes()))
	switch {
	case err == nil && proof != "":
		provenDeadReleases.WithLabelValues(lock.Namespace, proof).Inc()
		return marked, 0, &lockEvent{corev1.EventTypeWarning, EventHolderProvenDead, fmt.Sprintf(
			"%s (fencing token %d) is proven dead: %s; the controller ended its grant before its lease ran out", rec.Holder, rec.Token, why)}, nil
	case err == nil:
		return marked, 0, nil, nil
	case lease.PatchDidNotApply(err):
		// The record changed since it was judged (a renewal landed): the
		// watch brings it, and the next pass judges it afresh.
		return l, 0, nil, nil
	default:
		return nil, 0, nil, fmt.Errorf("marking the lapsed grant of %s on lease %s: %w", rec.Holder, l.Name, err)
	}
}
