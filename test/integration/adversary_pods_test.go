package integration

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The adversary's pod surface (issue 36): a principal that may create,
// change and delete pods in the lock's namespace (the pod rules of the
// built-in edit role) and nothing for locks creates pods annotated to run
// holding the lock, with twists: ServiceAccounts with and without the
// lock-user role (its own, an honest participant's, none, one that does
// not exist), names whose identity "<pod>_<uid>" reaches or passes the
// grammar's 253 characters, runs-holding values beside the lock's name,
// no gate or a second gate, no participant label, marks and an admitted-
// grant annotation forged at creation, priority annotations and classes;
// then it edits its pods (removes the gate itself, the participant label,
// renames the lock, forges marks) and deletes them, queued or admitted,
// gracefully or not. No kubelet runs here: the test plays kubelet and
// scheduler for the creator's pods, by the fate each drew at creation:
// "never" (never bound: the lock's podStartTimeoutSeconds deletes it once
// admitted), "run" (bound and Running once ungated, Succeeded a while
// later, at most half the start timeout) or "bound-stuck" (bound, never
// started: deleted by the start timeout, then stopped and removed as its
// kubelet would). It deletes only its own pods: whoever may delete pods
// can stop any workload of the namespace, the honest participants' too.

// The shares of the adversary's writes that go to the pod and fenced
// surfaces, drawn from a stream of their own (PCG(seed^surfaceSalt, i)) so
// that the Lease writes of a seed keep their draws.
const (
	podShare    = 0.08
	fencedShare = 0.10
	surfaceSalt = 0x5eed5eed5eed5eed
	// maxQueueablePods bounds the creator's pods that the controller
	// queues at once (gated, participant, naming the lock, of a
	// ServiceAccount that may use it): each costs an honest waiter behind
	// it up to podDelay, and the liveness bound counts them.
	maxQueueablePods = 3
	// adversaryPodStart is the adversary's lock's spec.podStartTimeoutSeconds.
	adversaryPodStart = 2
	// podCreatorUser is the pod surface's principal.
	podCreatorUser = "pod-creator"
	// adversaryFieldLabel marks the creator's pods, so that its kubelet
	// and the end of the run find them.
	adversaryPodLabel = "test.frontdesk.dev/created-by"
)

// advPod is one pod the creator created.
type advPod struct {
	name, sa, runsHolding string
	uid                   types.UID
	// allowed: its ServiceAccount may use the lock.
	allowed bool
	// queueable: the controller is to queue it as created (gated,
	// participant, naming the lock, allowed).
	queueable bool
	fate      string
	runFor    time.Duration
	createdAt time.Time
	// forged are the token annotation values the creator wrote on it;
	// forgedLabel, that it wrote the holder label.
	forged      map[string]bool
	forgedLabel bool
	edits       []string
	gone        bool
	startedAt   time.Time
}

// podSurface sends the pod-creator's writes.
type podSurface struct {
	ns, lock string
	res      dynamic.ResourceInterface // pods, as the creator
	node     string
	start    time.Duration
	// rights says which ServiceAccounts may use the lock.
	rights map[string]bool

	mu    sync.Mutex
	pods  map[string]*advPod
	byUID map[types.UID]*advPod
	// history records every version of every pod of the namespace.
	history *podHistory
	// markedByGrant and markedByCreator count the pod versions carrying
	// marks of a grant of the pod's own, and those carrying marks the
	// creator wrote (checkPods).
	markedByGrant, markedByCreator int
}

func newPodSurface(t *testing.T, ns, lock string, rights map[string]bool, start time.Duration) *podSurface {
	t.Helper()
	cfg := podCreatorConfig(t, ns, podCreatorUser)
	node := ns + "-node"
	createNode(t, node, true)
	return &podSurface{ns: ns, lock: lock, res: dynamic.NewForConfigOrDie(cfg).Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace(ns),
		node: node, start: start, rights: rights, pods: map[string]*advPod{}, byUID: map[types.UID]*advPod{}}
}

// podPlan is a pod the creator is about to create.
type podPlan struct {
	pod    *corev1.Pod
	desc   string
	ap     *advPod
	twists []string
}

