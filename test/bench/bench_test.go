package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
)

const holderEnv = "FRONTDESK_BENCH_HOLDER"

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		// Re-executed as the holder process of a failover trial.
		os.Exit(HolderMain(os.Args[1:]))
	}
	// The benches print tables, not controller-runtime logs; a logger set
	// here also keeps controller-runtime from warning that none was set.
	ctrl.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// A short run of the benchmark: it must measure every row with real,
// positive latencies and print the tables. (Timings are not asserted: speed
// is measured by `make bench`, not by tests.) The writes, counted by the
// apiserver, are asserted: a renewal is one Lease write and no status
// write, and a grant costs a bounded number of writes whatever the number
// of waiters, in the order they queued.
func TestBenchShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rows, writes, err := Run(ctx, Options{Iterations: 20, Handoffs: 10, HandoffRounds: 2, Waiters: []int{1, 3}, Crowds: []int{20},
		LeaseDurationSeconds: 15, LeaseGuard: true}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(writes) != 4 {
		t.Fatalf("%d writes rows, want 4:\n%s", len(writes), out.String())
	}
	// A crowd arriving at once at a free lock: every client but the first
	// loses the race for it (a write each), then registers once (a merge
	// patch, spread out) and is handed the lock (a write): three writes per
	// grant, and a lost race more now and then when the lock falls free
	// while most of the crowd is still spread out.
	if r := writes[3]; r.N != 20 || r.LeaseWrites+r.LeaseConflicts > 3.5 {
		t.Errorf("%s: %+v; want at most 3.5 Lease writes per grant, lost races included", r.Scenario, r)
	}
	writes = writes[:3]
	// The two counts are read a moment apart: one renewal more or less at
	// either end of the window.
	if r := writes[0]; r.N < 10 || r.LeaseWrites > 1+2.0/float64(r.N) || r.StatusWrites != 0 {
		t.Errorf("renewals: %+v; want 1 Lease write and no status write each", r)
	}
	for _, r := range writes[1:] {
		// Per grant: the waiter's registration and the release that hands
		// it the lock (the holder follows its Lease, so its copy is fresh;
		// a registration racing the release costs a 409). Status: the grant,
		// and the waiter count (status.waiting) when the controller sees the
		// registration in a pass of its own. None of it grows with waiters.
		if r.N < 10 || r.LeaseWrites > 3 || r.LeaseConflicts > 1.5 || r.StatusWrites > 2 || r.WorstOvertaking != 0 {
			t.Errorf("%s: %+v; want at most 3 Lease writes, 1.5 conflicts and 2 status writes per grant, in queue order", r.Scenario, r)
		}
		// Every grant's writes reach at least the controller's watch.
		if r.LeaseEvents < r.LeaseWrites || r.LeaseReads < 0 || r.LockReads < 0 {
			t.Errorf("%s: %+v; the apiserver's watch events and reads were not counted", r.Scenario, r)
		}
	}
	// Two handoff rows per waiter count, and a third when some handoffs
	// came while waiters were still joining the queue.
	queueing := 0
	for _, r := range rows {
		if strings.Contains(r.Name, "still queueing") {
			queueing++
		}
	}
	// Raw CAS three times (the second after a pause, the third on a Lease
	// carrying a queue of 3), four uncontended rows (a raw CAS interleaved
	// with the acquires among them).
	if wantRows := 7 + 2*2 + queueing; len(rows) != wantRows || queueing > 2 {
		t.Fatalf("%d rows (%d of handoffs while queueing), want %d:\n%s", len(rows), queueing, wantRows, out.String())
	}
	for _, r := range rows {
		// From Release returning, the next holder may hold already (the
		// release handed the lock on in its own write): 0 is a real value
		// there. Every other row measures at least one round trip.
		floor := time.Duration(1)
		if strings.Contains(r.Name, "Release returned") {
			floor = 0
		}
		if len(r.Samples) == 0 || r.Percentile(50) < floor || r.Percentile(99) < r.Percentile(50) {
			t.Errorf("row %q: %d samples, p50 %s, p99 %s", r.Name, len(r.Samples), r.Percentile(50), r.Percentile(99))
		}
		if !strings.Contains(out.String(), r.Name) {
			t.Errorf("table lacks row %q", r.Name)
		}
		// Every waiter count gets exactly its handoffs, in turns.
		if strings.HasPrefix(r.Name, "handoff") && !strings.Contains(r.Name, "still queueing") && len(r.Samples) != 10 {
			t.Errorf("row %q: %d samples, want the 10 handoffs asked for", r.Name, len(r.Samples))
		}
	}
}

