package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// errInvalidSelector marks a candidates selector the apiserver accepted but
// that cannot select pods.
var errInvalidSelector = errors.New("invalid candidates selector")

// candidateResult is what candidates mode did to the Lease this pass.
type candidateResult struct {
	// lease is the Lease after any write.
	lease *coordinationv1.Lease
	// renewIn is when the controller must renew its candidate's grant
	// (zero when it holds none).
	renewIn time.Duration
	events  []lockEvent
}

// reconcileCandidates holds the lock for the oldest Ready candidate pod: it
// renews that pod's grant while the pod stays Ready, and hands the lock to
// the next candidate (a new grant, a higher token) when the pod goes away or
// stops being Ready. A holder the controller did not grant (a client of the
// library) is respected until its lease lapses. Every write is a
// compare-and-swap Update of the Lease.
func (r *DistributedLockReconciler) reconcileCandidates(ctx context.Context, lock *locksv1alpha1.DistributedLock,
	current *coordinationv1.Lease, obs lease.Observation, now time.Time) (candidateResult, error) {
	res := candidateResult{lease: current}
	if lock.Spec.Candidates == nil || current == nil || current.DeletionTimestamp != nil {
		return res, nil
	}
	eligible, err := r.eligibleCandidates(ctx, lock)
	if errors.Is(err, errInvalidSelector) {
		// The CRD rejects most bad selectors; one that still slips through
		// (say, an invalid label key) selects nobody.
		ctrl.LoggerFrom(ctx).Error(err, "candidates mode: no pod can be selected")
		eligible, err = nil, nil
	}
	if err != nil {
		return res, err
	}
	duration := obs.Record.Duration(lockDuration(lock))
	interval := duration / 3
	holder := obs.Record.Holder
	ours := holder != "" && current.Annotations[locksv1alpha1.CandidateGrantAnnotation] == holder
	holderEligible := slices.ContainsFunc(eligible, func(p corev1.Pod) bool { return candidateIdentity(&p) == holder })

	switch {
	case ours && holderEligible:
		// Renew when due, and at once when this process sees the record for
		// the first time (after a restart or failover it cannot know when
		// the last renewal was).
		if due := obs.ObservedAt.Add(interval); now.Before(due) && !obs.ObservedAt.Equal(now) {
			res.renewIn = due.Sub(now)
			return res, nil
		}
		updated, err := r.writeLease(ctx, current, func(l *coordinationv1.Lease) {
			l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
		})
		if err != nil {
			return res, fmt.Errorf("renewing the lease for candidate %s: %w", holder, err)
		}
		res.lease, res.renewIn = updated, interval
		return res, nil
	case holder != "" && !ours && now.Before(obs.Deadline(lockDuration(lock))):
		return res, nil // a library client holds it; its lease is respected
	case len(eligible) == 0:
		if !ours {
			return res, nil
		}
		updated, err := r.writeLease(ctx, current, func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil, nil
			delete(l.Annotations, locksv1alpha1.CandidateGrantAnnotation)
		})
		if err != nil {
			return res, fmt.Errorf("releasing the lease of candidate %s: %w", holder, err)
		}
		res.lease = updated
		res.events = append(res.events, lockEvent{corev1.EventTypeNormal, EventCandidateGone,
			fmt.Sprintf("candidate %s is no longer Ready and no other candidate is; released the lock", locksv1alpha1.PodNameOf(holder))})
		return res, nil
	}

	next := &eligible[0]
	identity := candidateIdentity(next)
	updated, err := r.writeLease(ctx, current, func(l *coordinationv1.Lease) {
		t := metav1.NewMicroTime(now)
		l.Spec.HolderIdentity = ptr.To(identity)
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		l.Spec.LeaseDurationSeconds = ptr.To(lock.EffectiveLeaseDurationSeconds())
		l.Spec.AcquireTime, l.Spec.RenewTime = &t, &t
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[locksv1alpha1.CandidateGrantAnnotation] = identity
	})
	if err != nil {
		return res, fmt.Errorf("granting the lease to candidate %s: %w", next.Name, err)
	}
	res.lease, res.renewIn = updated, interval
	if ours {
		res.events = append(res.events, lockEvent{corev1.EventTypeNormal, EventHandedOff,
			fmt.Sprintf("candidate %s is no longer Ready; handed the lock to %s with fencing token %d",
				locksv1alpha1.PodNameOf(holder), next.Name, ptr.Deref(updated.Spec.LeaseTransitions, 0))})
	}
	return res, nil
}

// writeLease applies mutate to a copy of current and writes it with the
// resourceVersion that was read.
func (r *DistributedLockReconciler) writeLease(ctx context.Context, current *coordinationv1.Lease,
	mutate func(*coordinationv1.Lease)) (*coordinationv1.Lease, error) {
	l := current.DeepCopy()
	mutate(l)
	if err := r.Update(ctx, l); err != nil {
		return nil, err
	}
	return l, nil
}

// eligibleCandidates lists the Ready, non-terminating pods the lock's
// selector picks, oldest first (then by name).
func (r *DistributedLockReconciler) eligibleCandidates(ctx context.Context, lock *locksv1alpha1.DistributedLock) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(&lock.Spec.Candidates.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("%w: spec.candidates.podSelector: %w", errInvalidSelector, err)
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(lock.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing candidate pods: %w", err)
	}
	eligible := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return !podReady(&p) })
	slices.SortFunc(eligible, func(a, b corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return eligible, nil
}

// podReady: not terminating, not finished, and its Ready condition True.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// candidateIdentity is the holder identity the controller uses for a pod:
// its name and the start of its UID, so a recreated pod of the same name is
// a new holder.
func candidateIdentity(p *corev1.Pod) string {
	uid := string(p.UID)
	return p.Name + locksv1alpha1.IdentitySeparator + uid[:min(8, len(uid))]
}
