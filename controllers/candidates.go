package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	// renewIn is when the controller must act on its candidate's grant
	// again: renew it, or hand it off once the hand-off delay has passed
	// (zero when it holds none).
	renewIn time.Duration
	events  []lockEvent
	// selectorErr is set when the selector cannot select pods.
	selectorErr error
}

// reconcileCandidates holds the lock for the oldest eligible candidate pod
// (Ready, not terminating, selected). It renews that pod's grant while the
// pod stays eligible. When it stops being eligible, the controller first
// revokes the grant (its marks go, so Services stop routing to it, and the
// renewTime moves, so every observer's expiry clock restarts), then waits
// until the pod is gone or the hand-off delay (by default one lease
// duration) has passed since the revocation, and only then grants the next
// candidate, with a higher token. The old pod has no grant Context: waiting
// is what keeps it from acting alongside the next one. A grant of the
// controller's that someone else cleared (released as the pod, broken) is
// waited out the same way, as are grants when candidates mode is turned off
// (revoked, then released) or the Lease is being deleted (revoked; the
// Lease goes once the hand-off is due). A holder the controller did not
// grant (a client of the library) is respected until its lease lapses.
// Every write is a compare-and-swap Update of the Lease.
func (r *DistributedLockReconciler) reconcileCandidates(ctx context.Context, p *pass) (candidateResult, error) {
	lock, current := p.lock, p.state.lease
	res := candidateResult{lease: current}
	if current == nil {
		return res, nil
	}
	holder := p.obs.Record.Holder
	granted := current.Annotations[locksv1alpha1.CandidateGrantAnnotation]
	ours := holder != "" && r.isCandidateGrant(current)
	revoked := ours && current.Annotations[locksv1alpha1.RevokedAnnotation] == holder
	vanished := holder == "" && granted != ""

	if lock.Spec.Candidates == nil || current.DeletionTimestamp != nil {
		switch {
		case ours && !revoked:
			return r.revokeCandidate(ctx, p)
		case (revoked || vanished) && current.DeletionTimestamp == nil:
			return r.endRevokedGrant(ctx, p, granted, nil)
		}
		return res, nil
	}
	eligible, err := r.eligibleCandidates(ctx, lock)
	if errors.Is(err, errInvalidSelector) {
		res.selectorErr = err
		eligible, err = nil, nil
	}
	if err != nil {
		return res, err
	}
	holderEligible := slices.ContainsFunc(eligible, func(p corev1.Pod) bool { return candidateIdentity(&p) == holder })

	switch {
	case ours && !revoked && holderEligible:
		return r.renewCandidate(ctx, p, current)
	case ours && !revoked:
		return r.revokeCandidate(ctx, p)
	case revoked || vanished:
		return r.endRevokedGrant(ctx, p, granted, eligible)
	case holder != "" && p.now.Before(p.obs.Deadline(lockDuration(lock))):
		return res, nil // a library client holds it; its lease is respected
	case len(eligible) == 0:
		return res, nil
	}
	return r.grantCandidate(ctx, p, &eligible[0])
}

// endRevokedGrant waits out a revoked (or vanished) grant of the
// controller's to identity on the pass's Lease, then hands the lock on to
// the first eligible pod, or releases it.
func (r *DistributedLockReconciler) endRevokedGrant(ctx context.Context, p *pass, identity string, eligible []corev1.Pod) (candidateResult, error) {
	ended, wait, err := r.handOffDue(ctx, p, identity)
	if err != nil || ended == "" {
		return candidateResult{lease: p.state.lease, renewIn: wait}, err
	}
	return r.handOff(ctx, p, identity, eligible, ended)
}

// renewCandidate renews the controller's grant on current (the pass's
// record, as observed) when due, every renewInterval, and at once when
// this process sees the record for the first time (after a restart or
// failover it cannot know when the last renewal was).
func (r *DistributedLockReconciler) renewCandidate(ctx context.Context, p *pass, current *coordinationv1.Lease) (candidateResult, error) {
	obs, now, interval := p.obs, p.now, p.renewInterval()
	res := candidateResult{lease: current}
	if due := obs.ObservedAt.Add(interval); now.Before(due) && !obs.ObservedAt.Equal(now) {
		res.renewIn = due.Sub(now)
		return res, nil
	}
	updated, err := r.writeLease(ctx, lease.Renew(current, obs.Record.Duration(3*interval), now))
	if err != nil {
		return res, fmt.Errorf("renewing the lease for candidate %s: %w", obs.Record.Holder, err)
	}
	res.lease, res.renewIn = updated, interval
	return res, nil
}

