package controllers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A pod that runs holding a lock (annotation locks.frontdesk.dev/runs-holding,
// scheduling gate locks.frontdesk.dev/admission, participant label) waits in
// the lock's queue like any other waiter: the controller registers a place
// for it (ticket podTicket, identity "<pod>_<uid>"), oldest pod first, behind
// the places already there. When the place's turn comes (a release hands the
// lock to it, or the lock is free with the place at the head), the grant is
// the controller's to hold on the pod's behalf (AdmittedGrantAnnotation).
// Only after a Lease write of this pass has confirmed that grant does it
// write the pod's token annotation and remove the gate, in one Update of the
// pod: a pod is never ungated without a live grant whose token it carries.

// podTicketPrefix starts the ticket of a place the controller registers for
// a gated pod; the rest is the pod's UID.
const podTicketPrefix = locksv1alpha1.PodTicketPrefix

// podTicket is the ticket of the pod's place in a lock's queue.
func podTicket(p *corev1.Pod) string { return podTicketPrefix + string(p.UID) }

// admissionResult is what admission did to the Lease this pass.
type admissionResult struct {
	// lease is the Lease after any write.
	lease *coordinationv1.Lease
	// renewIn is when the controller must act on its admitted grant again.
	renewIn time.Duration
	events  []lockEvent
	// gated are the pods still waiting, gated, oldest first.
	gated []corev1.Pod
}

// reconcileAdmissions runs one pass of admission for the lock:
// the grant held for an admitted pod is renewed or ended, waiting pods are
// queued (their places removed once they no longer wait), a grant handed
// to a waiting pod's place is taken up, a free lock whose queue head is a
// waiting pod is granted to it, and the pod whose grant is confirmed is
// ungated. Every Lease write is a compare-and-swap.
func (r *DistributedLockReconciler) reconcileAdmissions(ctx context.Context, p *pass) (admissionResult, error) {
	lock, current := p.lock, p.state.lease
	res := admissionResult{lease: current}
	if current == nil || current.DeletionTimestamp != nil || !ownedBy(current, lock) {
		return res, nil
	}
	pods, err := r.runsHoldingPods(ctx, lock)
	if err != nil {
		return res, err
	}
	res.gated = slices.DeleteFunc(slices.Clone(pods), func(p corev1.Pod) bool { return !waitingForAdmission(&p) })
	for i := range res.gated {
		r.podNotes.forgetWarning(missingLockWarning(res.gated[i].UID, lock.Name))
	}
	if lock.Spec.Candidates != nil {
		for i := range res.gated {
			r.warnPodOnce(&res.gated[i], string(res.gated[i].UID)+"/candidates/"+lock.Name, EventLockMissing, fmt.Sprintf(
				"DistributedLock %s is in candidates mode, which admits no pods: the pod stays gated", lock.Name))
		}
		return res, nil
	}
	// 1. The grant the controller holds for an admitted pod: renewed, or
	//    ended (which may hand the lock to the next place).
	confirmed, err := r.tendAdmittedGrant(ctx, p, pods, &res)
	if err != nil {
		return res, err
	}
	// 2. The queue holds exactly the waiting pods' places (a registration
	//    alone wakes no pass: the steps below act on it in this one).
	if err := r.syncPodPlaces(ctx, p, &res); err != nil {
		return res, err
	}
	// 3. A grant handed to a pod's place, or a free lock whose head is a
	//    waiting pod: the controller takes the grant for the pod.
	took, err := r.takeGrantForPod(ctx, p, &res)
	if err != nil {
		return res, err
	}
	// 4. The pod whose grant is confirmed loses its gate.
	return res, r.admitHolder(ctx, p, &res, confirmed || took)
}

// runsHoldingPods are the cached participant pods of the lock's namespace
// whose runs-holding annotation names the lock, oldest first.
func (r *DistributedLockReconciler) runsHoldingPods(ctx context.Context, lock *locksv1alpha1.DistributedLock) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(lock.Namespace)); err != nil {
		return nil, fmt.Errorf("listing pods that run holding %s: %w", lock.Name, err)
	}
	out := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
		return p.Annotations[locksv1alpha1.RunsHoldingAnnotation] != lock.Name
	})
	slices.SortFunc(out, func(a, b corev1.Pod) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

// waitingForAdmission: the pod carries the admission gate and is neither
// terminating nor finished.
func waitingForAdmission(p *corev1.Pod) bool {
	return gated(p) && p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// gated reports whether the pod carries the admission gate.
func gated(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == locksv1alpha1.AdmissionGate
	})
}