// drawPodPlan draws pod i.
func (s *podSurface) drawPodPlan(r *rand.Rand, i uint64, w *view) podPlan {
	var twists []string
	twist := func(format string, args ...any) { twists = append(twists, fmt.Sprintf(format, args...)) }
	base := fmt.Sprintf("adv-p%d", i)
	name := base
	switch n := r.IntN(20); n {
	case 0, 1, 2, 3:
		// identity of 253 (the grammar's last), 254 and 290 characters,
		// and a pod name of 63 (a hostname's).
		length := []int{253 - 37, 253 - 36, 253, 63}[n]
		name = base + "-" + strings.Repeat("x", length-len(base)-1)
		twist("name of %d characters (identity %d)", len(name), len(name)+37)
	}
	sa := pick(r, "mallory", "mallory", "alice", "nobody", "default", "ghost")
	if sa != "mallory" {
		twist("ServiceAccount %s", sa)
	}
	runsHolding, hasRunsHolding := s.lock, true
	if chance(r, 0.2) {
		runsHolding = pick(r, strings.ToUpper(s.lock), s.lock+" ", " "+s.lock, "", s.lock+","+s.lock, "*", "other", strings.Repeat("a", 254),
			s.lock+"\n", "-")
		hasRunsHolding = runsHolding != "-"
		twist("runs-holding %q", trunc(runsHolding))
	}
	gate, extraGate := !chance(r, 0.12), chance(r, 0.1)
	if !gate {
		twist("no gate")
	}
	if extraGate {
		twist("a second gate")
	}
	participant := "true"
	if chance(r, 0.12) {
		participant = pick(r, "", "false", "True")
		twist("participant label %q", participant)
	}
	mayHold := ""
	if chance(r, 0.5) {
		mayHold = pick(r, s.lock, "*", "other", " "+s.lock+" ,x")
	}
	forgedToken, forgedLabel := "", chance(r, 0.1)
	if chance(r, 0.12) {
		forgedToken = numberEdge(r, w.token)
		twist("forged token %q", forgedToken)
	}
	if forgedLabel {
		twist("forged holder label")
	}
	priorityAnnotation, priorityClass := "", ""
	if chance(r, 0.15) {
		priorityAnnotation = priority(r)
		twist("priority annotation %q", priorityAnnotation)
	}
	if chance(r, 0.05) {
		priorityClass = pick(r, "system-node-critical", "system-cluster-critical", "no-such-class")
		twist("priorityClassName %s", priorityClass)
	}
	copyGrant := chance(r, 0.08)
	if copyGrant {
		twist("admitted-grant copied from the Lease")
	}
	fate := pick(r, "never", "never", "never", "run", "run", "bound-stuck")
	runFor := time.Duration(r.Float64() * float64(s.start) / 2)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns, Labels: map[string]string{adversaryPodLabel: podCreatorUser},
			Annotations: map[string]string{}},
		Spec: corev1.PodSpec{ServiceAccountName: sa, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1", Env: []corev1.EnvVar{{Name: "FENCING_TOKEN",
				ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
					FieldPath: "metadata.annotations['" + locksv1alpha1.TokenAnnotationKey(s.lock) + "']"}}}}}}},
	}
	if participant != "" {
		pod.Labels[locksv1alpha1.ParticipantLabel] = participant
	}
	if hasRunsHolding {
		pod.Annotations[locksv1alpha1.RunsHoldingAnnotation] = runsHolding
	}
	if gate {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: locksv1alpha1.AdmissionGate})
	}
	if extraGate {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: "example.com/hold"})
	}
	if mayHold != "" {
		pod.Annotations[locksv1alpha1.MayHoldAnnotation] = mayHold
	}
	if forgedToken != "" {
		pod.Annotations[locksv1alpha1.TokenAnnotationKey(s.lock)] = forgedToken
	}
	if forgedLabel {
		pod.Labels[locksv1alpha1.HolderLabelKey(s.lock)] = "true"
	}
	if priorityAnnotation != "" {
		pod.Annotations["locks.frontdesk.dev/priority"] = priorityAnnotation
	}
	if priorityClass != "" {
		pod.Spec.PriorityClassName = priorityClass
	}
	if copyGrant && lease.Holder(w.cur) != "" {
		pod.Annotations[locksv1alpha1.AdmittedGrantAnnotation] = lease.Holder(w.cur) + "," + strconv.FormatInt(w.token, 10)
	}
	ap := &advPod{name: name, sa: sa, runsHolding: runsHolding, allowed: s.rights[sa], fate: fate, runFor: runFor,
		forged: map[string]bool{}, forgedLabel: forgedLabel}
	if forgedToken != "" {
		ap.forged[forgedToken] = true
	}
	ap.queueable = ap.allowed && gate && participant == "true" && hasRunsHolding && runsHolding == s.lock
	return podPlan{pod: pod, ap: ap, twists: twists,
		desc: fmt.Sprintf("create pod %s (%s, fate %s): %s", trunc(name), sa, fate, strings.Join(twists, "; "))}
}

