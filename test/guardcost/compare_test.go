package guardcost

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A policy restructured for its cost decides as the version it replaces:
// GUARDCOST_COMPARE=<another policy.yaml> evaluates both on the same
// writes (honest ones, and random changes of every part of the Lease, on
// queues holding places outside the grammar too) and compares which
// validations refuse each write. (Opt-in: it compares with a file you
// choose, e.g. `git show <rev>:config/lease-policy/policy.yaml`.)
func TestDecidesAsAnotherVersion(t *testing.T) {
	other := os.Getenv("GUARDCOST_COMPARE")
	if other == "" {
		t.Skip("GUARDCOST_COMPARE=<policy.yaml> compares this policy's decisions with that one's")
	}
	p, err := LoadPolicy("lease-guard")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GUARDCOST_POLICY", other)
	q, err := LoadPolicy("lease-guard")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Validations) != len(q.Spec.Validations) {
		t.Fatalf("%d validations against %d: compare refusals by index only between versions with the same rules", len(p.Spec.Validations), len(q.Spec.Validations))
	}
	cp, err := Compile(p, celconfig.PerCallLimit)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := Compile(q, celconfig.PerCallLimit)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(41, 15))
	n := 3000
	if s := os.Getenv("GUARDCOST_COMPARE_N"); s != "" {
		_, _ = fmt.Sscan(s, &n)
	}
	admitted, skipped := 0, 0
	for i := range n {
		w, what := randomWrite(rng)
		rp, err := cp.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget)
		if err != nil {
			t.Fatal(err)
		}
		rq, err := cq.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget)
		if err != nil {
			t.Fatal(err)
		}
		if rp.Admitted() {
			admitted++
		}
		if !rp.Matched && rq.Matched {
			skipped++
		}
		for j, m := range rp.Messages {
			if m == "" && j < len(rq.Messages) && rq.Messages[j] != "" {
				t.Errorf("case %d (%s): validation %d refuses with no message (the other version says %q)", i, what, rp.Denied[j], rq.Messages[j])
			}
		}
		// A write one version does not judge (its matchConditions skip it)
		// the other must admit.
		if rp.Admitted() != rq.Admitted() || rp.Matched && rq.Matched && (!slices.Equal(rp.Denied, rq.Denied) || (len(rp.Errors) == 0) != (len(rq.Errors) == 0)) {
			t.Errorf("case %d (%s): this policy: denied %v, errors %v; the other: denied %v, errors %v\nold %v\nnew %v",
				i, what, rp.Denied, rp.Errors, rq.Denied, rq.Errors, w.Old.Annotations, w.New.Annotations)
		}
	}
	t.Logf("%d writes, %d admitted (%d of them not judged by this version, judged by the other), the same decisions", n, admitted, skipped)
}

var compareUsers = []user.Info{
	PodUser("ns", "alice", "a1", "aaaaaaaa-0000-0000-0000-000000000001"),
	PodUser("ns", "alice", "a2", "aaaaaaaa-0000-0000-0000-000000000002"),
	PodUser("ns", "bob", "b1", "bbbbbbbb-0000-0000-0000-000000000001"),
	&user.DefaultInfo{Name: "carol", Groups: []string{"system:authenticated"}},
}

func principalOf(u user.Info) string { return lease.Principal(u.GetName(), u.GetExtra()) }

