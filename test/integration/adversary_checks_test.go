package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The adversary run's invariants that are checked from records (the
// Lease's history, the lock's status, the manager's log, the queue at the
// end), and what a failure shows of them.

// checkQueueAtEnd checks (d): with the run over, every queue annotation
// is a well-formed place (lease.Queue reads it) and its front label names
// a queued ticket; no honest participant (all done) keeps a place. Then,
// with the adversary's pods deleted, the queue of the free lock empties
// within a turn and a half per place and two leases more (the controller
// removes the head of a free lock's queue whose turn passed).
func (run *adversaryRun) checkQueueAtEnd(adv *adversary) {
	l, err := clientset.CoordinationV1().Leases(run.ns).Get(context.Background(), run.name, metav1.GetOptions{})
	if err != nil {
		run.violatef("d", "reading the Lease at the end: %v", err)
		return
	}
	byKind := map[string][]queueProblem{}
	for _, problem := range queueProblems(l) {
		byKind[problem.kind] = append(byKind[problem.kind], problem)
	}
	for kind, problems := range byKind {
		var examples []string
		for _, p := range problems[:min(len(problems), 3)] {
			examples = append(examples, p.msg)
		}
		run.violateAboutf(problems[0].ticket, "d", "at the end of the run the Lease carries %d %s, e.g. %s", len(problems), kind,
			strings.Join(examples, "; "))
	}
	honest := map[string]bool{}
	for _, h := range run.honest {
		honest[h.p.principal] = true
	}
	for _, p := range lease.Queue(l) {
		if honest[p.Principal] {
			run.violatef("d", "at the end of the run the honest %s keeps place %s (%q)", p.Principal, p.Ticket, l.Annotations[lease.EntryKey(p.Ticket)])
		}
	}

	for _, p := range adv.pods {
		if err := clientset.CoreV1().Pods(run.ns).Delete(context.Background(), p.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
			run.t.Errorf("deleting the adversary's pod %s: %v", p.name, err)
		}
	}
	places := len(lease.Queue(l))
	bound := time.Duration(places+1)*(lease.TurnLength(run.lease)*3/2) + 2*run.lease + 5*time.Second
	if adv.creator != nil {
		bound += 2 * run.lease // a grant of a bound pod of the pod creator's, deleted at once, is waited out
	}
	deadline := time.Now().Add(bound)
	var left []string
	for time.Now().Before(deadline) {
		cur, err := clientset.CoordinationV1().Leases(run.ns).Get(context.Background(), run.name, metav1.GetOptions{})
		if err == nil {
			left = queueKeys(cur)
			if len(left) == 0 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	needle := ""
	if len(left) > 0 {
		_, needle, _ = strings.Cut(left[0], "/")
	}
	run.violateAboutf(needle, "d", "%s after the run (%d places then, the adversary's pods deleted), the free lock's Lease still carries %v",
		bound.Round(time.Second), places, left)
}

// queueProblem is a queue annotation or front label that is not a
// well-formed place or its label.
type queueProblem struct{ kind, ticket, msg string }

// queueProblems lists the queue annotations and front labels of l that
// are not a well-formed place or its label.
func queueProblems(l *coordinationv1.Lease) []queueProblem {
	seen := map[string]bool{}
	for _, p := range lease.Queue(l) {
		seen[p.Ticket] = true
	}
	var out []queueProblem
	for k, v := range l.Annotations {
		if t, ok := strings.CutPrefix(k, locksv1alpha1.QueueEntryPrefix); ok && !seen[t] {
			out = append(out, queueProblem{"queue entries that are not a place lease.Queue reads", t, fmt.Sprintf("%s=%q (by %q)", k, v, l.Annotations[lease.QueuedByKey(t)])})
		}
		if t, ok := strings.CutPrefix(k, locksv1alpha1.QueuedByPrefix); ok && !seen[t] {
			out = append(out, queueProblem{"queued-by annotations of no place lease.Queue reads", t, fmt.Sprintf("%s=%q (its entry: %q)", k, v, l.Annotations[lease.EntryKey(t)])})
		}
	}
	for k := range l.Labels {
		if t, ok := strings.CutPrefix(k, locksv1alpha1.FrontLabelPrefix); ok && !seen[t] {
			out = append(out, queueProblem{"front labels of no queued ticket", t, k})
		}
	}
	return out
}

// versionsBetween describes the versions of the Lease received in [from,
// to]: who wrote each (the adversary's write, or an honest client or the
// manager) and what it changed.
func (run *adversaryRun) versionsBetween(from, to time.Time) []string {
	var out []string
	for i := 1; i < len(run.versions) && i < len(run.receivedAt); i++ {
		if run.receivedAt[i].Before(from) || run.receivedAt[i].After(to) {
			continue
		}
		by := "an honest client or the manager"
		if e, ok := run.adv.journal.wrote(run.versions[i].ResourceVersion); ok {
			by = fmt.Sprintf("the adversary's write #%d (%s %s/%s)", e.i, e.pod, e.kind, e.theme)
		}
		prev, cur := run.versions[i-1].DeepCopy(), run.versions[i].DeepCopy()
		for _, l := range []*coordinationv1.Lease{prev, cur} {
			l.ResourceVersion, l.ManagedFields = "", nil
		}
		var changes []string
		for _, op := range diffOps("", toJSON(prev), toJSON(cur)) {
			c := op.Op + " " + strings.TrimPrefix(op.Path, "/metadata")
			if op.Value != nil {
				c += "=" + trunc(fmt.Sprint(op.Value))
			}
			changes = append(changes, c)
		}
		out = append(out, fmt.Sprintf("%s rv %s by %s: %s", run.receivedAt[i].Format("15:04:05.000"), run.versions[i].ResourceVersion, by,
			strings.Join(changes, "; ")))
	}
	return out
}

// historyMentioning describes the versions of the Lease whose annotations
// or labels naming needle differ from the version before, with the field
// managers (and their operation) that last wrote the version.
func historyMentioning(versions []coordinationv1.Lease, needle string, j *journal) []string {
	keys := func(l *coordinationv1.Lease) map[string]string {
		out := map[string]string{}
		for k, v := range l.Annotations {
			if strings.Contains(k, needle) || strings.Contains(v, needle) {
				out["annotation "+k] = v
			}
		}
		for k, v := range l.Labels {
			if strings.Contains(k, needle) {
				out["label "+k] = v
			}
		}
		return out
	}
	var out []string
	for i := 1; i < len(versions); i++ {
		before, after := keys(&versions[i-1]), keys(&versions[i])
		var changes []string
		for k, v := range after {
			if old, ok := before[k]; !ok || old != v {
				changes = append(changes, fmt.Sprintf("+%s=%q", k, v))
			}
		}
		for k := range before {
			if _, ok := after[k]; !ok {
				changes = append(changes, "-"+k)
			}
		}
		if len(changes) == 0 {
			continue
		}
		by := "an honest client or the manager"
		if e, ok := j.wrote(versions[i].ResourceVersion); ok {
			by = fmt.Sprintf("the adversary's write #%d", e.i)
		}
		slices.Sort(changes)
		out = append(out, fmt.Sprintf("resourceVersion %s (holder %q, token %d), written by %s: %s", versions[i].ResourceVersion,
			lease.Holder(&versions[i]), lease.Token(&versions[i]), by, strings.Join(changes, " ")))
	}
	return out
}

// queueKeys lists the queue's annotations and front labels on l.
func queueKeys(l *coordinationv1.Lease) []string {
	var out []string
	for k := range l.Annotations {
		if lease.IsQueueKey(k) {
			out = append(out, k)
		}
	}
	for k := range l.Labels {
		if lease.IsFrontLabel(k) {
			out = append(out, k)
		}
	}
	return out
}

// statusHistory records each version of a lock's status.
type statusHistory struct {
	mu    sync.Mutex
	lines []statusLine
}

type statusLine struct {
	at   time.Time
	line string
	// holder, holderPod and token are the status's.
	holder, holderPod string
	token             int64
}

// watchLockStatus records the status of lock ns/name until ctx ends.
func watchLockStatus(ctx context.Context, t *testing.T, ns, name string) *statusHistory {
	h := &statusHistory{}
	wc, err := client.NewWithWatch(restConfig(), client.Options{Scheme: manager.NewScheme()})
	if err != nil {
		t.Fatalf("a watching client: %v", err)
	}
	w, err := wc.Watch(ctx, &locksv1alpha1.DistributedLockList{}, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
	if err != nil {
		t.Fatalf("watching lock %s/%s: %v", ns, name, err)
	}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				lk, ok := ev.Object.(*locksv1alpha1.DistributedLock)
				if !ok {
					continue
				}
				held := meta.FindStatusCondition(lk.Status.Conditions, locksv1alpha1.ConditionHeld)
				reason := ""
				if held != nil {
					reason = held.Reason
				}
				h.mu.Lock()
				h.lines = append(h.lines, statusLine{at: time.Now(), line: fmt.Sprintf("rv %s: holder %q (pod %q), fencing token %d, Held %s",
					lk.ResourceVersion, lk.Status.Holder, lk.Status.HolderPod, lk.Status.FencingToken, reason),
					holder: lk.Status.Holder, holderPod: lk.Status.HolderPod, token: lk.Status.FencingToken})
				h.mu.Unlock()
			}
		}
	}()
	return h
}

