package controllers

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// podEnd is what the pod watch proved about how a pod went away.
type podEnd int

const (
	// endUnknown: nothing proven (a force deletion, a deletion this process
	// did not watch, a pod it never saw): the grant is waited out.
	endUnknown podEnd = iota
	// endNeverBound: the pod was deleted while not bound to a node (as the
	// apiserver stored it last): it never ran.
	endNeverBound
	// endGraceful: the pod was seen terminating with a grace period on its
	// node and then went: its kubelet confirmed its containers stopped.
	endGraceful
)

// podNotes remembers, per pod UID, what the pod watch showed that a later
// read cannot: that a pod was deleted gracefully, or while unbound, and
// since when (on the controller's monotonic clock) an admitted pod has been
// gone or on a node that stopped reporting. After a restart it is empty:
// every end is then unproven, and waits are counted afresh (the
// conservative direction).
type podNotes struct {
	mu       sync.Mutex
	graceful map[types.UID]bool
	ended    map[types.UID]endNote
	since    map[string]time.Time
	warned   map[string]bool
}

func newPodNotes() *podNotes {
	return &podNotes{graceful: map[types.UID]bool{}, ended: map[types.UID]endNote{},
		since: map[string]time.Time{}, warned: map[string]bool{}}
}

// saw notes a pod as an event shows it: terminating with a grace period
// while bound to a node. The first such sighting decides whether the
// graceful deletion can prove the pod stopped: not when its containers
// were already reported stopped (a report a restart may have outdated,
// which the kubelet did not make in answer to the deletion), unless the
// pod was finished then (a terminal phase the kubelet set, as first seen:
// kubeletPhase; nothing restarts in it).
func (n *podNotes) saw(p *corev1.Pod, kubeletPhase bool) {
	g := p.DeletionGracePeriodSeconds
	if p.DeletionTimestamp == nil || g == nil || *g <= 0 || p.Spec.NodeName == "" {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, seen := n.graceful[p.UID]; !seen {
		reported := len(p.Spec.Containers) > 0 && allTerminated(containerNames(p.Spec.Containers), p.Status.ContainerStatuses)
		n.graceful[p.UID] = !reported || terminal(p) && kubeletPhase
	}
}

// endNote is how a pod went, and when the watch showed it.
type endNote struct {
	end podEnd
	at  time.Time
}

// deleted notes how the pod went, from its last stored state (kubeletPhase:
// whether the kubelet set a terminal phase, as first seen), as of now;
// unknown (a missed deletion, a tombstone) proves nothing. Ends noted more
// than deathRetention before now are forgotten (an admitted pod's grant is
// judged on its pod's delete event; a later pass without the note waits
// the grant out).
func (n *podNotes) deleted(p *corev1.Pod, unknown, kubeletPhase bool, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for uid, e := range n.ended {
		if now.Sub(e.at) > deathRetention {
			delete(n.ended, uid)
		}
	}
	switch {
	case unknown:
	case p.Spec.NodeName == "":
		n.ended[p.UID] = endNote{endNeverBound, now}
	case n.graceful[p.UID] && containersStopped(p, kubeletPhase):
		// The kubelet reported every container terminated, then removed
		// the pod: a force deletion of a pod still terminating shows them
		// running.
		n.ended[p.UID] = endNote{endGraceful, now}
	}
	delete(n.graceful, p.UID)
}

// mayProve reports whether p's delete event would prove how it ended (see
// deleted): only then is the deletion worth checking with the apiserver.
func (n *podNotes) mayProve(p *corev1.Pod, kubeletPhase bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return p.Annotations[locksv1alpha1.RunsHoldingAnnotation] != "" &&
		(p.Spec.NodeName == "" || n.graceful[p.UID] && containersStopped(p, kubeletPhase))
}

// endOf is what is proven about how the pod with uid went.
func (n *podNotes) endOf(uid types.UID) podEnd {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ended[uid].end
}

// sinceFirst is when the condition key was first noted (now, if this is
// the first time).
func (n *podNotes) sinceFirst(key string, now time.Time) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t, ok := n.since[key]; ok {
		return t
	}
	n.since[key] = now
	return now
}

// clear forgets that the condition key was noted.
func (n *podNotes) clear(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.since, key)
}

// firstWarning reports whether the warning key is new (and notes it), so a
// warning about a pod is sent once, not on every event.
func (n *podNotes) firstWarning(key string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.warned[key] {
		return false
	}
	n.warned[key] = true
	return true
}

// forgetWarning lets the warning key be sent again.
func (n *podNotes) forgetWarning(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.warned, key)
}

// podEvents notes what each pod event shows (podNotes), warns about pods
// that opt in wrongly, and maps the event to the locks it matters to.
func (r *DistributedLockReconciler) podEvents() handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	enqueue := func(ctx context.Context, obj client.Object, q queue) {
		if p, ok := obj.(*corev1.Pod); ok {
			r.podNotes.saw(p, r.phases.saw(p))
		}
		for _, req := range r.locksForPod(ctx, obj) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { enqueue(ctx, e.Object, q) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) { enqueue(ctx, e.ObjectNew, q) },
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) {
			if p, ok := e.Object.(*corev1.Pod); ok {
				byKubelet := r.phases.forget(p, r.Clock.Now())
				r.podNotes.saw(p, byKubelet)
				unknown := e.DeleteStateUnknown || !r.podNotes.mayProve(p, byKubelet) || !r.deletedAt(ctx, p)
				r.podNotes.deleted(p, unknown, byKubelet, r.Clock.Now())
			}
			enqueue(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q queue) { enqueue(ctx, e.Object, q) },
	}
}

// containersStopped reports whether p's status, as its kubelet wrote it,
// shows every container of p terminated (and not as ContainerStatusUnknown,
// the kubelet's guess when its runtime lost a container): the proof that
// it stopped. A terminal phase must be the kubelet's, as the controller
// first saw it (kubeletPhase), without the pod garbage collector's mark:
// the pod garbage collector marks pods Failed over whatever statuses their
// cut-off kubelet last wrote, and a force deletion removes them, without
// it.
func containersStopped(p *corev1.Pod, kubeletPhase bool) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Reason == "DeletionByPodGC" {
			return false
		}
	}
	return len(p.Spec.Containers) > 0 && allTerminated(containerNames(p.Spec.Containers), p.Status.ContainerStatuses) &&
		(!terminal(p) || kubeletPhase)
}

// deletedAt reports whether the pod of a delete event was deleted at the
// event's resourceVersion. The cache holds participant pods only: a pod
// whose participant label is removed leaves it with a delete event too,
// carrying its last state as a participant, while it lives on (and may be
// bound and run later). So the event proves a deletion only if the pod
// is not there as of the event's own revision (a list at exactly that
// resourceVersion); when that cannot be read (compacted since), it proves
// nothing.
func (r *DistributedLockReconciler) deletedAt(ctx context.Context, p *corev1.Pod) bool {
	if r.APIReader == nil || p.ResourceVersion == "" {
		return false
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	err := r.APIReader.List(ctx, list, client.InNamespace(p.Namespace), client.MatchingFields{"metadata.name": p.Name},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: p.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact}})
	if err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("could not tell whether a pod that left the cache was deleted: taking it as unproven",
			"pod", klog.KObj(p), "resourceVersion", p.ResourceVersion, "error", err.Error())
		return false
	}
	return !slices.ContainsFunc(list.Items, func(m metav1.PartialObjectMetadata) bool { return m.UID == p.UID })
}