// ownsTicket reports whether ticket is the place of one of the creator's
// pods ("pod-<uid>").
func (s *podSurface) ownsTicket(ticket string) bool {
	uid, ok := strings.CutPrefix(ticket, locksv1alpha1.PodTicketPrefix)
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byUID[types.UID(uid)] != nil
}

// queueable counts the creator's live pods the controller is to queue.
func (s *podSurface) queueable() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.pods {
		if p.queueable && !p.gone {
			n++
		}
	}
	return n
}

// live are the names of the creator's pods not known gone, sorted.
func (s *podSurface) live(onlyQueueable bool) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, p := range s.pods {
		if !p.gone && (!onlyQueueable || p.queueable) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// write sends the creator's write i: a pod created (mostly), one of its
// pods edited or deleted.
func (s *podSurface) write(ctx context.Context, a *adversary, i uint64, r *rand.Rand, w *view) {
	op := pick(r, "create", "create", "create", "create", "create", "create", "delete", "delete", "edit", "edit")
	plan := s.drawPodPlan(r, i, w)
	live := s.live(false)
	if op == "create" && plan.ap.queueable && s.queueable() >= maxQueueablePods {
		op, live = "delete", s.live(true) // it keeps maxQueueablePods queued at most: one goes
	}
	if op != "create" && len(live) == 0 {
		op = "create"
	}
	if op == "create" && a.yield.Load() && plan.ap.queueable {
		// The honest side registers its waiters: the creator queues no pod
		// meanwhile (as the adversary adds no place), so the liveness
		// check has a head registered before the pods behind it.
		op = "yield"
	}
	var m move
	var req request
	var kind writeKind
	switch op {
	case "yield":
		return // no write sent
	case "create":
		m = move{theme: "pod: create", desc: plan.desc}
		obj := toJSON(plan.pod).(map[string]any)
		obj["apiVersion"], obj["kind"] = "v1", "Pod"
		req = request{res: s.res, name: plan.pod.Name, after: obj}
		kind = a.kinds["create"]
	case "delete":
		target := pick(r, live...)
		before, err := s.res.Get(ctx, target, metav1.GetOptions{})
		if err != nil {
			s.noteGone(target, err)
			a.stats.add("pods", "read", "pod: read", classify(err))
			return
		}
		m = move{theme: "pod: delete " + s.stage(before), desc: "delete pod " + trunc(target)}
		req = request{res: s.res, name: target, before: before.Object}
		kind = a.kinds["delete"]
	default:
		target := pick(r, live...)
		before, err := s.res.Get(ctx, target, metav1.GetOptions{})
		if err != nil {
			s.noteGone(target, err)
			a.stats.add("pods", "read", "pod: read", classify(err))
			return
		}
		edit, desc := s.drawPodEdit(r, w)
		after := before.DeepCopy()
		edit(after)
		m = move{theme: "pod: edit " + s.stage(before), desc: fmt.Sprintf("edit pod %s: %s", trunc(target), desc)}
		req = request{res: s.res, name: target, before: before.Object, after: after.Object}
		kind = a.kinds[pick(r, "json-patch", "merge-patch", "strategic-merge", "update", "update", "apply")]
	}
	sentAt := time.Now()
	body, written, err := kind.send(ctx, r, req)
	if ctx.Err() != nil && err != nil {
		return
	}
	outcome := classify(err)
	switch {
	case op == "create" && err == nil && written != nil:
		plan.ap.uid, plan.ap.createdAt = written.GetUID(), sentAt
		s.mu.Lock()
		s.pods[plan.ap.name], s.byUID[plan.ap.uid] = plan.ap, plan.ap
		s.mu.Unlock()
	case op == "delete" && (err == nil || apierrors.IsNotFound(err)):
		s.noteGone(req.name, nil)
	case op == "edit" && err == nil && written != nil:
		s.noteEdited(written)
	}
	a.stats.add("pods", kind.name(), m.theme, outcome)
	e := entry{i: i, at: sentAt, pod: podCreatorUser, kind: kind.name(), theme: m.theme, desc: m.desc, body: body, outcome: outcome, err: errText(err)}
	if written != nil {
		e.version = written.GetResourceVersion()
	}
	a.journal.add(e)
}

// stage names where a pod stands: gated (and queued or not), admitted,
// running, terminating.
func (s *podSurface) stage(p *unstructured.Unstructured) string {
	if p.GetDeletionTimestamp() != nil {
		return "terminating"
	}
	gates, _, _ := unstructured.NestedSlice(p.Object, "spec", "schedulingGates")
	node, _, _ := unstructured.NestedString(p.Object, "spec", "nodeName")
	phase, _, _ := unstructured.NestedString(p.Object, "status", "phase")
	switch {
	case len(gates) > 0:
		return "gated"
	case p.GetAnnotations()[locksv1alpha1.TokenAnnotationKey(s.lock)] != "" && node == "":
		return "admitted"
	case phase == string(corev1.PodRunning):
		return "running"
	case node != "":
		return "bound"
	}
	return "ungated"
}

// drawPodEdit draws an edit of one of the creator's pods.
func (s *podSurface) drawPodEdit(r *rand.Rand, w *view) (func(*unstructured.Unstructured), string) {
	what := pick(r, "ungate", "drop-participant", "rename-lock", "forge-marks", "add-gate", "may-hold", "drop-runs-holding")
	token := numberEdge(r, w.token)
	other := pick(r, "other", strings.ToUpper(s.lock), "")
	desc := what
	switch what {
	case "forge-marks":
		desc += " " + token
	case "rename-lock":
		desc += fmt.Sprintf(" %q", other)
	}
	return func(p *unstructured.Unstructured) {
		labels, annotations := p.GetLabels(), p.GetAnnotations()
		if labels == nil {
			labels = map[string]string{}
		}
		if annotations == nil {
			annotations = map[string]string{}
		}
		switch what {
		case "ungate":
			gates, _, _ := unstructured.NestedSlice(p.Object, "spec", "schedulingGates")
			gates = slices.DeleteFunc(gates, func(g any) bool {
				m, _ := g.(map[string]any)
				return m["name"] == locksv1alpha1.AdmissionGate
			})
			_ = unstructured.SetNestedSlice(p.Object, gates, "spec", "schedulingGates")
		case "drop-participant":
			delete(labels, locksv1alpha1.ParticipantLabel)
		case "rename-lock":
			annotations[locksv1alpha1.RunsHoldingAnnotation] = other
		case "drop-runs-holding":
			delete(annotations, locksv1alpha1.RunsHoldingAnnotation)
		case "forge-marks":
			annotations[locksv1alpha1.TokenAnnotationKey(s.lock)] = token
			labels[locksv1alpha1.HolderLabelKey(s.lock)] = "true"
		case "add-gate":
			gates, _, _ := unstructured.NestedSlice(p.Object, "spec", "schedulingGates")
			gates = append(gates, map[string]any{"name": "example.com/late"})
			_ = unstructured.SetNestedSlice(p.Object, gates, "spec", "schedulingGates")
		case "may-hold":
			annotations[locksv1alpha1.MayHoldAnnotation] = "*"
		}
		p.SetLabels(labels)
		p.SetAnnotations(annotations)
	}, desc
}

// noteEdited records what the creator wrote on its pod: forged marks,
// and that its pod may no longer be queueable.
func (s *podSurface) noteEdited(p *unstructured.Unstructured) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ap := s.byUID[p.GetUID()]
	if ap == nil {
		return
	}
	if v, ok := p.GetAnnotations()[locksv1alpha1.TokenAnnotationKey(s.lock)]; ok {
		ap.forged[v] = true
	}
	if p.GetLabels()[locksv1alpha1.HolderLabelKey(s.lock)] == "true" {
		ap.forgedLabel = true
	}
	ap.edits = append(ap.edits, p.GetResourceVersion())
}