// all lists every version received.
func (h *statusHistory) all() []statusLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines)
}

// between lists the versions received in [from, to].
func (h *statusHistory) between(from, to time.Time) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, l := range h.lines {
		if !l.at.Before(from) && !l.at.After(to) {
			out = append(out, l.at.Format("15:04:05.000")+" "+l.line)
		}
	}
	return out
}

// reconcileErrorLog collects the manager's "Reconciler error" log entries
// about the locks of one namespace, by error.
type reconcileErrorLog struct {
	mu     sync.Mutex
	counts map[string]int
	first  map[string]time.Time
}

// note is a log watcher (managerLog.watch) for namespace ns.
func (l *reconcileErrorLog) note(ns string) func(string) {
	return func(entry string) {
		if !strings.Contains(entry, "Reconciler error") || !strings.Contains(entry, ns) {
			return
		}
		msg := entry
		if _, after, ok := strings.Cut(entry, `"error": "`); ok {
			msg = after
		}
		msg = strings.ReplaceAll(strings.TrimSpace(msg), ns, "<ns>")
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.counts == nil {
			l.counts, l.first = map[string]int{}, map[string]time.Time{}
		}
		if l.counts[msg] == 0 {
			l.first[msg] = time.Now()
		}
		l.counts[msg]++
	}
}