// Options that cannot be measured are refused before anything starts.
func TestBenchRefusesBadOptions(t *testing.T) {
	for _, opts := range []Options{
		{Iterations: 1, Handoffs: 0, Waiters: []int{1}},
		{Iterations: 0, Handoffs: 1, Waiters: []int{1}},
		{Iterations: 1, Handoffs: 1},
		{Iterations: 1, Handoffs: 1, Waiters: []int{10, 10}},
		{Iterations: 1, Handoffs: 1, Waiters: []int{0}},
	} {
		if _, _, err := Run(context.Background(), opts, io.Discard); err == nil {
			t.Errorf("%+v: no error", opts)
		}
	}
}

func TestPercentile(t *testing.T) {
	r := Row{Samples: []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {1, 1}} {
		if got := r.Percentile(tc.p); got != tc.want {
			t.Errorf("p%v = %d, want %d", tc.p, got, tc.want)
		}
	}
	if got := (Row{}).Percentile(50); got != 0 {
		t.Errorf("p50 of nothing = %d", got)
	}
}

// A small run of the controller-cost measurement: grants show in status,
// renewals write none (at most one status write per grant), the manager's
// memory is read, and foreign Leases and unrelated pods send the manager no
// watch events. (No timings are asserted.)
func TestCostShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rows, err := RunCost(ctx, CostOptions{Sizes: []int{30}, RenewalsPerSecond: 25, Duration: 5 * time.Second, Pods: 50,
		ForeignLeases: 100, ForeignChurn: true}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].RSSBytes <= 0 || rows[0].PeakRSSBytes < rows[0].RSSBytes || len(rows[0].Lag.Samples) < 5 {
		t.Fatalf("cost rows = %+v\n%s", rows, out.String())
	}
	if r := rows[0]; r.Renewals < 50 || r.StatusWrites > r.Grants {
		t.Errorf("%d renewals and %d grants made %d status writes; want at most one per grant, none per renewal", r.Renewals, r.Grants, r.StatusWrites)
	}
	// The manager watches only the Leases of locks and the pods that take
	// part: the foreign Leases' renewals and the unrelated pods' changes
	// reach no one but kube-apiserver's own pod watch.
	if r := rows[0]; r.ForeignLeaseWrites == 0 || r.PodWrites == 0 {
		t.Errorf("no foreign churn: %d foreign Lease writes, %d pod writes", r.ForeignLeaseWrites, r.PodWrites)
	}
	if r := rows[0]; r.LeaseEvents > float64(r.Renewals+r.Grants+10) {
		t.Errorf("%.0f Lease watch events for %d renewals and %d grants of locks: the manager watches foreign Leases (%d writes)",
			r.LeaseEvents, r.Renewals, r.Grants, r.ForeignLeaseWrites)
	}
	if r := rows[0]; r.PodEvents > float64(r.PodWrites+5) {
		t.Errorf("%.0f pod watch events for %d changes of unrelated pods: someone besides kube-apiserver watches them", r.PodEvents, r.PodWrites)
	}
	if !strings.Contains(out.String(), "controller cost") || !strings.Contains(out.String(), "50 unrelated pods") {
		t.Errorf("no table printed:\n%s", out.String())
	}
}

