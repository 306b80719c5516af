package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The queue keeps no entry that nobody can read or remove. Under the
// lease-guard policy participants write only places of the grammar, but a
// Lease may carry others: written before the policy was installed, by a
// cluster admin, or by an earlier version. And a place outlives the pod
// that took it when the pod is deleted without leaving the queue. The
// controller removes, in one patch that tests each value it removes:
//   - queue keys outside the grammar (lease.ParsePlace, or no queued-by
//     principal of the grammar), which lease.Queue and the guard leave out;
//   - queued-by keys whose place is gone;
//   - front labels whose ticket is no longer queued;
//   - the places of a pod principal whose pod no longer exists (looked up
//     by the name its identity gives, else among the pods of its
//     ServiceAccount's namespace), checked again every podCheckInterval.
// A QueueRepaired event says what went and why.

// podCheckInterval is how long a pod principal seen alive is not looked up
// again.
const podCheckInterval = 30 * time.Second

// podsAlive remembers, per pod UID, when the pod was last seen to exist.
type podsAlive struct {
	mu    sync.Mutex
	alive map[types.UID]time.Time
}

func newPodsAlive() *podsAlive {
	return &podsAlive{alive: map[types.UID]time.Time{}}
}

// repairQueue removes what of l's queue nobody can read or remove (see
// above) and returns the Lease as written (l when nothing went), the event
// saying what went, and when to look at the pod principals again (zero:
// none queued).
func (r *DistributedLockReconciler) repairQueue(ctx context.Context, l *coordinationv1.Lease, now time.Time) (*coordinationv1.Lease, *lockEvent, time.Duration, error) {
	unreadable := unreadableQueueKeys(l)
	gone, recheck, err := r.gonePodPlaces(ctx, l, now)
	if err != nil {
		return l, nil, 0, err
	}
	if len(unreadable.annotations)+len(unreadable.labels)+len(gone) == 0 {
		return l, nil, recheck, nil
	}
	p := &lease.Patch{}
	for _, key := range unreadable.annotations {
		p.Test(lease.AnnotationPath(key), l.Annotations[key])
		p.Remove(lease.AnnotationPath(key))
	}
	for _, key := range unreadable.labels {
		p.Test(lease.LabelPath(key), l.Labels[key])
		p.Remove(lease.LabelPath(key))
	}
	if removed := lease.RemovePlacesPatch(l, gone); removed != nil {
		p.Append(removed)
	}
	written := l.DeepCopy()
	if err := r.Patch(ctx, written, client.RawPatch(types.JSONPatchType, p.Bytes())); err != nil {
		if lease.PatchDidNotApply(err) {
			return l, nil, recheck, nil // the queue changed meanwhile: the next pass judges afresh
		}
		return l, nil, 0, fmt.Errorf("removing unreadable or orphaned entries from the queue of lease %s: %w", l.Name, err)
	}
	return written, queueRepairedEvent(unreadable, gone), recheck, nil
}

// queueKeys are annotation and label keys of a Lease's queue.
type queueKeys struct{ annotations, labels []string }

// unreadableQueueKeys are l's queue entries outside the grammar, queued-by
// keys without their place, and front labels of tickets not queued.
func unreadableQueueKeys(l *coordinationv1.Lease) queueKeys {
	queued := map[string]bool{}
	for _, w := range lease.Queue(l) {
		queued[w.Ticket] = true
	}
	var out queueKeys
	for key := range l.Annotations {
		if ticket, ok := strings.CutPrefix(key, locksv1alpha1.QueueEntryPrefix); ok && !queued[ticket] {
			out.annotations = append(out.annotations, key)
		}
		if ticket, ok := strings.CutPrefix(key, locksv1alpha1.QueuedByPrefix); ok && !queued[ticket] {
			out.annotations = append(out.annotations, key)
		}
	}
	for key := range l.Labels {
		if ticket, ok := strings.CutPrefix(key, locksv1alpha1.FrontLabelPrefix); ok && !queued[ticket] {
			out.labels = append(out.labels, key)
		}
	}
	slices.Sort(out.annotations)
	slices.Sort(out.labels)
	return out
}