// randomLease is a lock's Lease with a queue of the grammar's places of
// the compare users and others, some places outside the grammar, maybe a
// grant.
func randomLease(rng *rand.Rand) *coordinationv1.Lease {
	l := ManagedLease("ns", "lock", 15)
	n := rng.IntN(8)
	q := make([]lease.Waiter, 0, n)
	for i := range n {
		u := compareUsers[rng.IntN(len(compareUsers))]
		prio := int32(0)
		if rng.IntN(4) == 0 {
			prio = int32(rng.IntN(5) - 2)
		}
		q = append(q, lease.Waiter{Ticket: fmt.Sprintf("t%d", i), Identity: fmt.Sprintf("w%d", i), Priority: prio, Principal: principalOf(u)})
	}
	l = lease.SetQueue(l, q)
	// Equal seqs happen (two registrations at the same moment).
	if len(q) > 1 && rng.IntN(3) == 0 {
		a, b := q[rng.IntN(len(q))], q[rng.IntN(len(q))]
		wa, _ := lease.ParsePlace(a.Ticket, l.Annotations[lease.EntryKey(a.Ticket)])
		wb, _ := lease.ParsePlace(b.Ticket, l.Annotations[lease.EntryKey(b.Ticket)])
		l.Annotations[lease.EntryKey(a.Ticket)] = fmt.Sprintf("%d,%d,%s", wa.Priority, wb.Seq, wa.Identity)
	}
	bad := []string{"x", "0,1", "00,1,w", "0,01,w", "1,2,", "-0,3,w", "2147483648,4,w", "0,9999999999999999,w", "0,5, w", "a,b,c", "0,99999999999999999999,w", ""}
	for i := range rng.IntN(3) {
		ticket := fmt.Sprintf("bad%d", i)
		switch rng.IntN(4) {
		case 0: // a value outside the grammar
			l.Annotations[lease.EntryKey(ticket)] = bad[rng.IntN(len(bad))]
			l.Annotations[lease.QueuedByKey(ticket)] = principalOf(compareUsers[rng.IntN(len(compareUsers))])
		case 1: // a ticket outside the grammar
			ticket = "Bad_" + ticket
			l.Annotations[lease.EntryKey(ticket)] = fmt.Sprintf("%d,%d,x", rng.IntN(3)-1, rng.IntN(12)+1)
			l.Annotations[lease.QueuedByKey(ticket)] = principalOf(compareUsers[0])
		case 2: // no queued-by
			l.Annotations[lease.EntryKey(ticket)] = fmt.Sprintf("%d,%d,x", rng.IntN(3)-1, rng.IntN(12)+1)
		default: // a queued-by outside the grammar
			l.Annotations[lease.EntryKey(ticket)] = fmt.Sprintf("0,%d,x", rng.IntN(12)+1)
			l.Annotations[lease.QueuedByKey(ticket)] = "nobody"
		}
	}
	if rng.IntN(3) > 0 {
		u := compareUsers[rng.IntN(len(compareUsers))]
		var err error
		if l, err = lease.Grant(l, "holder", principalOf(u), 15*time.Second, time.Now()); err != nil {
			panic(err)
		}
	}
	return l
}

