package controllers

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The steps of a pass on the lock's Lease, in the order reconcile takes
// them: the repair of the queue (entries nobody can read, places of pods
// that are gone), candidates mode, admitted pods, then the lapse of a grant
// left unrenewed and the removal of queue places whose turn passed. Each
// does nothing when the lock has no Lease to mirror. state.lease follows
// each write, and each written record is observed on the controller's
// clock. A step that fails adds its error to the pass and does not keep
// the lapse and the removal of passed places from being judged: no entry
// or pod can stop a lock's grants from ending. The events of the writes
// made are the pass's, also when a later step fails.

// observeLease observes the record of the pass's Lease as of the pass's now.
func (r *DistributedLockReconciler) observeLease(p *pass) {
	if p.state.lease == nil {
		return
	}
	p.obs = r.observations.Observe(p.key.String(), lease.RecordOf(p.state.lease), p.now)
}

// repairQueueStep is the repair of the queue (see repairQueue) in a pass.
func (r *DistributedLockReconciler) repairQueueStep(ctx context.Context, p *pass) {
	if p.state.lease == nil {
		return
	}
	repaired, ev, recheck, err := r.repairQueue(ctx, p.state.lease, r.Clock.Now())
	if err != nil {
		p.errs = append(p.errs, err)
		return
	}
	r.follow(p, repaired, r.Clock.Now())
	if ev != nil {
		p.events = append(p.events, *ev)
	}
	p.renewIn = earliest(p.renewIn, recheck)
}

// candidatesStep is candidates mode (see reconcileCandidates) in a pass.
// Its write is observed when it was answered, not at the start of the
// pass: a hand-off delay counts from the revocation's write. It is followed
// (and its events kept) also when a later part of the step failed.
func (r *DistributedLockReconciler) candidatesStep(ctx context.Context, p *pass) {
	if p.state.lease == nil {
		return
	}
	cand, err := r.reconcileCandidates(ctx, p)
	if cand.lease != nil {
		r.follow(p, cand.lease, r.Clock.Now())
	}
	p.events, p.renewIn = append(p.events, cand.events...), earliest(p.renewIn, cand.renewIn)
	if err != nil {
		p.errs, p.candidatesFailed = append(p.errs, err), true
		return
	}
	p.selectorErr = cand.selectorErr
}

// admissionsStep is admission of the lock's pods (see reconcileAdmissions)
// in a pass, after candidates mode succeeded. A candidates selector that
// cannot select pods is reported once admission succeeded too.
func (r *DistributedLockReconciler) admissionsStep(ctx context.Context, p *pass) {
	if p.state.lease == nil || p.candidatesFailed {
		return
	}
	adm, err := r.reconcileAdmissions(ctx, p)
	if adm.lease != nil {
		r.follow(p, adm.lease, r.Clock.Now())
	}
	p.events, p.renewIn = append(p.events, adm.events...), earliest(p.renewIn, adm.renewIn)
	if err != nil {
		p.errs = append(p.errs, err)
		return
	}
	p.gatedPods = adm.gated
	if p.selectorErr != nil && p.state.ready {
		p.state.ready, p.state.reason = false, locksv1alpha1.ReasonInvalidSelector
		p.state.message = fmt.Sprintf("candidates mode grants nothing: %v; fix spec.candidates.podSelector", p.selectorErr)
		p.events = append(p.events, lockEvent{corev1.EventTypeWarning, EventSelectorInvalid, p.state.message})
	}
}

// lapseStep ends the Lease's grant as lapsed when it went unrenewed for its
// lease duration, or its holder's pod is proven dead (see markLapsed), then removes the queue places a
// takeover passed over and the head of a free lock's queue whose turn
// passed (see removePassedPlaces). A failed lapse mark ends the step.
func (r *DistributedLockReconciler) lapseStep(ctx context.Context, p *pass) {
	if p.state.lease == nil {
		return
	}
	marked, markIn, proven, err := r.markLapsed(ctx, p)
	if err != nil {
		p.errs = append(p.errs, err)
		return
	}
	r.follow(p, marked, p.now)
	if proven != nil {
		p.events, p.provenDead = append(p.events, *proven), proven.note
	}
	pruneIn, err := r.removePassedPlaces(ctx, p)
	p.renewIn = earliest(p.renewIn, markIn, pruneIn)
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

// isControllerGrant reports whether holder's grant on l is one the
// controller holds on a pod's behalf: a candidates-mode grant or an
// admitted pod's.
func (r *DistributedLockReconciler) isControllerGrant(l *coordinationv1.Lease, holder string) bool {
	return l != nil && holder != "" && lease.Holder(l) == holder && (r.isCandidateGrant(l) || isAdmittedGrant(l))
}
