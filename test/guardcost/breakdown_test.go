package guardcost

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	celconfig "k8s.io/apiserver/pkg/apis/cel"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The cost of each variable (with those it uses) and each validation and
// message expression (with the variables it evaluates), on each of the
// worst Lease's writes: where the guard's cost goes. Logged only, with
// GUARDCOST_BREAKDOWN=1 (go test -v).
func TestCostBreakdown(t *testing.T) {
	if os.Getenv("GUARDCOST_BREAKDOWN") == "" {
		t.Skip("GUARDCOST_BREAKDOWN=1 logs the cost of every expression")
	}
	p, err := LoadPolicy("lease-guard")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var took time.Duration
	cost := func(w Write, validations []admissionregistrationv1.Validation) (int64, int64) {
		q := p.DeepCopy()
		q.Spec.Validations = validations
		c, err := Compile(q, celconfig.PerCallLimit*100)
		if err != nil {
			t.Fatal(err)
		}
		var r Result
		start := time.Now()
		for range 5 {
			if r, err = c.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget*100); err != nil {
				t.Fatal(err)
			}
		}
		took = time.Since(start) / 5
		return r.CallCost, r.MessageCost
	}
	full, err := Compile(p, celconfig.PerCallLimit)
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range worstWrites(t) {
		all, msgs := cost(w, p.Spec.Validations)
		times := make([]time.Duration, 0, 21)
		for range 21 {
			start := time.Now()
			if _, err := full.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget); err != nil {
				t.Fatal(err)
			}
			times = append(times, time.Since(start))
		}
		slices.Sort(times)
		t.Logf("== %s: validations %d, messages %d; evaluation p50 %s in process", name, all, msgs, times[10])
		if os.Getenv("GUARDCOST_BREAKDOWN") == "time" {
			continue
		}
		for _, v := range p.Spec.Variables {
			c, _ := cost(w, []admissionregistrationv1.Validation{{Expression: "type(variables." + v.Name + ") == type(variables." + v.Name + ")"}})
			if c > 1000 {
				t.Logf("   variable %-18s %9d %s", v.Name, c, took)
			}
		}
		for i, v := range p.Spec.Validations {
			c, m := cost(w, []admissionregistrationv1.Validation{v})
			t.Logf("   validation %2d %9d  message %9d %s", i, c, m, took)
		}
	}
}

// BenchmarkWorstWrites times the guard's evaluation of each of the worst
// Lease's writes, in process (go test -bench . -run ^$).
func BenchmarkWorstWrites(b *testing.B) {
	p, err := LoadPolicy("lease-guard")
	if err != nil {
		b.Fatal(err)
	}
	c, err := Compile(p, celconfig.PerCallLimit)
	if err != nil {
		b.Fatal(err)
	}
	n := lease.MaxPlaces
	if s := os.Getenv("GUARDCOST_PLACES"); s != "" {
		_, _ = fmt.Sscan(s, &n)
	}
	for name, w := range writesAt(b, n) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.Evaluate(context.Background(), w, celconfig.RuntimeCELCostBudget); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSmallWrites times the guard's evaluation of a renewal and a
// registration on a Lease with one place (go test -bench Small -run ^$).
func BenchmarkSmallWrites(b *testing.B) {
	p, err := LoadPolicy("lease-guard")
	if err != nil {
		b.Fatal(err)
	}
	c, err := Compile(p, celconfig.PerCallLimit)
	if err != nil {
		b.Fatal(err)
	}
	u := PodUser("ns", "sa", "pod", "11111111-1111-1111-1111-111111111111")
	principal := lease.Principal(u.GetName(), u.GetExtra())
	l := lease.SetQueue(ManagedLease("ns", "small", 15), []lease.Waiter{{Ticket: "0000000000000001", Identity: "waiter-0", Principal: "user=waiter-0"}})
	held, err := lease.Grant(l, "holder", principal, 15*time.Second, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	renewed, err := lease.RenewPatch(held, time.Now()).ApplyTo(held)
	if err != nil {
		b.Fatal(err)
	}
	reg, _, err := lease.ExactRegistration(held, lease.Waiter{Ticket: "0000000000000002", Identity: "me", Principal: principal})
	if err != nil {
		b.Fatal(err)
	}
	registered, err := reg.ApplyTo(held)
	if err != nil {
		b.Fatal(err)
	}
	for name, w := range map[string]Write{"renewal": {Old: held, New: renewed, User: u}, "registration": {Old: held, New: registered, User: u}} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				r, err := c.Evaluate(context.Background(), w, celconfig.RuntimeCELCostBudget)
				if err != nil || !r.Admitted() {
					b.Fatal(err, r)
				}
			}
		})
	}
}