// podByIdentity is the pod of pods that identity ("<pod>_<uid>") names.
func podByIdentity(pods []corev1.Pod, identity string) *corev1.Pod {
	for i := range pods {
		if candidateIdentity(&pods[i]) == identity {
			return &pods[i]
		}
	}
	return nil
}

// takeGrantForPod makes the current grant the controller's on a waiting
// pod's behalf when it is the pod's turn: a release handed the lock to the
// pod's place (one write names the grant the controller's and renews it),
// or the lock is free and the pod's place is at the head of the queue (one
// write grants it, with the next token, and takes the place out). A grant
// handed to the place of a pod that no longer waits is ended at once: no
// pod ran with it. The waiting pods are res.gated. It reports whether it
// wrote a grant that is now the controller's.
func (r *DistributedLockReconciler) takeGrantForPod(ctx context.Context, p *pass, res *admissionResult) (bool, error) {
	lock, waiting, now := p.lock, res.gated, p.now
	current := res.lease
	holder := lease.Holder(current)
	if isAdmittedGrant(current) {
		return false, nil
	}
	if holder != "" {
		ticket := current.Annotations[locksv1alpha1.TicketAnnotation]
		if !strings.HasPrefix(ticket, podTicketPrefix) || locksv1alpha1.PodUIDOf(holder) != strings.TrimPrefix(ticket, podTicketPrefix) {
			return false, nil // a holder of the library or kubectl dlock
		}
		pod := podByIdentity(waiting, holder)
		if pod == nil {
			return r.endAdmittedGrant(ctx, p, res, fmt.Sprintf(
				"the lock was handed to pod %s, which no longer waits for it (it never ran)", locksv1alpha1.PodNameOf(holder)))
		}
		taken := lease.Renew(current, lease.GrantDuration(current, lockDuration(lock)), now)
		if taken.Annotations == nil {
			taken.Annotations = map[string]string{}
		}
		taken.Annotations[locksv1alpha1.AdmittedGrantAnnotation] = admittedMark(holder, lease.Token(taken))
		updated, err := r.writeLease(ctx, taken)
		if err != nil {
			return false, fmt.Errorf("taking up the grant handed to pod %s: %w", pod.Name, err)
		}
		res.lease = updated
		return true, nil
	}
	q := lease.Queue(current)
	if len(q) == 0 {
		return false, nil
	}
	pod := podByIdentity(waiting, q[0].Identity)
	if pod == nil || q[0].Ticket != podTicket(pod) {
		return false, nil
	}
	return true, r.grantForPod(ctx, p, res, pod)
}

// grantForPod grants the free lock to pod, whose place heads the queue.
func (r *DistributedLockReconciler) grantForPod(ctx context.Context, p *pass, res *admissionResult, pod *corev1.Pod) error {
	identity := candidateIdentity(pod)
	patch, err := lease.GrantPatch(res.lease, identity, r.Principal, podTicket(pod), string(pod.UID), lockDuration(p.lock), p.now)
	if err != nil {
		return fmt.Errorf("granting the lock to pod %s: %w", pod.Name, err)
	}
	patch.Set(lease.AnnotationPath(locksv1alpha1.AdmittedGrantAnnotation), admittedMark(identity, lease.Token(res.lease)+1))
	granted, err := patch.ApplyTo(res.lease)
	if err != nil {
		return fmt.Errorf("granting the lock to pod %s: %w", pod.Name, err)
	}
	updated, err := r.writeLease(ctx, granted)
	if err != nil {
		return fmt.Errorf("granting the lock to pod %s: %w", pod.Name, err)
	}
	res.lease = updated
	return nil
}

