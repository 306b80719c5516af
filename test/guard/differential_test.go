package guard

import (
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The differential checks: each builds Lease writes around one value of
// the grammar and asserts that the guard (every target) admits a write
// exactly when Go's reading of the grammar (pkg/lease/grammar.go and the
// writers and readers built on it) says the write is well formed, and
// that where the guard reads a number or a place, it reads what Go reads.

// checkRegistration: the worker registers a place with ticket and value.
// The queue holds, before, one place a seq below the value's (read
// leniently), so that the seq rule holds for any value whose seq the
// grammar might take and the grammar alone decides. The guard must admit
// exactly the places Go's ParsePlace reads (not pod-<uid> tickets, the
// manager's), behind the queue as Go reads it; above priority 0 only with
// the verb prioritize. Go's own registration must render the same value.
func checkRegistration(t testing.TB, ticket, value string) {
	t.Helper()
	base := "base"
	if ticket == base {
		base = "base-1"
	}
	old := lockLease()
	if s, ok := lenientSeq(value); ok && s > 1 && s-1 <= lease.MaxSeq {
		old = withPlace(old, base, "0,"+strconv.FormatInt(s-1, 10)+",base", new(other))
	}
	me := worker()
	principal := principalOf(me)
	written := withPlace(old, ticket, value, &principal)

	w, ok := lease.ParsePlace(ticket, value)
	maxSeq, tied := seqAfter(old, ticket)
	want := ok && !strings.HasPrefix(ticket, locksv1alpha1.PodTicketPrefix) && lease.ValidPrincipal(principal) && (w.Seq == maxSeq+1 || w.Seq == maxSeq && tied)
	what := fmt.Sprintf("registration of ticket %q value %q", ticket, value)
	expect(t, update(old, written, me, "prioritize"), want, what+" (may prioritize)")
	expect(t, update(old, written, me), want && w.Priority <= 0, what)

	if want && w.Seq == maxSeq+1 {
		patch, placed, err := lease.Registration(old, lease.Waiter{Identity: w.Identity, Ticket: ticket, Priority: w.Priority, Principal: principal})
		if err != nil {
			t.Fatalf("%s: Go's Registration: %v", what, err)
		}
		var m struct {
			Metadata struct{ Annotations map[string]string }
		}
		if err := json.Unmarshal(patch, &m); err != nil {
			t.Fatal(err)
		}
		if got := m.Metadata.Annotations[lease.EntryKey(ticket)]; got != value || placed.Seq != w.Seq {
			t.Errorf("%s: Go renders the place it parsed as %q (seq %d)", what, got, placed.Seq)
		}
	}
}

// lenientSeq is the second field of a place's value read as leniently as
// strconv reads it (a sign, leading zeros).
func lenientSeq(value string) (int64, bool) {
	parts := strings.SplitN(value, ",", 3)
	if len(parts) < 2 {
		return 0, false
	}
	s, err := strconv.ParseInt(parts[1], 10, 64)
	return s, err == nil
}

// seqAfter is the highest seq in l's queue as Go reads it, and whether a
// place with ticket may take that seq too (the guard's tie rule, for
// registrations merged at the same moment: every place at that seq has a
// key that sorts before the ticket's).
func seqAfter(l *coordinationv1.Lease, ticket string) (int64, bool) {
	var maxSeq int64
	q := lease.Queue(l)
	for _, w := range q {
		maxSeq = max(maxSeq, w.Seq)
	}
	return maxSeq, !slices.ContainsFunc(q, func(w lease.Waiter) bool {
		return w.Seq == maxSeq && lease.EntryKey(w.Ticket) >= lease.EntryKey(ticket)
	})
}

// placesProbe reads the queue as the guard orders it: the places it
// counts (oldPlaces), with priority, seq and identity read as its hand-off
// rules read them, and their principal.
const placesProbe = `variables.oldPlaces.map(k, [dyn(k.substring(26)), dyn(int(variables.oldAnn[k].split(',')[0])),
	dyn(int(variables.oldAnn[k].split(',')[1])), dyn(variables.oldAnn[k].split(',', 3)[2]),
	dyn(variables.oldAnn['queued-by.locks.frontdesk.dev/' + k.substring(26)])])`

// checkReading: the guard reads l's queue as Go's lease.Queue does: the
// same places (a place Go skips, the guard does not count), the same
// numbers, the same highest seq.
func checkReading(t testing.TB, l *coordinationv1.Lease) {
	t.Helper()
	if !storable(l) {
		return // no Lease holds it
	}
	var want []any
	var maxSeq int64
	for _, w := range lease.Queue(l) {
		want = append(want, []any{w.Ticket, int64(w.Priority), w.Seq, w.Identity, w.Principal})
		maxSeq = max(maxSeq, w.Seq)
	}
	slices.SortFunc(want, byTicket)
	req := update(l, l, worker())
	for _, g := range mustGuards(t) {
		got, err := probe(g, "lease-guard", placesProbe, req)
		if err != nil {
			t.Fatalf("%s: reading the queue: %v\nannotations: %q", g.Target.Name, err, l.Annotations)
		}
		places, _ := got.([]any)
		slices.SortFunc(places, byTicket)
		if !reflect.DeepEqual(places, want) {
			t.Errorf("DISAGREEMENT on %s: the guard reads the queue as %v, Go as %v\nannotations: %q", g.Target.Name, places, want, l.Annotations)
		}
		got, err = probe(g, "lease-guard", "variables.oldMaxSeq", req)
		if err != nil || got != maxSeq {
			t.Errorf("DISAGREEMENT on %s: the guard reads the highest seq as %v (%v), Go as %d\nannotations: %q", g.Target.Name, got, err, maxSeq, l.Annotations)
		}
	}
}

func byTicket(a, b any) int { return cmp.Compare(a.([]any)[0].(string), b.([]any)[0].(string)) }

// checkHandOff: the holder hands the lock on, from old (held by the
// worker) to each place of its queue in turn. The guard admits only the
// hand-off to the head of the queue as Go orders it, written by Go's
// HandOffPatch; to any other place, written the same way, it refuses.
func checkHandOff(t testing.TB, old *coordinationv1.Lease) {
	t.Helper()
	if !storable(old) {
		return
	}
	old = viaJSON(t, old)
	me := worker()
	q := lease.Queue(old)
	for key := range old.Annotations {
		ticket, ok := strings.CutPrefix(key, locksv1alpha1.QueueEntryPrefix)
		if !ok {
			continue
		}
		what := fmt.Sprintf("hand-off to %q (%q) in queue %q", ticket, old.Annotations[key], queueOf(old))
		if len(q) > 0 && q[0].Ticket == ticket {
			p, head, ok, err := lease.HandOffPatch(old, lease.Holder(old), duration*time.Second, now)
			if err != nil || !ok || head.Ticket != ticket {
				t.Fatalf("%s: Go's HandOffPatch: %v %v %v", what, head, ok, err)
			}
			expect(t, update(old, apply(t, old, p), me), true, what+" (the head, by Go's HandOffPatch)")
			continue
		}
		expect(t, update(old, handOff(old, ticket), me), false, what)
	}
}

// handOff is old handed to the place with ticket, as HandOffPatch writes
// a hand-off (the identity read leniently from the place's value).
func handOff(old *coordinationv1.Lease, ticket string) *coordinationv1.Lease {
	l := old.DeepCopy()
	value := old.Annotations[lease.EntryKey(ticket)]
	identity := value
	if parts := strings.SplitN(value, ",", 3); len(parts) == 3 {
		identity = parts[2]
	}
	t := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity = new(identity)
	l.Spec.LeaseTransitions = new(*old.Spec.LeaseTransitions + 1)
	l.Spec.AcquireTime, l.Spec.RenewTime = &t, &t
	l.Spec.LeaseDurationSeconds = new(int32(duration))
	for _, k := range locksv1alpha1.GrantAnnotations {
		delete(l.Annotations, k)
	}
	if by, ok := old.Annotations[lease.QueuedByKey(ticket)]; ok {
		l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = by
	}
	l.Annotations[locksv1alpha1.TicketAnnotation] = ticket
	l.Annotations[locksv1alpha1.HandedOffByAnnotation] = lease.Holder(old)
	delete(l.Annotations, lease.EntryKey(ticket))
	delete(l.Annotations, lease.QueuedByKey(ticket))
	delete(l.Labels, locksv1alpha1.FrontLabelPrefix+ticket)
	return l
}

// queueOf is l's queue annotations, for failures.
func queueOf(l *coordinationv1.Lease) map[string]string {
	out := map[string]string{}
	for k, v := range l.Annotations {
		if lease.IsQueueKey(k) {
			out[k] = v
		}
	}
	return out
}

// checkGrant: u takes the free lock with Go's GrantPatch, as identity,
// with nonce. The guard admits it exactly when the grant's values as
// stored are of the grammar: the holder identity, the nonce, and u's
// principal, which the grant records.
func checkGrant(t testing.TB, identity, nonce string, u user.Info) {
	t.Helper()
	old := lockLease()
	p, err := lease.GrantPatch(old, identity, principalOf(u), "", nonce, duration*time.Second, now)
	if err != nil {
		t.Fatal(err)
	}
	written := apply(t, old, p)
	want := lease.ValidIdentity(lease.Holder(written)) && lease.ValidNonce(written.Annotations[locksv1alpha1.GrantNonceAnnotation]) &&
		lease.ValidPrincipal(written.Annotations[locksv1alpha1.HolderPrincipalAnnotation]) &&
		written.Annotations[locksv1alpha1.HolderPrincipalAnnotation] == principalOf(u)
	expect(t, update(old, written, u), want, fmt.Sprintf("grant to identity %q, nonce %q, by %q", identity, nonce, principalOf(u)))
}

// checkPrincipal: u, whatever its username and pod, takes a free lock
// (Go's GrantPatch) and registers a place in its own name: the guard
// admits both exactly when u's principal, as Go forms it, is of the
// grammar; and a place recorded with that principal counts in the queue,
// for both readers, exactly then.
func checkPrincipal(t testing.TB, u user.Info) {
	t.Helper()
	if u.GetName() == managerUser {
		return // the manager's writes are not the guard's (lease-token-guard aside)
	}
	principal := principalOf(u)
	checkGrant(t, "me", "n-2", u)
	old := lockLease()
	written := withPlace(old, "t-1", "0,1,me", &principal)
	expect(t, update(old, written, u), lease.ValidPrincipal(principal), fmt.Sprintf("registration by %q", principal))
	checkReading(t, written)
}

// numberProbes read, from the same Lease, the numbers the guard takes
// from the manager's annotations, with what Go reads.
var numberProbes = []struct {
	policy, expr string
	goRead       func(*coordinationv1.Lease) any
}{
	{"lease-guard", "variables.oldEpoch", func(l *coordinationv1.Lease) any { return lease.Epoch(l) }},
	{"lease-guard", "variables.epoch", func(l *coordinationv1.Lease) any { return lease.Epoch(l) }},
	{"lease-token-guard", "variables.oldEpoch", func(l *coordinationv1.Lease) any { return lease.Epoch(l) }},
	{"lease-token-guard", "variables.epoch", func(l *coordinationv1.Lease) any { return lease.Epoch(l) }},
	{"lease-guard", "variables.grantDuration", func(l *coordinationv1.Lease) any {
		var v any = int64(lease.GrantDuration(l, time.Hour) / time.Second)
		return &v
	}},
}

// checkNumber: a number of the grammar (NumberPattern) where the manager
// writes one (token-epoch, lease-duration) is read the same by both, Go's
// grant on such a Lease is admitted, and a break names the token it
// raised the lock to (broken-at) only with a number Go reads.
func checkNumber(t testing.TB, s string) {
	t.Helper()
	me := worker()
	for _, key := range []string{locksv1alpha1.TokenEpochAnnotation, locksv1alpha1.LeaseDurationAnnotation} {
		l := lockLease()
		l.Annotations[key] = s
		if !storable(l) {
			continue
		}
		l = viaJSON(t, l)
		for _, g := range mustGuards(t) {
			for _, np := range numberProbes {
				got, err := probe(g, np.policy, np.expr, update(l, l, me))
				if want := np.goRead(l); err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("DISAGREEMENT on %s: %s %q: the guard's %s reads %v (%v), Go %v", g.Target.Name, key, s, np.expr,
						show(got), err, show(want))
				}
			}
		}
		p, err := lease.GrantPatch(l, "me", principalOf(me), "", "n-2", duration*time.Second, now)
		if err != nil {
			t.Fatal(err)
		}
		expect(t, update(l, apply(t, l, p), me), true, fmt.Sprintf("Go's grant on a Lease with %s %q", key, s))
	}

	old := heldBy(lockLease(), "holder", other)
	p, err := lease.BreakPatch(old)
	if err != nil {
		t.Fatal(err)
	}
	written := apply(t, old, p)
	written.Annotations[locksv1alpha1.BrokenAtAnnotation] = s
	_, ok := lease.ParseNumber(s)
	expect(t, update(old, written, me, "break"), ok, fmt.Sprintf("break naming broken-at %q", s))
}

func show(v any) string {
	if p, ok := v.(*any); ok {
		if p == nil {
			return "none"
		}
		return fmt.Sprintf("optional(%v)", *p)
	}
	return fmt.Sprint(v)
}

// probes are compiled once per guard.
var probes sync.Map

// probe evaluates expr over policy's variables on req.
func probe(g *Guard, policy, expr string, req Request) (any, error) {
	key := g.Target.Name + "\x00" + policy + "\x00" + expr
	pr, ok := probes.Load(key)
	if !ok {
		p := g.Policy(policy)
		if p == nil {
			return nil, fmt.Errorf("no policy %s", policy)
		}
		compiled, err := p.Probe(expr)
		if err != nil {
			return nil, err
		}
		pr, _ = probes.LoadOrStore(key, compiled)
	}
	return g.Eval(pr.(*Probe), req)
}
