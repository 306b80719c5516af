package integration

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The adversary: a hostile participant (the pods of one ServiceAccount,
// each a principal of its own, with real pod-bound tokens) that sends
// random writes to a lock's Lease, drawn from a seed. Write i draws from
// its own stream (PCG(seed, i)), so a seed gives the same choices in the
// same order; what each choice is applied to (the Lease as read just
// before it) depends on what the honest clients did meanwhile.
//
// A write is a theme (adversary_themes_test.go: what it aims at, a grant,
// a place, a manager key..., as an edit of a fresh copy of the Lease or raw
// JSON patch operations for values a typed Lease cannot hold) sent as a
// kind (adversary_kinds_test.go: json-patch, merge-patch, strategic-merge,
// apply, update, delete), and counted and journaled by outcome
// (adversary_journal_test.go). Kinds, outcomes and the journal take any
// object: the other surfaces, pods created with locks.frontdesk.dev/runs-
// holding by a pod creator (adversary_pods_test.go) and objects under
// config/fencing-policy (adversary_fenced_test.go), draw their own moves
// and send them with the same kinds (and create, for new objects); which
// surface write i goes to is drawn from a stream of its own (surfaceOf).

// adversaryPod is one pod of the attacking ServiceAccount.
type adversaryPod struct {
	participant
	username string
	leases   coordinationclient.LeaseInterface
	dyn      dynamic.Interface
}

// adversary sends random writes to the Lease of lock ns/name.
type adversary struct {
	ns, name string
	seed     uint64
	pods     []adversaryPod
	// honest are the principals of the honest participants, whom the
	// adversary names where a principal belongs.
	honest []string
	themes []theme
	kinds  map[string]writeKind

	// yield asks the adversary to withdraw its places and queue no new
	// ones (the honest side is registering waiters that the liveness
	// invariant follows: the adversary may only queue behind them).
	yield atomic.Bool

	stats   *writeStats
	journal *journal

	// creator and fenced are the other surfaces (nil: Lease writes only).
	creator *podSurface
	fenced  *fencedSurface
	// victims are the identities "<pod>_<uid>" of pods of others (the
	// honest participants') the adversary holds or queues as.
	victims []string
}

// move is one drawn write: an edit of a fresh copy of the object, raw
// JSON patch operations, or a delete.
type move struct {
	theme string
	// pod, when >= 0, is the adversary's pod that must send it (the
	// holder of its grant, the principal of its places).
	pod  int
	edit func(l *coordinationv1.Lease)
	raw  []jsonOp
	del  bool
	// kinds narrows the kinds that can send it (nil: any that fits).
	kinds []string
	desc  string
}

// theme draws moves against the Lease as read.
type theme struct {
	name   string
	weight int
	draw   func(a *adversary, r *rand.Rand, w *view) move
}

// view is what one write knows: the Lease as just read, and who is who.
type view struct {
	cur      *coordinationv1.Lease
	queue    []lease.Waiter
	pod      int // the pod that read it, the sender unless the move says
	self     *adversaryPod
	sibling  *adversaryPod
	token    int64
	maxSeq   int64
	duration int32
	// podIDs are identities "<pod>_<uid>" of pods: the adversary's own,
	// the pod creator's, the honest participants'.
	podIDs []string
}

// write draws and sends write i.
func (a *adversary) write(ctx context.Context, i uint64) {
	r := rand.New(rand.NewPCG(a.seed, i))
	podIdx := r.IntN(len(a.pods))
	cur, err := a.pods[podIdx].leases.Get(ctx, a.name, metav1.GetOptions{})
	if err != nil {
		if ctx.Err() == nil {
			a.stats.add("lease", "read", "read", classify(err))
		}
		return
	}
	w := a.viewOf(cur, podIdx)
	switch a.surfaceOf(i) {
	case "pods":
		a.creator.write(ctx, a, i, r, w)
		return
	case "fenced":
		a.fenced.write(ctx, a, i, r, w)
		return
	}
	m := a.drawMove(r, w)
	if m.pod >= 0 && m.pod != podIdx {
		w = a.viewOf(cur, m.pod)
	}
	kind := a.pickKind(r, m)
	req := a.request(w, m)
	sentAt := time.Now()
	body, written, err := kind.send(ctx, r, req)
	if ctx.Err() != nil && err != nil {
		return // the run ended while it was in flight
	}
	outcome := classify(err)
	noChange := req.raw == nil && req.after != nil && sameContent(req.before, req.after)
	if err == nil && (noChange || written != nil && sameContent(req.before, written.Object)) {
		outcome, written = "accepted, no change", nil
	}
	a.stats.add("lease", kind.name(), m.theme, outcome)
	e := entry{i: i, at: sentAt, pod: w.self.name, kind: kind.name(), theme: m.theme, desc: m.desc, body: body,
		outcome: outcome, err: errText(err)}
	if written != nil {
		e.version = written.GetResourceVersion()
	}
	a.journal.add(e)
}

// surfaceOf draws the surface write i goes to, from a stream of its own
// (a seed's Lease writes keep their draws).
func (a *adversary) surfaceOf(i uint64) string {
	x := rand.New(rand.NewPCG(a.seed^surfaceSalt, i)).Float64()
	switch {
	case a.creator != nil && x < podShare:
		return "pods"
	case a.fenced != nil && x >= podShare && x < podShare+fencedShare:
		return "fenced"
	}
	return "lease"
}

// podIdentities are the identities "<pod>_<uid>" of the adversary's own
// pods, of the honest participants' and of the pod creator's.
func (a *adversary) podIdentities() []string {
	out := slices.Clone(a.victims)
	for _, p := range a.pods {
		out = append(out, locksv1alpha1.PodIdentity(p.pod.Name, string(p.pod.UID), ""))
	}
	if a.creator != nil {
		a.creator.mu.Lock()
		for _, p := range a.creator.pods {
			if p.uid != "" {
				out = append(out, locksv1alpha1.PodIdentity(p.name, string(p.uid), ""))
			}
		}
		a.creator.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

func (a *adversary) viewOf(cur *coordinationv1.Lease, pod int) *view {
	w := &view{cur: cur, queue: lease.Queue(cur), pod: pod, self: &a.pods[pod], sibling: &a.pods[(pod+1)%len(a.pods)],
		token: lease.Token(cur), duration: 3, podIDs: a.podIdentities()}
	for _, p := range w.queue {
		w.maxSeq = max(w.maxSeq, p.Seq)
	}
	if d, ok := lease.ParseNumber(cur.Annotations[locksv1alpha1.LeaseDurationAnnotation]); ok && d > 0 && d <= math.MaxInt32 {
		w.duration = int32(d)
	}
	return w
}

func (a *adversary) drawMove(r *rand.Rand, w *view) move {
	if a.yield.Load() {
		return yieldMove(a, r, w)
	}
	total := 0
	for _, t := range a.themes {
		total += t.weight
	}
	n := r.IntN(total)
	for _, t := range a.themes {
		if n < t.weight {
			m := t.draw(a, r, w)
			if m.theme == "" {
				m.theme = t.name
			}
			return m
		}
		n -= t.weight
	}
	panic("unreachable")
}

func (a *adversary) pickKind(r *rand.Rand, m move) writeKind {
	var names []string
	switch {
	case m.kinds != nil:
		names = m.kinds
	case m.del:
		names = []string{"delete"}
	case m.raw != nil:
		names = []string{"json-patch"}
	default:
		names = []string{"json-patch", "json-patch", "json-patch", "merge-patch", "merge-patch", "merge-patch", "update", "update",
			"update", "strategic-merge", "apply"}
	}
	return a.kinds[pick(r, names...)]
}

// request is m about the Lease w shows.
func (a *adversary) request(w *view, m move) request {
	asJSON := func(l *coordinationv1.Lease) map[string]any {
		obj := toJSON(l).(map[string]any)
		obj["apiVersion"], obj["kind"] = "coordination.k8s.io/v1", "Lease"
		return obj
	}
	req := request{res: w.self.dyn.Resource(coordinationv1.SchemeGroupVersion.WithResource("leases")).Namespace(a.ns), name: a.name,
		before: asJSON(w.cur), raw: m.raw,
		tests: []jsonOp{{Op: "test", Path: "/spec/leaseTransitions", Value: w.cur.Spec.LeaseTransitions},
			{Op: "test", Path: "/spec/holderIdentity", Value: w.cur.Spec.HolderIdentity}}}
	if !m.del && m.raw == nil {
		req.after = asJSON(edited(w, m))
	}
	return req
}

// edited is a copy of the view's Lease with m's edit applied.
func edited(w *view, m move) *coordinationv1.Lease {
	l := w.cur.DeepCopy()
	if m.edit != nil {
		m.edit(l)
	}
	return l
}

// sameContent reports whether two objects as JSON differ in nothing but
// their resourceVersion and managed fields.
func sameContent(a, b map[string]any) bool {
	strip := func(obj map[string]any) any {
		c := (&unstructured.Unstructured{Object: obj}).DeepCopy()
		c.SetResourceVersion("")
		c.SetManagedFields(nil)
		return toJSON(c.Object)
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// principals are the adversary's own.
func (a *adversary) principals() []string {
	out := make([]string, len(a.pods))
	for i, p := range a.pods {
		out[i] = p.principal
	}
	return out
}

// podOf is the index of the adversary's pod whose principal is p, or -1.
func (a *adversary) podOf(p string) int {
	return slices.IndexFunc(a.pods, func(x adversaryPod) bool { return x.principal == p })
}

// ownPlaces are the tickets of the places principal holds in l (as
// queued-by says, well formed or not).
func ownPlaces(l *coordinationv1.Lease, principal string) []string {
	var out []string
	for k, v := range l.Annotations {
		if t, ok := strings.CutPrefix(k, locksv1alpha1.QueuedByPrefix); ok && v == principal {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// newAdversaryPods makes n pods of ServiceAccount sa in ns, each with its
// real pod-bound token.
func newAdversaryPods(t *testing.T, ns, sa string, n int) []adversaryPod {
	t.Helper()
	pods := make([]adversaryPod, n)
	for i := range pods {
		p := newPodParticipant(t, ns, sa, fmt.Sprintf("%s-%d", sa, i))
		p.cfg.UserAgent = p.name // the field manager its writes record
		pods[i] = adversaryPod{participant: p, username: "system:serviceaccount:" + ns + ":" + sa,
			leases: kubernetes.NewForConfigOrDie(p.cfg).CoordinationV1().Leases(ns), dyn: dynamic.NewForConfigOrDie(p.cfg)}
	}
	return pods
}