// noteGone records that the creator's pod name is gone (err, when not
// nil, must say so).
func (s *podSurface) noteGone(name string, err error) {
	if err != nil && !apierrors.IsNotFound(err) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pods[name]; p != nil {
		p.gone = true
	}
}

// kubelet plays scheduler and kubelet for the creator's pods until ctx
// ends: it binds a pod whose gates are all gone (unless its fate is
// "never"), starts a bound pod of fate "run" and has it succeed runFor
// later, and stops and removes a bound pod that is being deleted.
func (s *podSurface) kubelet(ctx context.Context, t *testing.T) {
	for ctx.Err() == nil {
		list, err := clientset.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: adversaryPodLabel + "=" + podCreatorUser})
		if err == nil {
			for i := range list.Items {
				s.tend(ctx, t, &list.Items[i])
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tend does what the scheduler or the kubelet would do next for p.
func (s *podSurface) tend(ctx context.Context, t *testing.T, p *corev1.Pod) {
	s.mu.Lock()
	ap := s.byUID[p.UID]
	s.mu.Unlock()
	if ap == nil {
		return
	}
	pods := clientset.CoreV1().Pods(s.ns)
	switch {
	case p.DeletionTimestamp != nil && p.Spec.NodeName != "":
		// Its kubelet stops the containers, reports them, and removes it.
		stopped := p.DeepCopy()
		stopContainers(stopped)
		if !containersAllStopped(p) {
			if _, err := pods.UpdateStatus(ctx, stopped, metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
				return
			}
		}
		_ = pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0)), Preconditions: &metav1.Preconditions{UID: &p.UID}})
	case p.DeletionTimestamp != nil:
	case len(p.Spec.SchedulingGates) == 0 && p.Spec.NodeName == "" && ap.fate != "never":
		err := pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: p.Name, UID: p.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: s.node}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			t.Logf("kubelet: binding pod %s: %v", p.Name, err)
		}
	case p.Spec.NodeName != "" && ap.fate == "run" && (p.Status.Phase == corev1.PodPending || p.Status.Phase == ""):
		running := p.DeepCopy()
		running.Status.Phase = corev1.PodRunning
		running.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			running.Status.ContainerStatuses = append(running.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image,
				Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}})
		}
		if _, err := pods.UpdateStatus(ctx, running, metav1.UpdateOptions{FieldManager: "kubelet"}); err == nil {
			s.mu.Lock()
			ap.startedAt = time.Now()
			s.mu.Unlock()
		}
	case p.Status.Phase == corev1.PodRunning && ap.fate == "run":
		s.mu.Lock()
		started := ap.startedAt
		s.mu.Unlock()
		if started.IsZero() || time.Since(started) < ap.runFor {
			return
		}
		done := p.DeepCopy()
		done.Status.Phase = corev1.PodSucceeded
		stopContainers(done)
		for i := range done.Status.ContainerStatuses {
			done.Status.ContainerStatuses[i].State.Terminated.ExitCode, done.Status.ContainerStatuses[i].State.Terminated.Reason = 0, "Completed"
		}
		_, _ = pods.UpdateStatus(ctx, done, metav1.UpdateOptions{FieldManager: "kubelet"})
	}
}