// revokeCandidate revokes the grant of a holder pod that is no longer
// eligible: one write that names it revoked and moves renewTime to now.
// The hand-off delay counts from when that write was answered (the
// reconciler observes the revoked record then), not from now.
func (r *DistributedLockReconciler) revokeCandidate(ctx context.Context, p *pass) (candidateResult, error) {
	lock, current := p.lock, p.state.lease
	res := candidateResult{lease: current}
	// The marks go first: the hand-off delay counts from the revocation
	// write, so the pod must already be unmarked by then.
	if err := r.clearPodMarks(ctx, lock, locksv1alpha1.PodNameOf(lease.Holder(current))); err != nil {
		return res, err
	}
	revoking := current.DeepCopy()
	revokeCandidateGrant(revoking, p.now)
	updated, err := r.writeLease(ctx, revoking)
	if err != nil {
		return res, fmt.Errorf("revoking the grant of candidate %s: %w", lease.Holder(current), err)
	}
	delay := handOffDelay(lock)
	res.lease, res.renewIn = updated, delay
	res.events = append(res.events, lockEvent{corev1.EventTypeNormal, EventRevoked, fmt.Sprintf(
		"candidate %s is no longer eligible (not Ready, terminating or not selected): revoked its grant (fencing token %d) "+
			"and removed its marks; the lock is handed on once the pod is gone or in %s", locksv1alpha1.PodNameOf(lease.Holder(current)),
		lease.Token(current), delay)})
	return res, nil
}

// handOffDue says whether the wait after a revocation is over, and why:
// the revoked pod is gone (deleted, or replaced by a pod with another UID),
// or the hand-off delay has passed since the controller first saw the
// revoked record (after a restart that is later than the revocation: the
// conservative direction). Otherwise it returns how long is left.
func (r *DistributedLockReconciler) handOffDue(ctx context.Context, p *pass, holder string) (ended string, wait time.Duration, err error) {
	lock := p.lock
	// A grant someone else cleared never had its marks removed by a
	// revocation: make sure they are gone before the wait can end.
	if err := r.clearPodMarks(ctx, lock, locksv1alpha1.PodNameOf(holder)); err != nil {
		return "", 0, err
	}
	gone, err := r.podGone(ctx, lock.Namespace, holder)
	if err != nil {
		return "", 0, err
	}
	if gone {
		return fmt.Sprintf("pod %s is gone", locksv1alpha1.PodNameOf(holder)), 0, nil
	}
	due := p.obs.ObservedAt.Add(handOffDelay(lock))
	if p.now.Before(due) {
		return "", due.Sub(p.now), nil
	}
	return fmt.Sprintf("the hand-off delay (%s) passed since the revocation", handOffDelay(lock)), 0, nil
}

// handOff ends a revoked grant (to from, ended says why): it grants the
// next eligible candidate, or releases the lock when there is none.
func (r *DistributedLockReconciler) handOff(ctx context.Context, p *pass, from string, eligible []corev1.Pod,
	ended string) (candidateResult, error) {
	current := p.state.lease
	old := locksv1alpha1.PodNameOf(from)
	if len(eligible) == 0 {
		released := lease.Release(current)
		delete(released.Annotations, locksv1alpha1.CandidateGrantAnnotation)
		delete(released.Annotations, locksv1alpha1.RevokedAnnotation)
		updated, err := r.writeLease(ctx, released)
		if err != nil {
			return candidateResult{lease: current}, fmt.Errorf("releasing the lease of revoked candidate %s: %w", old, err)
		}
		return candidateResult{lease: updated, events: []lockEvent{{corev1.EventTypeNormal, EventCandidateGone,
			fmt.Sprintf("%s and no other candidate is eligible: released the lock revoked from %s", ended, old)}}}, nil
	}
	res, err := r.grantCandidate(ctx, p, &eligible[0])
	if err != nil {
		return res, err
	}
	res.events = append(res.events, lockEvent{corev1.EventTypeNormal, EventHandedOff,
		fmt.Sprintf("%s: handed the lock revoked from %s to %s with fencing token %d", ended, old, eligible[0].Name, lease.Token(res.lease))})
	return res, nil
}

// grantCandidate grants the lock to pod: a new token, in one write that
// also records the grant as the controller's own.
func (r *DistributedLockReconciler) grantCandidate(ctx context.Context, p *pass, pod *corev1.Pod) (candidateResult, error) {
	current := p.state.lease
	res := candidateResult{lease: current}
	identity := candidateIdentity(pod)
	granted, err := lease.Grant(current, identity, r.Principal, lockDuration(p.lock), p.now)
	if err != nil {
		return res, fmt.Errorf("granting the lease to candidate %s: %w", pod.Name, err)
	}
	if granted.Annotations == nil {
		granted.Annotations = map[string]string{}
	}
	granted.Annotations[locksv1alpha1.CandidateGrantAnnotation] = identity
	delete(granted.Annotations, locksv1alpha1.RevokedAnnotation)
	updated, err := r.writeLease(ctx, granted)
	if err != nil {
		return res, fmt.Errorf("granting the lease to candidate %s: %w", pod.Name, err)
	}
	res.lease, res.renewIn = updated, p.renewInterval()
	return res, nil
}

