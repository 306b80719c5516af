package guardcost

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	celconfig "k8s.io/apiserver/pkg/apis/cel"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// worstWrites are a participant's writes on the worst Lease, each as the
// library makes it: the holder's renewal, release and hand-off (to the head
// of a full queue), another participant's registration (the last place the
// queue may hold) and withdrawal, and a grant by the head of a full queue
// on a free lock.
func worstWrites(t testing.TB) map[string]Write {
	t.Helper()
	return writesAt(t, lease.MaxPlaces)
}

// writesAt is worstWrites on a queue of n places (MaxPlaces: the worst).
func writesAt(t testing.TB, n int) map[string]Write {
	t.Helper()
	ns, sa := LongestServiceAccount(0)
	holderUID, joinerUID := "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
	holderUser, joinerUser := PodUser(ns, sa, "holder", holderUID), PodUser(ns, sa, "joiner", joinerUID)
	holderPrincipal := lease.Principal(holderUser.GetName(), holderUser.GetExtra())
	joinerPrincipal := lease.Principal(joinerUser.GetName(), joinerUser.GetExtra())
	holder := WorstIdentity("holder", 0)
	must := func(l *coordinationv1.Lease, err error) *coordinationv1.Lease {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	now := time.Now()
	writes := map[string]Write{}
	held := must(WorstLease(ns, "worst", n-1, holder, holderPrincipal))
	writes["renewal"] = Write{Old: held, New: must(lease.RenewPatch(held, now).ApplyTo(held)), User: holderUser}
	writes["release"] = Write{Old: held, New: must(lease.ReleasePatch(held).ApplyTo(held)), User: holderUser}
	ho, _, ok, err := lease.HandOffPatch(held, holder, 15*time.Second, now)
	if err != nil || !ok {
		t.Fatalf("hand-off: %v, %t", err, ok)
	}
	writes["hand-off"] = Write{Old: held, New: must(ho.ApplyTo(held)), User: holderUser}
	reg, _, err := lease.ExactRegistration(held, lease.Waiter{Ticket: WorstTicket("joiner", 0), Identity: WorstIdentity("joiner", 0),
		Priority: lease.MinPriority, Principal: joinerPrincipal})
	if err != nil {
		t.Fatal(err)
	}
	full := must(reg.ApplyTo(held))
	writes["registration"] = Write{Old: held, New: full, User: joinerUser}
	wd, err := lease.Withdrawal(WorstTicket("joiner", 0))
	if err != nil {
		t.Fatal(err)
	}
	writes["withdrawal"] = Write{Old: full, New: must(mergeApply(full, wd)), User: joinerUser}
	// A grant on a free lock with a full queue, by the head, whose place
	// leaves in the same write.
	free := must(WorstLease(ns, "worst", n, "", ""))
	head := lease.Queue(free)[0]
	headUser := PodUser(ns, sa, "head", "33333333-3333-3333-3333-333333333333")
	free.Annotations[lease.QueuedByKey(head.Ticket)] = lease.Principal(headUser.GetName(), headUser.GetExtra())
	gp, err := lease.GrantPatch(free, head.Identity, free.Annotations[lease.QueuedByKey(head.Ticket)], head.Ticket, "nonce-1", 15*time.Second, now)
	if err != nil {
		t.Fatal(err)
	}
	writes["grant by the head"] = Write{Old: free, New: must(gp.ApplyTo(free)), User: headUser}
	return writes
}

// mergeApply applies a JSON merge patch of annotations and labels (a
// withdrawal) to a copy of l.
func mergeApply(l *coordinationv1.Lease, patch []byte) (*coordinationv1.Lease, error) {
	var p struct {
		Metadata struct {
			Annotations map[string]*string `json:"annotations"`
			Labels      map[string]*string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, err
	}
	out := l.DeepCopy()
	for k, v := range p.Metadata.Annotations {
		if v == nil {
			delete(out.Annotations, k)
		} else {
			out.Annotations[k] = *v
		}
	}
	for k, v := range p.Metadata.Labels {
		if v == nil {
			delete(out.Labels, k)
		} else {
			out.Labels[k] = *v
		}
	}
	return out, nil
}

// Every honest write on the worst Lease the rules allow is admitted by the
// lease guard with a quarter of the apiserver's CEL budgets: a quarter of
// the per-expression limit (PerCallLimit) for each of its programs, a
// quarter of the per-call budget (RuntimeCELCostBudget) for the validations
// and the variables they evaluate, and the message expressions from what
// remains. The costs are logged (go test -v).
func TestWorstLeaseWithinAQuarterOfTheCELBudgets(t *testing.T) {
	p, err := LoadPolicy("lease-guard")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compile(p, celconfig.PerCallLimit/4)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, w := range worstWrites(t) {
		r, err := c.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget/4)
		if err != nil {
			t.Fatal(err)
		}
		// A renewal by its holder is skipped by the matchConditions.
		if r.Matched == (name == "renewal") || !r.Admitted() || len(r.MessageErrors) > 0 {
			t.Errorf("%s: matched %t, denied by %v, errors %v, message errors %v", name, r.Matched, r.Denied, r.Errors, r.MessageErrors)
			continue
		}
		most, err := ExpressionCost(ctx, p, w, celconfig.PerCallLimit)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Matched {
			t.Logf("%-18s not judged: matchConditions %d of %d; costliest expression %d", name, r.MatchCost,
				celconfig.RuntimeCELCostBudgetMatchConditions, most)
			continue
		}
		t.Logf("%-18s per call: validations %8d + messages %7d of %d (%5.1fx headroom); costliest expression %7d of %d (%5.1fx); matchConditions %d",
			name, r.CallCost, r.MessageCost, celconfig.RuntimeCELCostBudget,
			float64(celconfig.RuntimeCELCostBudget)/float64(r.CallCost+r.MessageCost), most, celconfig.PerCallLimit,
			float64(celconfig.PerCallLimit)/float64(most), r.MatchCost)
	}
}
