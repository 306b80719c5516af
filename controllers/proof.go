package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Failover on proof. A grant made by a request with a pod-bound
// ServiceAccount token records the pod's UID in its principal
// (locks.frontdesk.dev/holder-principal, "pod=<uid> user=..."): the
// apiserver wrote it from the token, so it names the pod whose token made
// the grant, whatever the holder's identity says. When that pod is proven
// dead, no process of it holds the grant any more, and the controller ends
// the grant at once, as it ends a lapsed one (markLapsed), instead of
// waiting out the lease. The proofs (docs/design.md, "Failover on proof"):
//   - finished: the pod is Succeeded or Failed and every container it has
//     (init, sidecar, application, ephemeral) has a terminated status, as
//     its kubelet wrote them; a terminal pod never runs again. The pod
//     garbage collector's Failed (it marks pods of lost nodes, whose
//     containers may still run) is not proof, nor is a container that is
//     waiting (it may have been restarted since its kubelet last wrote).
//   - deleted: the watch showed the pod deleted, and its final state (the
//     delete event's own object, not a tombstone of a missed deletion) was
//     finished as above.
// Nothing else is proof: a NotReady or unreachable node, a force deletion
// of a pod still running, a container restart (a new instance may have
// taken a grant before its kubelet reported it started), a deletion the
// watch did not show, a principal that names no pod, a pod that is not of
// the principal's ServiceAccount.

// Proofs of a holder's death, as events and the metric name them.
const (
	proofFinished = "finished"
	proofDeleted  = "deleted"
)

// holderPodUIDIndex indexes Leases by the pod UID of their current grant's
// principal, so that a pod's death finds the locks it holds.
const holderPodUIDIndex = "frontdesk.holderPodUID"

// podUIDIndex indexes the holder-pod cache by pod UID.
const podUIDIndex = "frontdesk.podUID"

// deathRetention is how long the controller remembers that a pod was
// deleted finished: the grants it held are judged within it (the pod's
// event queues them), and a later pass without the note only waits out
// the lease.
const deathRetention = 5 * time.Minute

// deaths remembers the pods the watch showed deleted in a finished state,
// with their ServiceAccount's username, on the controller's clock, for
// deathRetention.
type deaths struct {
	mu sync.Mutex
	of map[types.UID]death
}

type death struct {
	user string
	at   time.Time
}

func newDeaths() *deaths {
	return &deaths{of: map[types.UID]death{}}
}

// note remembers, as of now, that pod was deleted finished, and forgets the
// notes older than deathRetention.
func (d *deaths) note(pod *corev1.Pod, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, dd := range d.of {
		if now.Sub(dd.at) > deathRetention {
			delete(d.of, uid)
		}
	}
	d.of[pod.UID] = death{user: serviceAccountUser(pod), at: now}
}

// deleted reports whether the pod with uid, of the ServiceAccount whose
// principal user is user, was seen deleted finished within deathRetention
// of now.
func (d *deaths) deleted(uid types.UID, user string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	dd, ok := d.of[uid]
	return ok && dd.user == user && now.Sub(dd.at) <= deathRetention
}

// serviceAccountUser is the principal user ("user=<username>") of pod's
// ServiceAccount: the user of every token bound to the pod.
func serviceAccountUser(pod *corev1.Pod) string {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return "user=system:serviceaccount:" + pod.Namespace + ":" + sa
}

// finished reports whether pod's stored state proves that no process of it
// runs or will run again (see the proof "finished" above).
func finished(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Reason == "DeletionByPodGC" {
			return false
		}
	}
	return allTerminated(len(pod.Spec.InitContainers), pod.Status.InitContainerStatuses) &&
		len(pod.Spec.Containers) > 0 && allTerminated(len(pod.Spec.Containers), pod.Status.ContainerStatuses) &&
		allTerminated(len(pod.Spec.EphemeralContainers), pod.Status.EphemeralContainerStatuses)
}