// admitHolder removes the gate of the pod the controller holds the grant
// for, in one Update of the pod read from the apiserver that also writes
// the grant's token and time (and the holder label): the pod is ungated
// carrying its token. The grant must have been confirmed by a Lease write
// of this pass; if none was made, a renewal confirms it first. The
// admission is reported only by the pass whose Update removed the gate.
func (r *DistributedLockReconciler) admitHolder(ctx context.Context, p *pass, res *admissionResult, confirmed bool) error {
	lock := p.lock
	holder := lease.Holder(res.lease)
	if !isAdmittedGrant(res.lease) {
		return nil
	}
	waiting := podByIdentity(res.gated, holder)
	if waiting == nil {
		return nil
	}
	// A copy: removing the pod from res.gated below moves the pods after it
	// into its element (and zeroes the last), so a pointer into res.gated
	// would name the next pod, or none.
	pod := waiting.DeepCopy()
	if !confirmed {
		renewed := lease.Renew(res.lease, lease.GrantDuration(res.lease, lockDuration(lock)), p.now)
		updated, err := r.writeLease(ctx, renewed)
		if err != nil {
			return fmt.Errorf("confirming the grant of pod %s before admitting it: %w", pod.Name, err)
		}
		res.lease = updated
	}
	ungated, err := r.ungate(ctx, lock, pod, res.lease)
	if err != nil {
		return err
	}
	res.gated = slices.DeleteFunc(res.gated, func(p corev1.Pod) bool { return p.UID == pod.UID })
	res.renewIn = earliest(res.renewIn, p.renewInterval())
	if ungated {
		r.reportAdmission(lock, pod, lease.Token(res.lease), res)
	}
	return nil
}

// reportAdmission reports that pod was admitted with token: its wait
// observed, an Event on the pod and one on the lock (res.events), and its
// missing gate noted as the controller's doing (no NotGated warning).
func (r *DistributedLockReconciler) reportAdmission(lock *locksv1alpha1.DistributedLock, pod *corev1.Pod, token int64,
	res *admissionResult) {
	r.podNotes.firstWarning(string(pod.UID) + "/ungated/" + lock.Name)
	wait := r.Clock.Now().Sub(pod.CreationTimestamp.Time)
	podAdmissionWait.WithLabelValues(lock.Namespace).Observe(wait.Seconds())
	msg := fmt.Sprintf("admitted pod %s with fencing token %d after %s gated", pod.Name, token, wait.Round(time.Millisecond))
	res.events = append(res.events, lockEvent{corev1.EventTypeNormal, EventPodAdmitted, msg})
	r.Recorder.Eventf(pod, lock, corev1.EventTypeNormal, EventPodAdmitted, "Admit", "%s", msg)
}

// ungate writes the grant's token and acquire time (and the holder label)
// on the pod and removes its admission gate, in one Update of the pod as
// the apiserver has it, refused if that pod is another (UID) or changed
// meanwhile. It reports whether it removed the gate: not when the pod is
// gone or another, or no longer gated (an earlier pass admitted it, and the
// cache does not show that yet). For a pod gone, the pass its deletion
// brings judges the grant's end by what the watch proved (admittedFate):
// at once with proof, else the lease waited out.
func (r *DistributedLockReconciler) ungate(ctx context.Context, lock *locksv1alpha1.DistributedLock, cached *corev1.Pod,
	l *coordinationv1.Lease) (bool, error) {
	pod := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: cached.Namespace, Name: cached.Name}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading pod %s to admit it: %w", cached.Name, err)
	}
	if pod.UID != cached.UID || !gated(pod) {
		return false, nil
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Annotations[locksv1alpha1.TokenAnnotationKey(lock.Name)] = strconv.FormatInt(lease.Token(l), 10)
	if l.Spec.AcquireTime != nil {
		pod.Annotations[locksv1alpha1.AcquiredAnnotationKey(lock.Name)] = l.Spec.AcquireTime.UTC().Format(time.RFC3339Nano)
	}
	pod.Labels[locksv1alpha1.HolderLabelKey(lock.Name)] = "true"
	pod.Spec.SchedulingGates = slices.DeleteFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == locksv1alpha1.AdmissionGate
	})
	if err := r.Update(ctx, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("admitting pod %s (token annotation, gate removal): %w", pod.Name, err)
	}
	return true, nil
}