func containersAllStopped(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) < len(p.Spec.Containers) {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Terminated == nil {
			return false
		}
	}
	return true
}

// removeAll deletes the creator's pods at the end of the run (at once:
// a bound pod's grant is then waited out), and waits until they are gone.
func (s *podSurface) removeAll(t *testing.T) {
	ctx := context.Background()
	err := clientset.CoreV1().Pods(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))},
		metav1.ListOptions{LabelSelector: adversaryPodLabel + "=" + podCreatorUser})
	if err != nil {
		t.Errorf("deleting the pod creator's pods: %v", err)
	}
	eventually(t, 20*time.Second, func(g Gomega) {
		list, err := clientset.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: adversaryPodLabel + "=" + podCreatorUser})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Items).To(BeEmpty())
	})
}

// --- what became of the pods ---

// podVersion is a pod as a watch event showed it.
type podVersion struct {
	at             time.Time
	name           string
	uid            types.UID
	rv             string
	deleted        bool
	holderLabel    string
	token          string
	hasToken       bool
	gated          bool
	participant    string
	runsHolding    string
	hasRunsHolding bool
	node           string
	phase          corev1.PodPhase
	terminating    bool
	serviceAccount string
}

// podHistory records every version of every pod of a namespace.
type podHistory struct {
	mu       sync.Mutex
	versions []podVersion
}