// A short side-by-side run: every system measured, failover included, and
// frontdesk's failover on proof beside its failover after the lease.
func TestPeersShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	opts := PeersOptions{TTL: 2 * time.Second, Iterations: 10, Throughput: 500 * time.Millisecond, Locks: []int{1, 3}, Handoffs: 5,
		FailoverTrials: 1, ProofTrials: 2, HolderCommand: []string{os.Args[0]}, HolderEnv: []string{holderEnv + "=1"}}
	rows, err := RunPeers(ctx, opts, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if len(rows) != 4 {
		t.Fatalf("%d rows, want raw CAS, frontdesk, etcd and Redis (measured or skipped):\n%s", len(rows), out.String())
	}
	for _, r := range rows {
		if strings.HasPrefix(r.Note, "skipped") {
			t.Logf("%s not measured, %s", r.System, r.Note)
			continue
		}
		if len(r.Uncontend.Samples) == 0 || r.Throughput[1] <= 0 || r.Throughput[3] <= 0 {
			t.Errorf("%s: uncontended %d samples, throughput %v", r.System, len(r.Uncontend.Samples), r.Throughput)
		}
		if r.System != "raw Lease CAS" && (len(r.Handoff.Samples) == 0 || len(r.Failover.Samples) != 1 || r.Failover.Samples[0] <= 0) {
			t.Errorf("%s: handoff %d samples, failover %v", r.System, len(r.Handoff.Samples), r.Failover.Samples)
		}
		if r.System != "frontdesk" && len(r.ProofFailover.Samples) != 0 {
			t.Errorf("%s: failover on proof %v, measured for frontdesk only", r.System, r.ProofFailover.Samples)
		}
	}
	expectProofBelowLease(t, rows[1], opts, out.String())
}

// expectProofBelowLease checks frontdesk's failover on proof: every trial
// measured (each checked the proof ended the grant: proofFailoverOnce), and
// the slowest below both the TTL and the failover after the lease. Not a
// timing of the machine: a grant that waited out the lease would be above.
func expectProofBelowLease(t *testing.T, fd PeerRow, opts PeersOptions, out string) {
	t.Helper()
	proof := fd.ProofFailover
	if fd.System != "frontdesk" || len(proof.Samples) != opts.ProofTrials || proof.Percentile(50) <= 0 || len(fd.Failover.Samples) == 0 {
		t.Fatalf("%s: failover on proof %v (want %d trials), after the lease %v", fd.System, proof.Samples, opts.ProofTrials, fd.Failover.Samples)
	}
	if slowest := proof.Percentile(100); slowest >= opts.TTL || slowest >= fd.Failover.Percentile(0) {
		t.Errorf("failover on proof %v: not below the TTL (%s) and the failover after the lease (%v)", proof.Samples, opts.TTL, fd.Failover.Samples)
	}
	t.Logf("frontdesk failover on proof %v, after the lease %v (TTL %s)", proof.Samples, fd.Failover.Samples, opts.TTL)
	if !strings.Contains(out, "frontdesk failover on proof") {
		t.Errorf("no failover on proof line:\n%s", out)
	}
}

// A short run of the guard's price: participants write on both sides, the
// guard is in force on one only (setupGuardPrice checks that), and every row
// has samples on both sides. (No timings are asserted.)
func TestGuardPriceShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rows, err := RunGuardPrice(ctx, GuardPriceOptions{Iterations: 4, Block: 2, Handoffs: 4, HandoffBlock: 2, Waiters: []int{1, 3},
		Queues: []int{2}, Locks: []int{1, 3}, Throughput: 300 * time.Millisecond, ThroughputRounds: 2, LeaseDurationSeconds: 15}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	// uncontended 2, single writes 4 per queue (2 and the worst), handoffs
	// 2, throughput 2.
	if len(rows) != 2+4*2+2+2 {
		t.Fatalf("%d rows:\n%s", len(rows), out.String())
	}
	for _, r := range rows {
		if r.Goal == "tput" {
			if len(r.GuardedRates) != 2 || len(r.OpenRates) != 2 || mean(r.GuardedRates) <= 0 || mean(r.OpenRates) <= 0 {
				t.Errorf("%s: rates %v and %v", r.Name, r.GuardedRates, r.OpenRates)
			}
			continue
		}
		if len(r.Guarded.Samples) == 0 || len(r.Open.Samples) == 0 || r.Guarded.Percentile(50) <= 0 || r.Open.Percentile(50) <= 0 {
			t.Errorf("%s: %d guarded and %d open samples", r.Name, len(r.Guarded.Samples), len(r.Open.Samples))
		}
		if _, lo, hi := r.Ratio(); lo <= 0 || hi < lo {
			t.Errorf("%s: band [%.2f, %.2f]", r.Name, lo, hi)
		}
	}
	if !strings.Contains(out.String(), "worst Lease") || !strings.Contains(out.String(), "the ValidatingAdmissionPolicy plugin") {
		t.Errorf("no worst Lease rows, or no account of the guard's checks:\n%s", out.String())
	}
}