// matching counts the entries whose error match says so.
func (l *reconcileErrorLog) matching(match func(string) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for msg, c := range l.counts {
		if match(msg) {
			n += c
		}
	}
	return n
}

func (l *reconcileErrorLog) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for msg, n := range l.counts {
		shown := msg
		if len(shown) > 300 {
			shown = shown[:300] + "..."
		}
		fmt.Fprintf(&b, "  %d× (first at %s) %s\n", n, l.first[msg].Format("15:04:05.000"), shown)
	}
	return b.String()
}

// checkTokens checks (b) on the Lease's history: the token never goes
// down; every grant (a version whose holder, token, principal or acquire
// time is not the version before's) has a token above every earlier
// grant's, so no token is granted twice; and every honest grant is on the
// history as the grant of its token, its tokens rising in grant order.
func (run *adversaryRun) checkTokens(versions []coordinationv1.Lease) {
	type grant struct {
		holder, principal, acquire string
		version                    string
	}
	byToken := map[int64]grant{}
	last := int64(-1)
	for i := 1; i < len(versions); i++ {
		prev, cur := &versions[i-1], &versions[i]
		if lease.Token(cur) < lease.Token(prev) {
			run.violatef("b", "the token went down from %d to %d (resourceVersion %s)", lease.Token(prev), lease.Token(cur), cur.ResourceVersion)
		}
		if lease.Holder(cur) == "" {
			continue
		}
		gr := grant{holder: lease.Holder(cur), principal: cur.Annotations[locksv1alpha1.HolderPrincipalAnnotation],
			acquire: fmt.Sprint(cur.Spec.AcquireTime), version: cur.ResourceVersion}
		same := lease.Holder(prev) == gr.holder && lease.Token(prev) == lease.Token(cur) &&
			prev.Annotations[locksv1alpha1.HolderPrincipalAnnotation] == gr.principal && fmt.Sprint(prev.Spec.AcquireTime) == gr.acquire
		if same {
			continue
		}
		token := lease.Token(cur)
		if before, ok := byToken[token]; ok {
			run.violatef("b", "token %d granted twice: to %q (%s, acquired %s, resourceVersion %s), then to %q (%s, acquired %s, resourceVersion %s)",
				token, before.holder, before.principal, before.acquire, before.version, gr.holder, gr.principal, gr.acquire, gr.version)
		} else if token <= last {
			run.violatef("b", "grant of token %d to %q (%s, resourceVersion %s) after a grant of token %d", token, gr.holder, gr.principal,
				gr.version, last)
		}
		byToken[token] = gr
		last = max(last, token)
	}
	run.mu.Lock()
	grants := append([]*honestGrant(nil), run.grants...)
	run.mu.Unlock()
	prev := int64(-1)
	for _, hg := range grants {
		if hg.token <= prev {
			run.violatef("b", "%s got token %d after an honest grant of token %d", hg.identity, hg.token, prev)
		}
		prev = max(prev, hg.token)
		if gr, ok := byToken[hg.token]; ok && (gr.holder != hg.identity || gr.principal != hg.who.p.principal) {
			run.violatef("b", "%s (%s) got token %d, which the Lease granted to %q (%s, resourceVersion %s)", hg.identity, hg.who.p.principal,
				hg.token, gr.holder, gr.principal, gr.version)
		}
	}
}