// watchPods records the pods of ns, as they change, until ctx ends.
func watchPods(ctx context.Context, t *testing.T, ns, lock string) *podHistory {
	h := &podHistory{}
	pods := clientset.CoreV1().Pods(ns)
	followObjects(ctx, t, "the pods of "+ns, func(ctx context.Context) ([]*corev1.Pod, string, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, "", err
		}
		items := make([]*corev1.Pod, len(list.Items))
		for i := range list.Items {
			items[i] = &list.Items[i]
		}
		return items, list.ResourceVersion, nil
	}, pods.Watch, func(p *corev1.Pod, deleted bool) { h.add(p, lock, deleted) })
	return h
}

func (h *podHistory) add(p *corev1.Pod, lock string, deleted bool) {
	v := podVersion{at: time.Now(), name: p.Name, uid: p.UID, rv: p.ResourceVersion, deleted: deleted,
		holderLabel: p.Labels[locksv1alpha1.HolderLabelKey(lock)], gated: gated(p), participant: p.Labels[locksv1alpha1.ParticipantLabel],
		node: p.Spec.NodeName, phase: p.Status.Phase, terminating: p.DeletionTimestamp != nil, serviceAccount: p.Spec.ServiceAccountName}
	v.token, v.hasToken = p.Annotations[locksv1alpha1.TokenAnnotationKey(lock)]
	v.runsHolding, v.hasRunsHolding = p.Annotations[locksv1alpha1.RunsHoldingAnnotation]
	h.mu.Lock()
	defer h.mu.Unlock()
	h.versions = append(h.versions, v)
}

func (h *podHistory) all() []podVersion {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.versions)
}

// leaseGrant is a grant on the Lease's history.
type leaseGrant struct {
	holder, principal, admitted, ticket string
	token                               int64
	rv                                  string
}

// grantsOf lists the distinct grants of the Lease's history.
func grantsOf(versions []coordinationv1.Lease) []leaseGrant {
	var out []leaseGrant
	seen := map[string]bool{}
	for i := range versions {
		l := &versions[i]
		if lease.Holder(l) == "" {
			continue
		}
		g := leaseGrant{holder: lease.Holder(l), principal: l.Annotations[locksv1alpha1.HolderPrincipalAnnotation],
			admitted: l.Annotations[locksv1alpha1.AdmittedGrantAnnotation], ticket: l.Annotations[locksv1alpha1.TicketAnnotation],
			token: lease.Token(l), rv: l.ResourceVersion}
		key := fmt.Sprintf("%s|%s|%s|%d", g.holder, g.principal, g.admitted, g.token)
		if !seen[key] {
			seen[key] = true
			out = append(out, g)
		}
	}
	return out
}

// podsGrant reports whether g is a grant of the pod (name, uid) itself:
// its holder identity names the pod, and it is bound to that pod (its
// principal is the pod's, from a token bound to it) or the controller
// holds it for the pod (the admitted-grant mark names its holder and
// token).
func (g leaseGrant) podsGrant(name string, uid types.UID) bool {
	if locksv1alpha1.PodNameOf(g.holder) != name || locksv1alpha1.PodUIDOf(g.holder) != string(uid) {
		return false
	}
	return lease.PrincipalPodUID(g.principal) == string(uid) || g.admitted == g.holder+","+strconv.FormatInt(g.token, 10)
}

