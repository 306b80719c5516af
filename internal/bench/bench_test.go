package bench

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

const holderEnv = "FRONTDESK_BENCH_HOLDER"

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		// Re-executed as the holder process of a failover trial.
		os.Exit(HolderMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// A short run of the benchmark: it must measure every row with real,
// positive latencies and print the table. (Timings are not asserted: speed
// is measured by `make bench`, not by tests.)
func TestBenchShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rows, err := Run(ctx, Options{Iterations: 20, Handoffs: 10, Waiters: []int{1, 3}, LeaseDurationSeconds: 15}, &out)
	if err != nil {
		t.Fatal(err)
	}
	wantRows := 4 + 2*2
	if len(rows) != wantRows {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), wantRows, out.String())
	}
	for _, r := range rows {
		if len(r.Samples) == 0 || r.Percentile(50) <= 0 || r.Percentile(99) < r.Percentile(50) {
			t.Errorf("row %q: %d samples, p50 %s, p99 %s", r.Name, len(r.Samples), r.Percentile(50), r.Percentile(99))
		}
		if !strings.Contains(out.String(), r.Name) {
			t.Errorf("table lacks row %q", r.Name)
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

// A small run of the controller-cost measurement: every renewal shows in
// status, and the manager's memory is read. (No numbers are asserted.)
func TestCostShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rows, err := RunCost(ctx, CostOptions{Sizes: []int{30}, RenewalsPerSecond: 20, Duration: 2 * time.Second, Pods: 50}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].RSSBytes <= 0 || rows[0].PeakRSSBytes < rows[0].RSSBytes || len(rows[0].Lag.Samples) < 10 {
		t.Fatalf("cost rows = %+v\n%s", rows, out.String())
	}
	if !strings.Contains(out.String(), "controller cost") || !strings.Contains(out.String(), "50 unrelated pods") {
		t.Errorf("no table printed:\n%s", out.String())
	}
}

// A short side-by-side run: every system measured, failover included.
func TestPeersShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rows, err := RunPeers(ctx, PeersOptions{TTL: 2 * time.Second, Iterations: 10, Throughput: 500 * time.Millisecond,
		Locks: []int{1, 3}, Handoffs: 5, FailoverTrials: 1, HolderCommand: []string{os.Args[0]}, HolderEnv: []string{holderEnv + "=1"}}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if len(rows) != 4 {
		t.Fatalf("%d rows, want raw CAS, frontdesk, etcd and Redis (measured or skipped):\n%s", len(rows), out.String())
	}
	for _, r := range rows {
		if strings.HasPrefix(r.Note, "skipped") {
			continue
		}
		if len(r.Uncontend.Samples) == 0 || r.Throughput[1] <= 0 || r.Throughput[3] <= 0 {
			t.Errorf("%s: uncontended %d samples, throughput %v", r.System, len(r.Uncontend.Samples), r.Throughput)
		}
		if r.System != "raw Lease CAS" && (len(r.Handoff.Samples) == 0 || len(r.Failover.Samples) != 1 || r.Failover.Samples[0] <= 0) {
			t.Errorf("%s: handoff %d samples, failover %v", r.System, len(r.Handoff.Samples), r.Failover.Samples)
		}
	}
}
