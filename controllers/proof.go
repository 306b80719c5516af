package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
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

// deaths remembers, by pod UID, the pods the watch showed finished: since
// when (on the controller's clock), with their ServiceAccount's username,
// and whether the watch then showed them deleted in that state. A finished
// pod's note stays while the pod does, and deathRetention after its
// deletion.
type deaths struct {
	mu sync.Mutex
	of map[types.UID]death
}

type death struct {
	user          string
	finishedSince time.Time
	deletedAt     *time.Time
}

func newDeaths() *deaths {
	return &deaths{of: map[types.UID]death{}}
}

// sawFinished notes, as of now, that pod is finished, unless it was noted
// before, and returns the note.
func (d *deaths) sawFinished(pod *corev1.Pod, now time.Time) death {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dd, ok := d.of[pod.UID]; ok {
		return dd
	}
	d.of[pod.UID] = death{user: serviceAccountUser(pod), finishedSince: now}
	return d.of[pod.UID]
}

// sawDeleted notes, as of now, that pod was deleted finished (proven
// unless unknown: a tombstone, or a final state that was not finished,
// which forgets the pod), and forgets the deletions older than
// deathRetention.
func (d *deaths) sawDeleted(pod *corev1.Pod, proven bool, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, dd := range d.of {
		if dd.deletedAt != nil && now.Sub(*dd.deletedAt) > deathRetention {
			delete(d.of, uid)
		}
	}
	if !proven {
		delete(d.of, pod.UID)
		return
	}
	dd, ok := d.of[pod.UID]
	if !ok {
		dd = death{user: serviceAccountUser(pod), finishedSince: now}
	}
	dd.deletedAt = &now
	d.of[pod.UID] = dd
}

// deleted is the note of the pod with uid, of the ServiceAccount whose
// principal user is user, if the watch showed it deleted finished within
// deathRetention of now.
func (d *deaths) deleted(uid types.UID, user string, now time.Time) (death, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dd, ok := d.of[uid]
	return dd, ok && dd.user == user && dd.deletedAt != nil && now.Sub(*dd.deletedAt) <= deathRetention
}

// phases remembers, by pod UID, who set a pod's terminal phase when the
// controller's watch first showed it: the kubelet or another manager. Field
// managers are metadata, which whoever may update a pod can rewrite
// afterwards (an entry naming the kubelet added by hand); the first
// sighting of the terminal phase shows the managers the apiserver computed
// for the write that set it. The watch handlers note it (saw) before they
// queue any pass; passes only read it (noted), so a pass that reads a pod
// before its handler ran notes nothing. A deleted pod's note is kept
// deathRetention, so that the other cache's late events see the same
// verdict and note nothing anew. A pod first seen terminal after a forged
// entry was added (the manager started since, a watch relisted) is judged
// by what it shows.
type phases struct {
	mu sync.Mutex
	of map[types.UID]phaseNote
}

type phaseNote struct {
	byKubelet bool
	// forgottenAt is when the pod was seen deleted (nil while it lives).
	forgottenAt *time.Time
}

func newPhases() *phases { return &phases{of: map[types.UID]phaseNote{}} }

