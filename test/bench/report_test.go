package bench

import (
	"slices"
	"testing"
	"time"

	"github.com/frontdesk-dev/frontdesk/test/bench/report"
)

// latencies is a row of these many milliseconds.
func latencies(n ...int) Row {
	r := Row{}
	for _, v := range n {
		r.Samples = append(r.Samples, time.Duration(v)*time.Millisecond)
	}
	return r
}

// goalsOf is each row name's goal bound and comparison, for the rows with one.
func goalsOf(t report.Table) map[string]report.Goal {
	out := map[string]report.Goal{}
	for _, r := range t.Rows {
		if r.Goal != nil {
			out[r.Name] = *r.Goal
		}
	}
	return out
}

// The handoffs are held to their goals: one waiter against the raw CAS
// after the same pause, 50 and more waiters against one waiter.
func TestLatencyTableHoldsTheHandoffsToTheirGoals(t *testing.T) {
	named := func(name string, r Row) Row { r.Name = name; return r }
	rows := []Row{named("raw", latencies(2)), named("paused", latencies(4)),
		named("handoff, 1 waiters: Release called → next holds", latencies(5)),
		named("handoff, 10 waiters: Release called → next holds", latencies(6)),
		named("handoff, 200 waiters: Release called → next holds", latencies(7))}
	tab := LatencyTable(rows, Options{Waiters: []int{1, 10, 200}, LeaseDurationSeconds: 15})
	if len(tab.Rows) != len(rows)+3 {
		t.Fatalf("%d rows, want the %d measured and 3 ratios", len(tab.Rows), len(rows))
	}
	want := map[string]float64{"handoff, 1 waiter: p50 over the raw CAS's after 100ms": 2, "handoff, 200 waiters: p50 over 1 waiter's": 1.3}
	goals := goalsOf(tab)
	if len(goals) != len(want) {
		t.Errorf("goals %v, want %v", goals, want)
	}
	for name, bound := range want {
		if g, ok := goals[name]; !ok || g.Bound != bound || g.Cmp != "<=" {
			t.Errorf("%s: goal %+v, want at most %g", name, g, bound)
		}
	}
	if r := tab.Rows[len(tab.Rows)-1]; r.Value != 7.0/5 {
		t.Errorf("200 over 1: %g, want 1.4", r.Value)
	}
}

// A renewal is one Lease write and no status write; a grant at most 3 and
// 1, in arrival order; a crowd has no goal.
func TestWritesTableGoals(t *testing.T) {
	tab := WritesTable([]WritesRow{
		{Scenario: "holding the lock", Per: "renewal", N: 25, LeaseWrites: 1.04, WorstOvertaking: -1},
		{Scenario: "grants, 50 waiters queued", Per: "grant", N: 100, LeaseWrites: 2.1, StatusWrites: 1.3},
		{Scenario: "grants, 20 clients arriving at once", Per: "grant", N: 20, LeaseWrites: 3, WorstOvertaking: -1},
	})
	goals := goalsOf(tab)
	for name, bound := range map[string]float64{
		"holding the lock, per renewal": 1 + 2.0/25, "renewal: status writes": 0,
		"grants, 50 waiters queued, per grant": 3, "grants, 50 waiters queued: status writes per grant": 2,
		"grants, 50 waiters queued: worst overtaking": 0,
	} {
		if g, ok := goals[name]; !ok || g.Bound != bound {
			t.Errorf("%s: goal %+v, want at most %g", name, g, bound)
		}
	}
	if len(goals) != 5 {
		t.Errorf("%d goals, want 5 (none for the crowd): %v", len(goals), goals)
	}
}

// Frontdesk's failover on proof sits beside its failover after the lease,
// and its slowest trial is held to under 1 s.
func TestPeersTableHoldsTheFailoverOnProofToItsGoal(t *testing.T) {
	fd := PeerRow{System: "frontdesk", Uncontend: latencies(8), Failover: latencies(1800, 1810), ProofFailover: latencies(30, 45)}
	tab := PeersTable([]PeerRow{fd}, PeersOptions{TTL: 2 * time.Second})
	names := make([]string, len(tab.Rows))
	for i, r := range tab.Rows {
		names[i] = r.Name
	}
	crash, proof := slices.Index(names, failoverRow("frontdesk", fd.Failover).Name), slices.Index(names, proofFailoverRow("frontdesk", fd.ProofFailover).Name)
	if crash < 0 || proof != crash+1 {
		t.Fatalf("rows %q: want the failover on proof right after the crash failover", names)
	}
	g, ok := goalsOf(tab)["frontdesk: failover on proof, slowest"]
	if !ok || g.Cmp != "<" || g.Bound != 1 {
		t.Fatalf("failover on proof goal %+v, want under 1 s", g)
	}
	if r := tab.Rows[len(tab.Rows)-1]; r.Name != "frontdesk: failover on proof, slowest" || r.Value != 0.045 || r.N != 2 {
		t.Errorf("goal row %+v, want the slowest trial, 0.045 s of 2", r)
	}
	if rows := FailoverTable(FailoverRows{Lease: fd.Failover, Proof: fd.ProofFailover}, PeersOptions{TTL: 2 * time.Second}); len(goalsOf(rows)) != 2 {
		t.Errorf("--failover-only's table: goals %v, want the crash failover's and the failover on proof's", goalsOf(rows))
	}
}
