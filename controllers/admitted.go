package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The controller holds an admitted pod's grant, renewing it every third of
// the lease duration (judged on its monotonic clock, like its candidates'
// grants), until the pod is finished, and then ends it:
//   - at once when the pod is proven finished: phase Succeeded or Failed as
//     its kubelet reports it; deleted while not bound to a node (it never
//     ran); gone after a graceful deletion that the watch showed (its
//     kubelet confirmed its containers stopped);
//   - a lease duration after it stopped renewing, and after it first saw the
//     cause, when the pod went without proof (a force deletion, a deletion
//     this process did not see) or its node stopped reporting (NotReady or
//     unreachable): the pod may still run, and whatever it writes then
//     carries a token the next grant fences.
// Ending hands the lock to the head of the queue in the same write, or
// releases it.

// tendAdmittedGrant renews or ends the grant the controller holds for an
// admitted pod, if it holds one. It reports whether a write of this pass
// confirmed that the grant is still the controller's (a renewal).
func (r *DistributedLockReconciler) tendAdmittedGrant(ctx context.Context, p *pass, pods []corev1.Pod, res *admissionResult) (bool, error) {
	lock := p.lock
	holder := lease.Holder(res.lease)
	if !isAdmittedGrant(res.lease) {
		return false, nil
	}
	// The pod as the cache shows it, or, when the cache does not hold it
	// (its participant label or its runs-holding annotation was changed
	// after its admission), as the apiserver does.
	// The start timeout is enforced on it either way.
	if podByIdentity(pods, holder) == nil {
		live, err := r.livePod(ctx, lock.Namespace, holder)
		if err != nil {
			return false, err
		}
		if live != nil {
			pods = append(slices.Clip(pods), *live)
		}
	}
	why, wait, err := r.admittedFate(ctx, p, pods, holder)
	switch {
	case err != nil:
		return false, err
	case why != "":
		return r.endAdmittedGrant(ctx, p, res, why)
	case wait > 0:
		res.renewIn = wait
		return false, nil
	}
	startIn, timedOut, err := r.enforceStart(ctx, p, pods, holder)
	if err != nil {
		return false, err
	}
	if timedOut != nil {
		res.events = append(res.events, *timedOut)
	}
	renewed, err := r.renewCandidate(ctx, p, res.lease)
	if err != nil {
		return false, fmt.Errorf("renewing the grant of admitted pod %s: %w", locksv1alpha1.PodNameOf(holder), err)
	}
	wrote := renewed.lease != res.lease
	res.lease, res.renewIn = renewed.lease, earliest(renewed.renewIn, startIn)
	return wrote, nil
}

// admittedFate judges the grant held for the pod identity names: why to
// end it now (""), else how long until it may be ended (zero: renew it).
func (r *DistributedLockReconciler) admittedFate(ctx context.Context, p *pass, pods []corev1.Pod,
	identity string) (why string, wait time.Duration, err error) {
	lock := p.lock
	uid := types.UID(locksv1alpha1.PodUIDOf(identity))
	pod := podByIdentity(pods, identity)
	if pod == nil {
		if pod, err = r.livePod(ctx, lock.Namespace, identity); err != nil {
			return "", 0, err
		}
	}
	name := locksv1alpha1.PodNameOf(identity)
	switch {
	case pod == nil && r.podNotes.endOf(uid) == endNeverBound:
		return fmt.Sprintf("pod %s was deleted before it was bound to a node (it never ran)", name), 0, nil
	case pod == nil && r.podNotes.endOf(uid) == endGraceful:
		return fmt.Sprintf("pod %s is gone after a graceful deletion (its kubelet reported its containers stopped)", name), 0, nil
	case pod == nil:
		return r.waitOut(p, "gone/"+string(uid),
			fmt.Sprintf("pod %s went without a confirmed stop (force deletion): waited out the lease duration", name))
	case terminal(pod) && containersStopped(pod, r.phases.noted(pod)):
		return fmt.Sprintf("pod %s %s", name, pod.Status.Phase), 0, nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return r.waitOut(p, "finished/"+string(uid), fmt.Sprintf(
			"pod %s is %s without its containers reported stopped (the pod garbage collector, a lost node): waited out the lease duration", name, pod.Status.Phase))
	case pod.DeletionTimestamp != nil && pod.Spec.NodeName == "":
		return fmt.Sprintf("pod %s was deleted before it was bound to a node (it never ran)", name), 0, nil
	case pod.Spec.NodeName == "":
		return "", 0, nil
	}
	reporting, err := r.nodeReporting(ctx, pod.Spec.NodeName)
	if err != nil || reporting {
		r.podNotes.clear("node/" + string(uid))
		return "", 0, err
	}
	return r.waitOut(p, "node/"+string(uid), fmt.Sprintf(
		"node %s of pod %s stopped reporting: waited out the lease duration (the pod may still run, fenced)", pod.Spec.NodeName, name))
}