// gonePodPlaces are the tickets of l's places whose principal is a pod that
// no longer exists, and when to look again at those that do.
func (r *DistributedLockReconciler) gonePodPlaces(ctx context.Context, l *coordinationv1.Lease, now time.Time) ([]string, time.Duration, error) {
	var gone []string
	var recheck time.Duration
	lookup := podLookup{r: r, listed: map[string]map[types.UID]bool{}}
	for _, w := range lease.Queue(l) {
		uid := types.UID(lease.PrincipalPodUID(w.Principal))
		namespace := serviceAccountNamespace(lease.PrincipalUser(w.Principal))
		if uid == "" || namespace == "" {
			continue // not a pod's principal: nothing to look up, nothing removed
		}
		if r.pods.seenSince(uid, now.Add(-podCheckInterval)) {
			recheck = podCheckInterval
			continue
		}
		exists, err := lookup.exists(ctx, namespace, uid, w.Identity)
		if err != nil {
			return nil, 0, err
		}
		r.pods.note(uid, exists, now)
		if !exists {
			gone = append(gone, w.Ticket)
			continue
		}
		recheck = podCheckInterval
	}
	return gone, recheck, nil
}

// seenSince reports whether the pod uid was seen to exist after since.
func (p *podsAlive) seenSince(uid types.UID, since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alive[uid].After(since)
}

// note records whether the pod uid exists, as of now.
func (p *podsAlive) note(uid types.UID, exists bool, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !exists {
		delete(p.alive, uid) // a UID never comes back
		return
	}
	for u, at := range p.alive {
		if now.Sub(at) > 10*podCheckInterval {
			delete(p.alive, u) // not queued any more: forgotten
		}
	}
	p.alive[uid] = now
}

// podLookup looks pods up by UID from the apiserver, listing each
// namespace at most once.
type podLookup struct {
	r      *DistributedLockReconciler
	listed map[string]map[types.UID]bool
}

// exists reports whether a pod with uid exists in namespace: the pod
// identity names when it carries that UID, else any pod of the namespace.
func (p podLookup) exists(ctx context.Context, namespace string, uid types.UID, identity string) (bool, error) {
	// By name only when the identity gives a name a pod can have: a
	// participant chooses its place's identity, and a lookup the apiserver
	// refuses ("name is required") must not stop the repair.
	if name := locksv1alpha1.PodNameOf(identity); locksv1alpha1.PodUIDOf(identity) == string(uid) && len(validation.IsDNS1123Subdomain(name)) == 0 {
		pod := &metav1.PartialObjectMetadata{}
		pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
		err := p.r.APIReader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pod)
		if err == nil || apierrors.IsNotFound(err) {
			return err == nil && pod.UID == uid, nil
		}
		return false, fmt.Errorf("looking up pod %s/%s: %w", namespace, name, err)
	}
	if uids, ok := p.listed[namespace]; ok {
		return uids[uid], nil
	}
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := p.r.APIReader.List(ctx, pods, client.InNamespace(namespace)); err != nil {
		return false, fmt.Errorf("listing the pods of namespace %s: %w", namespace, err)
	}
	uids := make(map[types.UID]bool, len(pods.Items))
	for _, pod := range pods.Items {
		uids[pod.UID] = true
	}
	p.listed[namespace] = uids
	return uids[uid], nil
}

// serviceAccountNamespace is the namespace of a ServiceAccount's user part
// ("user=system:serviceaccount:<namespace>:<name>"), or "".
func serviceAccountNamespace(user string) string {
	rest, ok := strings.CutPrefix(user, "user=system:serviceaccount:")
	if !ok {
		return ""
	}
	namespace, _, ok := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	return namespace
}

// queueRepairedEvent says what repairQueue removed.
func queueRepairedEvent(unreadable queueKeys, gone []string) *lockEvent {
	var parts []string
	if n := len(unreadable.annotations); n > 0 {
		parts = append(parts, fmt.Sprintf("%d queue entries nobody can read (outside the grammar, or without their place): %s",
			n, strings.Join(unreadable.annotations, ", ")))
	}
	if n := len(unreadable.labels); n > 0 {
		parts = append(parts, fmt.Sprintf("%d front labels of tickets no longer queued", n))
	}
	if n := len(gone); n > 0 {
		parts = append(parts, fmt.Sprintf("%d places of pods that no longer exist: %s", n, strings.Join(gone, ", ")))
	}
	return &lockEvent{corev1.EventTypeWarning, EventQueueRepaired, "removed " + strings.Join(parts, "; ")}
}