// randomWrite is an honest write, or a random change, on a random Lease by
// a random user (allowed to break and prioritize now and then).
func randomWrite(rng *rand.Rand) (Write, string) {
	old := randomLease(rng)
	u := compareUsers[rng.IntN(len(compareUsers))]
	w := Write{Old: old, User: u}
	if rng.IntN(5) == 0 {
		w.Allowed = func(string) bool { return true }
	}
	now := time.Now()
	apply := func(p *lease.Patch) *coordinationv1.Lease {
		l, err := p.ApplyTo(old)
		if err != nil {
			return old.DeepCopy()
		}
		return l
	}
	var what string
	switch op := rng.IntN(12); op {
	case 0:
		what, w.New = "renew", apply(lease.RenewPatch(old, now))
	case 1:
		what, w.New = "release", apply(lease.ReleasePatch(old))
	case 2:
		what = "hand-off"
		if p, _, ok, err := lease.HandOffPatch(old, lease.Holder(old), 15*time.Second, now); ok && err == nil {
			w.New = apply(p)
		}
	case 3:
		what = "registration"
		if p, _, err := lease.ExactRegistration(old, lease.Waiter{Ticket: "mine", Identity: "me", Priority: int32(rng.IntN(3) - 1),
			Principal: principalOf(u)}); err == nil {
			w.New = apply(p)
		}
	case 4:
		what = "withdrawal of a random place"
		w.New = old.DeepCopy()
		for k := range old.Annotations {
			if t, ok := strings.CutPrefix(k, locksv1alpha1.QueueEntryPrefix); ok && rng.IntN(2) == 0 {
				delete(w.New.Annotations, k)
				if rng.IntN(4) > 0 {
					delete(w.New.Annotations, lease.QueuedByKey(t))
				}
				delete(w.New.Labels, locksv1alpha1.FrontLabelPrefix+t)
				break
			}
		}
	case 5:
		what = "grant"
		ticket := ""
		if q := lease.Queue(old); len(q) > 0 && rng.IntN(2) == 0 {
			ticket = q[rng.IntN(len(q))].Ticket
		}
		if p, err := lease.GrantPatch(old, "me", principalOf(u), ticket, "n1", 15*time.Second, now); err == nil {
			w.New = apply(p)
		}
	case 6:
		what = "hand-off to a random place"
		if q := lease.Queue(old); len(q) > 0 {
			if p, _, ok, err := lease.HandOffPatch(old, lease.Holder(old), 15*time.Second, now); ok && err == nil {
				l := apply(p)
				pick := q[rng.IntN(len(q))]
				l.Spec.HolderIdentity = &pick.Identity
				l.Annotations[locksv1alpha1.TicketAnnotation] = pick.Ticket
				l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = pick.Principal
				l.Annotations[lease.EntryKey(q[0].Ticket)] = old.Annotations[lease.EntryKey(q[0].Ticket)]
				l.Annotations[lease.QueuedByKey(q[0].Ticket)] = old.Annotations[lease.QueuedByKey(q[0].Ticket)]
				delete(l.Annotations, lease.EntryKey(pick.Ticket))
				delete(l.Annotations, lease.QueuedByKey(pick.Ticket))
				w.New = l
			}
		}
	case 7:
		what = "registration with a random seq"
		l := old.DeepCopy()
		l.Annotations[lease.EntryKey("mine")] = fmt.Sprintf("0,%d,me", rng.IntN(12)+1)
		l.Annotations[lease.QueuedByKey("mine")] = principalOf(u)
		w.New = l
	default:
		what = "random changes"
		l := old.DeepCopy()
		keys := []string{"locks.frontdesk.dev/lock-uid", locksv1alpha1.HolderPrincipalAnnotation, locksv1alpha1.TicketAnnotation,
			locksv1alpha1.HandedOffByAnnotation, locksv1alpha1.GrantNonceAnnotation, locksv1alpha1.BrokenAtAnnotation, "other/key",
			lease.EntryKey("t0"), lease.QueuedByKey("t0"), lease.EntryKey("t1"), lease.QueuedByKey("t1"), lease.EntryKey("new"), lease.QueuedByKey("new")}
		values := []string{"", "x", "0,1,w", "0,9,me", principalOf(u), principalOf(compareUsers[0]), "holder", "7", "8"}
		for range rng.IntN(3) + 1 {
			k := keys[rng.IntN(len(keys))]
			if rng.IntN(3) == 0 {
				delete(l.Annotations, k)
			} else {
				l.Annotations[k] = values[rng.IntN(len(values))]
			}
		}
		if rng.IntN(3) == 0 {
			l.Spec.LeaseTransitions = new(*l.Spec.LeaseTransitions + int32(rng.IntN(3)-1))
		}
		if rng.IntN(3) == 0 {
			l.Spec.HolderIdentity = new([]string{"holder", "me", "w0", ""}[rng.IntN(4)])
		}
		if rng.IntN(4) == 0 {
			l.Labels[locksv1alpha1.FrontLabelPrefix+[]string{"t0", "t1", "new", "mine"}[rng.IntN(4)]] = "true"
		}
		w.New = l
	}
	if w.New == nil {
		w.New = old.DeepCopy()
		what += " (not possible: an unchanged write)"
	}
	return w, what
}