// waitOut ends the grant (returns why) once the controller has seen its
// record unrenewed for the lease duration and the cause (key) has lasted
// as long since it first noted it; otherwise it returns the wait left.
func (r *DistributedLockReconciler) waitOut(p *pass, key, why string) (string, time.Duration, error) {
	obs, lock, now := p.obs, p.lock, p.now
	d := obs.Record.Duration(lockDuration(lock))
	due := obs.Deadline(lockDuration(lock))
	if since := r.podNotes.sinceFirst(key, now).Add(d); since.After(due) {
		due = since
	}
	if now.Before(due) {
		return "", due.Sub(now), nil
	}
	return why, 0, nil
}

// livePod reads the pod identity names from the apiserver (the cache holds
// participant pods only): nil when it is gone or replaced (another UID).
func (r *DistributedLockReconciler) livePod(ctx context.Context, namespace, identity string) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: locksv1alpha1.PodNameOf(identity)}, pod)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading admitted pod %s: %w", locksv1alpha1.PodNameOf(identity), err)
	}
	if string(pod.UID) != locksv1alpha1.PodUIDOf(identity) {
		return nil, nil
	}
	return pod, nil
}

// nodeReporting reports whether the node is reporting: it exists, its
// Ready condition is True and it carries no unreachable taint.
func (r *DistributedLockReconciler) nodeReporting(ctx context.Context, name string) (bool, error) {
	node := &corev1.Node{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading node %s: %w", name, err)
	}
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable {
			return false, nil
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// endAdmittedGrant ends the grant the controller holds (or was handed) for
// a pod: it hands the lock to the head of the queue in the same write, or
// releases it. When the head is a waiting pod's place, the same write
// makes the new grant the controller's on that pod's behalf, and it
// reports true.
func (r *DistributedLockReconciler) endAdmittedGrant(ctx context.Context, p *pass, res *admissionResult, why string) (bool, error) {
	current := res.lease
	holder := lease.Holder(current)
	patch, head, handOff, err := lease.HandOffPatch(current, holder, lockDuration(p.lock), p.now)
	if err != nil {
		return false, fmt.Errorf("ending the grant of pod %s: %w", locksv1alpha1.PodNameOf(holder), err)
	}
	if !handOff {
		patch = lease.ReleasePatch(current)
	}
	ended, err := patch.ApplyTo(current)
	if err != nil {
		return false, fmt.Errorf("ending the grant of pod %s: %w", locksv1alpha1.PodNameOf(holder), err)
	}
	delete(ended.Annotations, locksv1alpha1.AdmittedGrantAnnotation)
	next := handOff && podByIdentity(res.gated, head.Identity) != nil && head.Ticket == podTicketPrefix+locksv1alpha1.PodUIDOf(head.Identity)
	if next && ended.Annotations == nil {
		ended.Annotations = map[string]string{}
	}
	if next {
		ended.Annotations[locksv1alpha1.AdmittedGrantAnnotation] = admittedMark(head.Identity, lease.Token(ended))
	}
	updated, err := r.writeLease(ctx, ended)
	if err != nil {
		return false, fmt.Errorf("ending the grant of pod %s: %w", locksv1alpha1.PodNameOf(holder), err)
	}
	res.lease = updated
	msg := fmt.Sprintf("%s: ended its grant (fencing token %d)", why, lease.Token(current))
	if handOff {
		msg += fmt.Sprintf(" and handed the lock to %s", head.Identity)
	}
	res.events = append(res.events, lockEvent{corev1.EventTypeNormal, EventPodReleased, msg})
	return next, nil
}

// admittedMark is the value of AdmittedGrantAnnotation for the grant the
// controller holds for an admitted pod: its identity and its fencing
// token. A mark left behind by a grant that a break or a release ended
// names an old token, so it never makes a later grant under the same
// identity (anyone may claim one) pass for the controller's.
func admittedMark(identity string, token int64) string {
	return identity + "," + strconv.FormatInt(token, 10)
}

// isAdmittedGrant reports whether l's current grant is one the controller
// holds for an admitted pod: the mark names its holder and its token.
func isAdmittedGrant(l *coordinationv1.Lease) bool {
	if l == nil || lease.Holder(l) == "" {
		return false
	}
	return l.Annotations[locksv1alpha1.AdmittedGrantAnnotation] == admittedMark(lease.Holder(l), lease.Token(l))
}