// allTerminated reports whether there is a status for each of n containers
// and every status is terminated.
func allTerminated(n int, statuses []corev1.ContainerStatus) bool {
	if len(statuses) < n {
		return false
	}
	for _, cs := range statuses {
		if cs.State.Terminated == nil {
			return false
		}
	}
	return true
}

// holderDeathProof is the proof that the pod whose token made the current
// grant of the pass's Lease is dead, as a sentence for the event, and the
// proof's name; "" when there is none, or the lock fails over by lease
// only.
func (r *DistributedLockReconciler) holderDeathProof(ctx context.Context, p *pass) (why, proof string) {
	l := p.state.lease
	principal := l.Annotations[locksv1alpha1.HolderPrincipalAnnotation]
	uid := lease.PrincipalPodUID(principal)
	if r.HolderPods == nil || !p.lock.FailsOverOnProof() || uid == "" {
		return "", ""
	}
	user := lease.PrincipalUser(principal)
	if r.deaths.deleted(types.UID(uid), user, p.now) {
		return fmt.Sprintf("its pod (UID %s) was deleted after its kubelet reported every container terminated", uid), proofDeleted
	}
	var pods corev1.PodList
	if err := r.HolderPods.List(ctx, &pods, client.MatchingFields{podUIDIndex: uid}); err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("could not read the holder's pod: waiting out the lease", "uid", uid, "error", err.Error())
		return "", ""
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if string(pod.UID) == uid && serviceAccountUser(pod) == user && finished(pod) {
			return fmt.Sprintf("its pod %s is %s with every container terminated, as its kubelet reported", klog.KObj(pod), pod.Status.Phase),
				proofFinished
		}
	}
	return "", ""
}

// indexLeasesByHolderPod indexes the cached Leases by the pod UID of their
// current grant's principal (none for a free Lease).
func indexLeasesByHolderPod(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &coordinationv1.Lease{}, holderPodUIDIndex, func(o client.Object) []string {
		l := o.(*coordinationv1.Lease)
		if uid := lease.PrincipalPodUID(l.Annotations[locksv1alpha1.HolderPrincipalAnnotation]); uid != "" && lease.Holder(l) != "" {
			return []string{uid}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("indexing leases by holder pod: %w", err)
	}
	return nil
}

// indexPodsByUID indexes the HolderPods cache by pod UID, as
// holderDeathProof reads it.
func (r *DistributedLockReconciler) indexPodsByUID(ctx context.Context) error {
	err := r.HolderPods.IndexField(ctx, &corev1.Pod{}, podUIDIndex, func(o client.Object) []string { return []string{string(o.GetUID())} })
	if err != nil {
		return fmt.Errorf("indexing pods by uid: %w", err)
	}
	return nil
}

// holderPodEvents maps the events of the HolderPods cache that prove a
// pod dead to the locks whose current grant that pod's token made, and
// notes the deletions that prove it (deaths).
func (r *DistributedLockReconciler) holderPodEvents() handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	enqueue := func(ctx context.Context, obj client.Object, q queue) {
		var leases coordinationv1.LeaseList
		if err := r.List(ctx, &leases, client.MatchingFields{holderPodUIDIndex: string(obj.GetUID())}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing leases held by a pod", "pod", klog.KObj(obj))
			return
		}
		for i := range leases.Items {
			for _, req := range r.locksForLease(ctx, &leases.Items[i]) {
				q.Add(req)
			}
		}
	}
	isFinished := func(obj client.Object) bool {
		pod, ok := obj.(*corev1.Pod)
		return ok && finished(pod)
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) {
			if isFinished(e.Object) {
				enqueue(ctx, e.Object, q)
			}
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			if isFinished(e.ObjectNew) && !isFinished(e.ObjectOld) {
				enqueue(ctx, e.ObjectNew, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) {
			if pod, ok := e.Object.(*corev1.Pod); ok && !e.DeleteStateUnknown && finished(pod) {
				r.deaths.note(pod, r.Clock.Now())
				enqueue(ctx, e.Object, q)
			}
		},
	}
}