// isCandidateGrant reports whether l's current grant is the controller's
// own in candidates mode: its candidate-grant mark (the manager's alone)
// names the holder, and the grant is bound to the controller's principal
// (or, written by an earlier version that recorded none, to nobody). A
// participant that takes the lock under a candidate's identity holds a
// grant bound to its own principal: the controller respects it as any
// library holder's, and never renews it or marks a pod for it.
func (r *DistributedLockReconciler) isCandidateGrant(l *coordinationv1.Lease) bool {
	holder := lease.Holder(l)
	bound := l.Annotations[locksv1alpha1.HolderPrincipalAnnotation]
	return holder != "" && l.Annotations[locksv1alpha1.CandidateGrantAnnotation] == holder && (bound == r.Principal || bound == "")
}

// handOffDelay is spec.candidates.handOffDelaySeconds, or the lock's lease
// duration when unset.
func handOffDelay(lock *locksv1alpha1.DistributedLock) time.Duration {
	if c := lock.Spec.Candidates; c != nil && c.HandOffDelaySeconds != nil {
		return time.Duration(*c.HandOffDelaySeconds) * time.Second
	}
	return lockDuration(lock)
}

// podGone reports whether the pod an identity names no longer exists: not
// found, or a pod of that name with another UID. For an identity that
// carries no full UID (an earlier version's "<pod>_<first 8 of the UID>"),
// only a pod of that name whose UID does not start with that part counts as
// another pod; with nothing to compare, only "not found" is gone.
func (r *DistributedLockReconciler) podGone(ctx context.Context, namespace, identity string) (bool, error) {
	// Read from the apiserver: the cache holds participant pods only, and a
	// pod that dropped the label is not gone.
	pod := &corev1.Pod{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: locksv1alpha1.PodNameOf(identity)}, pod)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading candidate pod %s: %w", locksv1alpha1.PodNameOf(identity), err)
	}
	if uid := locksv1alpha1.PodUIDOf(identity); uid != "" {
		return string(pod.UID) != uid, nil
	}
	_, prefix, _ := strings.Cut(identity, locksv1alpha1.IdentitySeparator)
	return len(prefix) == 8 && !strings.HasPrefix(string(pod.UID), prefix), nil
}

// writeLease writes l, an edited copy that keeps the resourceVersion that
// was read (a compare-and-swap), and returns it as written.
func (r *DistributedLockReconciler) writeLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	if err := r.Update(ctx, l); err != nil {
		return nil, err
	}
	return l, nil
}

// eligibleCandidates lists the Ready, non-terminating participant pods
// (locks.frontdesk.dev/participant=true: the only pods the manager caches)
// the lock's selector picks, oldest first (then by name).
func (r *DistributedLockReconciler) eligibleCandidates(ctx context.Context, lock *locksv1alpha1.DistributedLock) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(lock.Spec.Candidates.PodSelector.LabelSelector())
	if err != nil {
		return nil, fmt.Errorf("%w: spec.candidates.podSelector: %w", errInvalidSelector, err)
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(lock.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing candidate pods: %w", err)
	}
	eligible := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return !podReady(&p) || !r.usableIdentity(&p, lock.Name) })
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

// maxPodNameForIdentity is the longest pod name whose candidateIdentity is
// of the grammar: the name, the separator and a 36-character UID.
const maxPodNameForIdentity = lease.MaxIdentityLength - 1 - 36

// usableIdentity reports whether pod's candidateIdentity is of the grammar.
// A pod whose name is too long is left out of the queue and of candidates
// mode (with a Warning on the pod): one such pod must not stop the lock's
// other pods from being queued, admitted or granted.
func (r *DistributedLockReconciler) usableIdentity(pod *corev1.Pod, lockName string) bool {
	if lease.ValidIdentity(candidateIdentity(pod)) {
		return true
	}
	r.warnPodOnce(pod, string(pod.UID)+"/name/"+lockName, EventPodNameTooLong, fmt.Sprintf(
		"the pod's name is %d characters: a pod that runs holding DistributedLock %s, or is one of its candidates, may have a name "+
			"of at most %d (its holder identity is <pod>_<uid>, at most %d characters); give it a shorter name",
		len(pod.Name), lockName, maxPodNameForIdentity, lease.MaxIdentityLength))
	return false
}

// candidateIdentity is the holder identity the controller uses for a pod:
// its name and UID, so a recreated pod of the same name is a new holder.
func candidateIdentity(p *corev1.Pod) string {
	return locksv1alpha1.PodIdentity(p.Name, string(p.UID), "")
}