// checkPods checks the pod surface's invariants on the records of the
// run:
//
//	(p1) a pod whose ServiceAccount may not use the lock is never queued
//	     (no place pod-<uid>), never granted the lock by the controller
//	     (no admitted-grant mark naming it) and, having waited gated,
//	     participant and naming the lock for 15 s, was told NotPermitted;
//	(p2) no pod is marked (holder label, token annotation) and no status
//	     names a holder pod but for a grant of that pod itself (bound to
//	     its own principal, or held by the controller for it), or with
//	     values its creator wrote itself (the creator may label its own
//	     pods: docs/annotations.md);
//
// (no token is granted twice is checkTokens', on the same history).
//
//nolint:gocyclo // a checklist: one branch per invariant (p1, p2), read top to bottom
func (run *adversaryRun) checkPods(s *podSurface, pods []podVersion, statuses []statusLine) {
	grants := grantsOf(run.versions)
	places := map[string]bool{}
	for i := range run.versions {
		for _, w := range lease.Queue(&run.versions[i]) {
			places[w.Ticket] = true
		}
	}
	s.mu.Lock()
	byUID := maps.Clone(s.byUID)
	s.mu.Unlock()
	justified := func(name string, uid types.UID, token string) bool {
		t, err := strconv.ParseInt(token, 10, 64)
		if err != nil {
			return false
		}
		for _, g := range grants {
			if g.token == t && g.podsGrant(name, uid) {
				return true
			}
		}
		return false
	}
	// (p1)
	for uid, ap := range byUID {
		if ap.allowed {
			continue
		}
		if places[locksv1alpha1.PodTicketPrefix+string(uid)] {
			run.violateAboutf(locksv1alpha1.PodTicketPrefix+string(uid), "p1", "pod %s of ServiceAccount %s, which may not use the lock, was queued", ap.name, ap.sa)
		}
		for _, g := range grants {
			if locksv1alpha1.PodUIDOf(g.holder) == string(uid) && (g.admitted != "" && strings.HasPrefix(g.admitted, g.holder+",") ||
				g.ticket == locksv1alpha1.PodTicketPrefix+string(uid)) {
				run.violatef("p1", "pod %s of ServiceAccount %s, which may not use the lock, was granted it (token %d, %s)", ap.name, ap.sa,
					g.token, g.rv)
			}
		}
	}
	notPermitted := podEventsByReason(run.ns, "NotPermitted")
	for uid, span := range gatedSpans(pods, run.name) {
		ap := byUID[uid]
		if ap == nil || ap.allowed || span < 15*time.Second || notPermitted[uid] {
			continue
		}
		run.violatef("p1", "pod %s of ServiceAccount %s, which may not use the lock, waited gated %s without a NotPermitted warning",
			ap.name, ap.sa, span.Round(time.Second))
	}
	// (p2)
	reported := map[string]bool{}
	for _, v := range pods {
		if v.deleted || v.holderLabel == "" && !v.hasToken {
			continue
		}
		ap := byUID[v.uid]
		switch {
		case v.hasToken && justified(v.name, v.uid, v.token):
			s.markedByGrant++
		case ap != nil:
			s.markedByCreator++
		}
		if v.hasToken && (ap == nil || !ap.forged[v.token]) && !justified(v.name, v.uid, v.token) {
			if key := string(v.uid) + "/t/" + v.token; !reported[key] {
				reported[key] = true
				run.violateAtf(v.at, "", "p2", "pod %s (rv %s) carries the token annotation %q of no grant of its own", v.name, v.rv, v.token)
			}
		}
		if v.holderLabel != "" && (ap == nil || !ap.forgedLabel) && (!v.hasToken || !justified(v.name, v.uid, v.token)) {
			if key := string(v.uid) + "/l/" + v.token; !reported[key] {
				reported[key] = true
				run.violateAtf(v.at, "", "p2", "pod %s (rv %s) carries the holder label %q without a grant of its own (token %q)",
					v.name, v.rv, v.holderLabel, v.token)
			}
		}
	}
	for _, st := range statuses {
		if st.holderPod == "" {
			continue
		}
		uid := types.UID(locksv1alpha1.PodUIDOf(st.holder))
		ok := locksv1alpha1.PodNameOf(st.holder) == st.holderPod && slices.ContainsFunc(grants, func(g leaseGrant) bool {
			return g.holder == st.holder && g.podsGrant(st.holderPod, uid)
		})
		if !ok && !reported["status/"+st.holder] {
			reported["status/"+st.holder] = true
			run.violateAtf(st.at, "", "p2", "the lock's status names holder pod %s for holder %q (token %d), no grant of that pod's own",
				st.holderPod, st.holder, st.token)
		}
	}
}