// saw notes, at the first sighting of pod's terminal phase, whether the
// kubelet set it, and reports whether it did as first seen (true for a pod
// not terminal: nothing to judge yet).
func (ph *phases) saw(pod *corev1.Pod) bool {
	if !terminal(pod) {
		return true
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if n, ok := ph.of[pod.UID]; ok {
		return n.byKubelet
	}
	ph.of[pod.UID] = phaseNote{byKubelet: phaseSetBy(pod, kubeletManager)}
	return ph.of[pod.UID].byKubelet
}

// noted reports whether the kubelet set pod's terminal phase as a watch
// handler first saw it: false when no handler noted it yet (true for a pod
// not terminal).
func (ph *phases) noted(pod *corev1.Pod) bool {
	if !terminal(pod) {
		return true
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	n, ok := ph.of[pod.UID]
	return ok && n.byKubelet
}

// verdict is what saw would report of pod, without noting anything.
func (ph *phases) verdict(pod *corev1.Pod) bool {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if n, ok := ph.of[pod.UID]; ok {
		return n.byKubelet
	}
	return !terminal(pod) || phaseSetBy(pod, kubeletManager)
}

// forget notes, as of now, that pod was deleted, forgets the notes of pods
// deleted more than deathRetention before, and reports the verdict on pod.
func (ph *phases) forget(pod *corev1.Pod, now time.Time) bool {
	by := ph.verdict(pod)
	ph.mu.Lock()
	defer ph.mu.Unlock()
	for uid, n := range ph.of {
		if n.forgottenAt != nil && now.Sub(*n.forgottenAt) > deathRetention {
			delete(ph.of, uid)
		}
	}
	if n, ok := ph.of[pod.UID]; ok && n.forgottenAt != nil {
		return n.byKubelet
	}
	ph.of[pod.UID] = phaseNote{byKubelet: by, forgottenAt: &now}
	return by
}

// terminal reports whether pod's phase is Succeeded or Failed.
func terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// serviceAccountUser is the principal user ("user=<username>") of pod's
// ServiceAccount: the user of every token bound to the pod.
func serviceAccountUser(pod *corev1.Pod) string {
	return "user=system:serviceaccount:" + pod.Namespace + ":" + serviceAccountOf(pod)
}

// serviceAccountOf is the name of pod's ServiceAccount ("default" when the
// pod names none).
func serviceAccountOf(pod *corev1.Pod) string {
	if sa := pod.Spec.ServiceAccountName; sa != "" {
		return sa
	}
	return "default"
}

// finished reports whether pod's stored state proves that no process of it
// runs or will run again (see the proof "finished" above): its phase is
// Succeeded or Failed as the kubelet set it (the kubelet among the
// managers of status.phase: the pod garbage collector and other
// controllers mark pods Failed without stopping anything), without the pod
// garbage collector's DisruptionTarget, and every container the spec names
// has a status of that name, terminated, for a reason other than
// ContainerStatusUnknown (the kubelet's guess when its runtime lost the
// container, not a report that it stopped): containersStopped, for the
// init and ephemeral containers too.
func finished(pod *corev1.Pod) bool {
	ephemeral := make([]string, len(pod.Spec.EphemeralContainers))
	for i, c := range pod.Spec.EphemeralContainers {
		ephemeral[i] = c.Name
	}
	return terminal(pod) && containersStopped(pod, phaseSetBy(pod, kubeletManager)) &&
		allTerminated(containerNames(pod.Spec.InitContainers), pod.Status.InitContainerStatuses) &&
		allTerminated(ephemeral, pod.Status.EphemeralContainerStatuses)
}

// kubeletManager is the field manager of the kubelet's status writes (its
// user agent's first word).
const kubeletManager = "kubelet"

func containerNames(cs []corev1.Container) []string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Name
	}
	return names
}

// allTerminated reports whether each of names has a status and every
// status is terminated, for a reason other than ContainerStatusUnknown.
func allTerminated(names []string, statuses []corev1.ContainerStatus) bool {
	for _, cs := range statuses {
		if t := cs.State.Terminated; t == nil || t.Reason == "ContainerStatusUnknown" {
			return false
		}
	}
	for _, name := range names {
		if !slices.ContainsFunc(statuses, func(cs corev1.ContainerStatus) bool { return cs.Name == name }) {
			return false
		}
	}
	return true
}

// phaseSetBy reports whether manager is among the field managers of pod's
// status.phase (its managedFields, as the apiserver keeps them).
func phaseSetBy(pod *corev1.Pod, manager string) bool {
	return slices.ContainsFunc(pod.ManagedFields, func(e metav1.ManagedFieldsEntry) bool {
		return e.Manager == manager && OwnsPodPhase(e)
	})
}

// OwnsPodPhase reports whether the managed-fields entry e owns a pod's
// status.phase.
func OwnsPodPhase(e metav1.ManagedFieldsEntry) bool {
	if e.FieldsV1 == nil {
		return false
	}
	var fields struct {
		Status map[string]json.RawMessage `json:"f:status"`
	}
	if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
		return false
	}
	_, ok := fields.Status["f:phase"]
	return ok
}