// syncPodPlaces registers a place for each waiting pod that has none
// (oldest first, behind everyone queued) and removes the places of pods
// that no longer wait.
func (r *DistributedLockReconciler) syncPodPlaces(ctx context.Context, p *pass, res *admissionResult) error {
	lock, now := p.lock, p.now
	current := res.lease
	waitingTickets := map[string]bool{}
	var missing []lease.Waiter
	queued := map[string]bool{}
	for _, w := range lease.Queue(current) {
		queued[w.Ticket] = true
	}
	holder := lease.Holder(current)
	for i := range res.gated {
		pod := &res.gated[i]
		waitingTickets[podTicket(pod)] = true
		if queued[podTicket(pod)] || candidateIdentity(pod) == holder {
			continue
		}
		if allowed, err := r.podMayUseLock(ctx, lock, current.Name, pod, now); err != nil || !allowed {
			// Not queued: it may be allowed later (asked again then).
			res.renewIn = earliest(res.renewIn, deniedCheckInterval)
			if err != nil {
				return err
			}
			continue
		}
		if !r.usableIdentity(pod, lock.Name) {
			continue
		}
		missing = append(missing, lease.Waiter{Identity: candidateIdentity(pod), Ticket: podTicket(pod), Principal: r.Principal})
	}
	var stale []string
	podPlaces := 0
	for t := range queued {
		if strings.HasPrefix(t, podTicketPrefix) && !waitingTickets[t] {
			stale = append(stale, t)
		} else if strings.HasPrefix(t, podTicketPrefix) {
			podPlaces++
		}
	}
	missing = missing[:min(len(missing), podPlacesRoom(podPlaces, len(queued)))]
	if len(missing) > 0 {
		registered, err := lease.Registered(current, missing)
		if err != nil {
			return fmt.Errorf("queueing %d gated pods: %w", len(missing), err)
		}
		if current, err = r.writeLease(ctx, registered); err != nil {
			return fmt.Errorf("queueing %d gated pods: %w", len(missing), err)
		}
		res.lease = current
		r.tellQueued(lock, res, missing)
	}
	return r.removePodPlaces(ctx, res, stale)
}

// tellQueued records on each pod just queued where it stands in the lock's
// queue, as res.lease shows it, and who holds the lock.
func (r *DistributedLockReconciler) tellQueued(lock *locksv1alpha1.DistributedLock, res *admissionResult, queued []lease.Waiter) {
	q := lease.Queue(res.lease)
	holder := lease.Holder(res.lease)
	if holder == "" {
		holder = "nobody"
	}
	for _, w := range queued {
		at := slices.IndexFunc(q, func(o lease.Waiter) bool { return o.Ticket == w.Ticket })
		pod := slices.IndexFunc(res.gated, func(p corev1.Pod) bool { return podTicket(&p) == w.Ticket })
		if at < 0 || pod < 0 {
			continue
		}
		r.Recorder.Eventf(&res.gated[pod], nil, corev1.EventTypeNormal, EventPodQueued, "Admit",
			"queued for DistributedLock %s at position %d of %d (held by %s); the pod stays gated until its turn", lock.Name, at+1, len(q), holder)
	}
}

// maxPodPlaces bounds the places the controller holds in one lock's queue
// for gated pods: whoever may create pods cannot fill the queue (or the
// Lease) so that nobody else can register. The pods beyond it stay gated,
// and are queued, oldest first, as places free up.
const maxPodPlaces = 64

// podPlacesRoom is how many more gated pods may be queued when podPlaces of
// the queued places are pods'.
func podPlacesRoom(podPlaces, queued int) int {
	return max(0, min(maxPodPlaces-podPlaces, lease.MaxPlaces-queued))
}

// removePodPlaces removes the places of pods that no longer wait.
func (r *DistributedLockReconciler) removePodPlaces(ctx context.Context, res *admissionResult, tickets []string) error {
	p := lease.RemovePlacesPatch(res.lease, tickets)
	if p == nil {
		return nil
	}
	removed, err := p.ApplyTo(res.lease)
	if err != nil {
		return fmt.Errorf("removing the places of pods that no longer wait: %w", err)
	}
	if res.lease, err = r.writeLease(ctx, removed); err != nil {
		return fmt.Errorf("removing the places of pods that no longer wait: %w", err)
	}
	return nil
}