// gatedSpans is, per pod, the longest time it waited gated, participant,
// naming lock, not terminating, as its versions show (until the end of the
// run if it still waits).
func gatedSpans(pods []podVersion, lock string) map[types.UID]time.Duration {
	out := map[types.UID]time.Duration{}
	since := map[types.UID]time.Time{}
	waiting := func(v podVersion) bool {
		return !v.deleted && v.gated && !v.terminating && v.participant == "true" && v.hasRunsHolding && v.runsHolding == lock
	}
	for _, v := range pods {
		start, in := since[v.uid]
		switch {
		case waiting(v) && !in:
			since[v.uid] = v.at
		case !waiting(v) && in:
			out[v.uid] = max(out[v.uid], v.at.Sub(start))
			delete(since, v.uid)
		}
	}
	for uid, start := range since {
		out[uid] = max(out[uid], time.Since(start))
	}
	return out
}

// podEventsByReason lists the pods (by UID) with an Event of reason.
func podEventsByReason(ns, reason string) map[types.UID]bool {
	var list eventsv1.EventList
	out := map[types.UID]bool{}
	if err := k8sClient.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return out
	}
	for _, ev := range list.Items {
		if ev.Regarding.Kind == "Pod" && ev.Reason == reason {
			out[ev.Regarding.UID] = true
		}
	}
	return out
}

// podReport summarizes the pod surface: the pods created by
// ServiceAccount, how many the controller queued, admitted, and deleted
// unstarted, and the warnings it sent.
func (run *adversaryRun) podReport(s *podSurface, pods []podVersion) string {
	s.mu.Lock()
	byUID := maps.Clone(s.byUID)
	s.mu.Unlock()
	places, admitted := map[string]bool{}, map[string]bool{}
	for i := range run.versions {
		l := &run.versions[i]
		for _, w := range lease.Queue(l) {
			places[w.Ticket] = true
		}
		if m := l.Annotations[locksv1alpha1.AdmittedGrantAnnotation]; m != "" {
			admitted[locksv1alpha1.PodUIDOf(strings.Split(m, ",")[0])] = true
		}
	}
	started := map[types.UID]bool{}
	for _, v := range pods {
		if v.phase == corev1.PodRunning {
			started[v.uid] = true
		}
	}
	type row struct{ created, queued, admitted, started int }
	rows := map[string]*row{}
	for uid, ap := range byUID {
		key := fmt.Sprintf("%s (may use the lock: %v)", ap.sa, ap.allowed)
		if rows[key] == nil {
			rows[key] = &row{}
		}
		rw := rows[key]
		rw.created++
		if places[locksv1alpha1.PodTicketPrefix+string(uid)] {
			rw.queued++
		}
		if admitted[string(uid)] {
			rw.admitted++
		}
		if started[uid] {
			rw.started++
		}
	}
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "| ServiceAccount | created | queued | admitted | started |\n|---|---|---|---|---|\n")
	for _, k := range keys {
		rw := rows[k]
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d |\n", k, rw.created, rw.queued, rw.admitted, rw.started)
	}
	reasons := map[string]int{}
	var list eventsv1.EventList
	if err := k8sClient.List(context.Background(), &list, client.InNamespace(run.ns)); err == nil {
		for _, ev := range list.Items {
			if ev.Regarding.Kind == "Pod" {
				reasons[ev.Reason]++
			}
		}
	}
	fmt.Fprintf(&b, "pod events: %v\n", reasons)
	fmt.Fprintf(&b, "pod versions with marks: %d of a grant of the pod's own, %d the pod creator wrote itself\n", s.markedByGrant, s.markedByCreator)
	return b.String()
}