// holderDeathProof is the proof that the pod whose token made the current
// grant of the pass's Lease is dead, as a sentence for the event, and the
// proof's name; "" when there is none, the lock fails over by lease only,
// or the lease guard does not apply in the lock's namespace (then anyone
// may write a principal). A grant whose record the controller first saw
// after it first saw the pod finished is not judged dead: a renewal or a
// grant with the pod's token after the pod finished came from outside the
// pod, which lives.
func (r *DistributedLockReconciler) holderDeathProof(ctx context.Context, p *pass) (why, proof string) {
	principal := p.state.lease.Annotations[locksv1alpha1.HolderPrincipalAnnotation]
	uid, user := lease.PrincipalPodUID(principal), lease.PrincipalUser(principal)
	if r.HolderPods == nil || !p.lock.FailsOverOnProof() || uid == "" {
		return "", ""
	}
	if guarded, _, err := r.leaseGuardIn(ctx, p.lock.Namespace); err != nil || !guarded {
		return "", ""
	}
	note, deleted := r.deaths.deleted(types.UID(uid), user, p.now)
	switch {
	case deleted:
		why, proof = fmt.Sprintf("its pod (UID %s) was deleted after its kubelet reported it finished, every container terminated", uid), proofDeleted
	default:
		pod := r.holderPod(ctx, uid)
		if pod == nil || serviceAccountUser(pod) != user || !finished(pod) || !r.phases.noted(pod) {
			return "", ""
		}
		note = r.deaths.sawFinished(pod, p.now)
		why, proof = fmt.Sprintf("its pod %s is %s with every container terminated, as its kubelet reported", klog.KObj(pod), pod.Status.Phase), proofFinished
	}
	if p.obs.ObservedAt.After(note.finishedSince) {
		ctrl.LoggerFrom(ctx).V(1).Info("the grant's record was first seen after its pod finished: waiting out the lease", "uid", uid)
		return "", ""
	}
	return why, proof
}

// holderPod is the pod with uid in the HolderPods cache, or nil.
func (r *DistributedLockReconciler) holderPod(ctx context.Context, uid string) *corev1.Pod {
	var pods corev1.PodList
	if err := r.HolderPods.List(ctx, &pods, client.MatchingFields{podUIDIndex: uid}); err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("could not read the holder's pod: waiting out the lease", "uid", uid, "error", err.Error())
		return nil
	}
	for i := range pods.Items {
		if string(pods.Items[i].UID) == uid {
			return &pods.Items[i]
		}
	}
	return nil
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

// holderPodEvents notes the pods the HolderPods cache shows finished, and
// deleted finished (deaths), and maps those events to the locks whose
// current grant that pod's token made.
func (r *DistributedLockReconciler) holderPodEvents() handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	seen := func(ctx context.Context, obj client.Object, q queue) {
		pod, ok := obj.(*corev1.Pod)
		if ok && r.phases.saw(pod) && finished(pod) {
			r.deaths.sawFinished(pod, r.Clock.Now())
			r.enqueueHeldBy(ctx, pod, q)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { seen(ctx, e.Object, q) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) { seen(ctx, e.ObjectNew, q) },
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) {
			pod, ok := e.Object.(*corev1.Pod)
			if !ok {
				return
			}
			byKubelet := r.phases.forget(pod, r.Clock.Now())
			proven := !e.DeleteStateUnknown && byKubelet && finished(pod)
			r.deaths.sawDeleted(pod, proven, r.Clock.Now())
			if proven {
				r.enqueueHeldBy(ctx, pod, q)
			}
		},
	}
}

// enqueueHeldBy queues the locks whose current grant pod's token made.
func (r *DistributedLockReconciler) enqueueHeldBy(ctx context.Context, pod *corev1.Pod, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	var leases coordinationv1.LeaseList
	if err := r.List(ctx, &leases, client.MatchingFields{holderPodUIDIndex: string(pod.UID)}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing leases held by a pod", "pod", klog.KObj(pod))
		return
	}
	for i := range leases.Items {
		locks, err := r.locksBackedBy(ctx, &leases.Items[i])
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing locks for lease", "lease", klog.KObj(&leases.Items[i]))
			continue
		}
		for j := range locks {
			q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&locks[j])})
		}
	}
}
