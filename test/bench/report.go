package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/frontdesk-dev/frontdesk/test/bench/report"
)

// The goals of docs/benchmarks.md ("Goals") that a run's figures are
// compared with.
const (
	goalHandoffOverPaused = 2.0  // one waiter's handoff p50, over the raw CAS's after the same pause
	goalHandoffCrowd      = 1.3  // 50 and more waiters' handoff p50, over one waiter's
	goalGrantLeaseWrites  = 3.0  // Lease writes per grant among queued waiters
	goalGrantStatusWrites = 2.0  // status writes per grant among queued waiters: the holder, and status.waiting when a pass sees the registration first
	goalFailoverSlack     = 0.25 // seconds past the TTL within which a crashed holder's lock is held again
	goalProofFailover     = 1.0  // seconds from the kubelet's report of a holder's death to the next holder's grant
	goalPriceRatio        = 1.15 // the guard's price on a p50
	goalPriceWorstMillis  = 1.0  // the guard's price on the worst Lease, in ms
	goalPriceThroughput   = 0.90 // throughput with the guard, over without
)

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// p50 is a latency row's figure as the reports give it: its p50, with its
// p99 beside it.
func p50(name string, r Row, more ...report.Figure) report.Row {
	return report.Row{Name: name, N: len(r.Samples), Figure: report.Figure{Label: "p50", Value: millis(r.Percentile(50)), Unit: report.Millis},
		Detail: append([]report.Figure{{Label: "p99", Value: millis(r.Percentile(99)), Unit: report.Millis}}, more...)}
}

// ratio is a row of a over b (their p50s).
func ratio(name string, a, b Row, goal *report.Goal) report.Row {
	return report.Row{Name: name, Figure: report.Figure{Value: float64(a.Percentile(50)) / float64(b.Percentile(50)), Unit: report.Ratio}, Goal: goal}
}

// findRow is the row of rows named name.
func findRow(rows []Row, name string) (Row, bool) {
	i := slices.IndexFunc(rows, func(r Row) bool { return r.Name == name })
	if i < 0 {
		return Row{}, false
	}
	return rows[i], true
}

// LatencyTable is Run's latency table as a report: each row's p50, with
// its p99 and its ratios to the raw CAS's beside it, then the handoffs
// against their goals. rows are as Run returns them: the raw CAS first, its
// paused twin second.
func LatencyTable(rows []Row, opts Options) report.Table {
	t := report.Table{Title: "Latencies", Note: fmt.Sprintf("%s; lease %ds, lease guard policy %s",
		"Each row's p50, with its p99 and p50 over the raw CAS's p50, back to back and after "+handoffHold.String(), opts.LeaseDurationSeconds, onOff(opts.LeaseGuard))}
	if len(rows) < 2 {
		return t
	}
	raw, paused := rows[0], rows[1]
	for _, r := range rows {
		t.Rows = append(t.Rows, p50(r.Name, r,
			report.Figure{Label: "over raw CAS", Value: float64(r.Percentile(50)) / float64(raw.Percentile(50)), Unit: report.Ratio},
			report.Figure{Label: "over raw CAS after " + handoffHold.String(), Value: float64(r.Percentile(50)) / float64(paused.Percentile(50)), Unit: report.Ratio}))
	}
	called := func(n int) (Row, bool) {
		return findRow(rows, fmt.Sprintf("handoff, %d waiters: Release called → next holds", n))
	}
	one, haveOne := called(1)
	if haveOne {
		t.Rows = append(t.Rows, ratio("handoff, 1 waiter: p50 over the raw CAS's after "+handoffHold.String(), one, paused,
			report.AtMost(goalHandoffOverPaused, fmt.Sprintf("at most %gx", goalHandoffOverPaused))))
	}
	for _, n := range opts.Waiters {
		h, ok := called(n)
		if !ok || n == 1 || !haveOne {
			continue
		}
		var goal *report.Goal
		if n >= 50 {
			goal = report.AtMost(goalHandoffCrowd, fmt.Sprintf("at most %gx", goalHandoffCrowd))
		}
		t.Rows = append(t.Rows, ratio(fmt.Sprintf("handoff, %d waiters: p50 over 1 waiter's", n), h, one, goal))
	}
	return t
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// WritesTable is Run's requests table as a report: each scenario's Lease
// writes per unit, the other counts beside them, and the counts that have
// a goal as rows of their own.
func WritesTable(rows []WritesRow) report.Table {
	t := report.Table{Title: "Requests", Note: "Per grant or renewal, counted by the apiserver; n: the grants or renewals counted"}
	each := func(label string, v float64) report.Figure {
		return report.Figure{Label: label, Value: v, Unit: report.PerGrant}
	}
	for _, r := range rows {
		name := fmt.Sprintf("%s, per %s", r.Scenario, r.Per)
		row := report.Row{Name: name, N: r.N, Figure: each("Lease writes", r.LeaseWrites), Detail: []report.Figure{
			each("lost races", r.LeaseConflicts), each("status writes", r.StatusWrites), each("Lease reads", r.LeaseReads),
			each("lock reads", r.LockReads), each("Lease watch events", r.LeaseEvents)}}
		if r.WorstOvertaking >= 0 {
			row.Detail = append(row.Detail, report.Figure{Label: "worst overtaking", Value: float64(r.WorstOvertaking), Unit: report.Count})
		}
		extra := []report.Row{}
		switch {
		case r.Per == "renewal":
			// The two counts are read a moment apart: one renewal more or
			// less at either end of the window.
			row.Goal = report.AtMost(1+2/float64(max(r.N, 1)), "1 (give or take a renewal at either end of the window)")
			extra = append(extra, report.Row{Name: "renewal: status writes", N: r.N, Figure: each("", r.StatusWrites), Goal: report.AtMost(0, "0")})
		case r.WorstOvertaking >= 0: // grants among queued waiters
			row.Goal = report.AtMost(goalGrantLeaseWrites, fmt.Sprintf("at most %g", goalGrantLeaseWrites))
			extra = append(extra,
				report.Row{Name: r.Scenario + ": status writes per grant", N: r.N, Figure: each("", r.StatusWrites),
					Goal: report.AtMost(goalGrantStatusWrites, fmt.Sprintf("at most %g", goalGrantStatusWrites))},
				report.Row{Name: r.Scenario + ": worst overtaking", Figure: report.Figure{Value: float64(r.WorstOvertaking), Unit: report.Count},
					Goal: report.AtMost(0, "0 (arrival order)")})
		}
		t.Rows = append(t.Rows, row)
		t.Rows = append(t.Rows, extra...)
	}
	return t
}

// AdmissionTable is RunAdmission's table as a report.
func AdmissionTable(rows []AdmissionRow, opts AdmissionOptions) report.Table {
	t := report.Table{Title: "Lock-admitted pods", Note: fmt.Sprintf("From the holder pod's Succeeded to the next pod's gate removal; %d admissions per row, lease %ds; writes per admission",
		opts.Admissions, opts.LeaseDurationSeconds)}
	for _, r := range rows {
		each := func(label string, v float64) report.Figure {
			return report.Figure{Label: label, Value: v, Unit: report.PerGrant}
		}
		row := p50(fmt.Sprintf("%d gated pods waiting", r.Waiting), r.Latency)
		row.Detail = []report.Figure{{Label: "p90", Value: millis(r.Latency.Percentile(90)), Unit: report.Millis}, row.Detail[0],
			{Label: "max", Value: millis(r.Latency.Percentile(100)), Unit: report.Millis},
			each("Lease writes", r.LeaseWrites), each("pod writes", r.PodWrites), each("status writes", r.StatusWrites)}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// PeersTable is RunPeers's table as a report: per system, the uncontended
// acquire+release, the throughputs, the handoff and the failover; then
// frontdesk's against the goals.
func PeersTable(rows []PeerRow, opts PeersOptions) report.Table {
	t := report.Table{Title: "Peers", Note: fmt.Sprintf("TTL %s for every system; throughput: acquire+release per second over that many locks, one client each", opts.TTL)}
	var skipped []string
	var fd, etcd PeerRow
	for _, r := range rows {
		if strings.HasPrefix(r.Note, "skipped") {
			skipped = append(skipped, r.System+" "+r.Note)
			continue
		}
		switch r.System {
		case "frontdesk":
			fd = r
		case "etcd Mutex":
			etcd = r
		}
		t.Rows = append(t.Rows, p50(r.System+": acquire+release, uncontended", r.Uncontend))
		for _, n := range opts.Locks {
			if v, ok := r.Throughput[n]; ok {
				t.Rows = append(t.Rows, report.Row{Name: fmt.Sprintf("%s: throughput, %d locks", r.System, n), Figure: report.Figure{Value: v, Unit: report.PerSec}})
			}
		}
		if len(r.Handoff.Samples) > 0 {
			t.Rows = append(t.Rows, p50(r.System+": handoff, 10 waiters: Release returned → next holds", r.Handoff))
		}
		if len(r.Failover.Samples) > 0 {
			t.Rows = append(t.Rows, failoverRow(r.System, r.Failover))
		}
		if len(r.ProofFailover.Samples) > 0 {
			t.Rows = append(t.Rows, proofFailoverRow(r.System, r.ProofFailover))
		}
	}
	if len(skipped) > 0 {
		t.Note += "; " + strings.Join(skipped, "; ")
	}
	if len(fd.Failover.Samples) > 0 {
		t.Rows = append(t.Rows, failoverGoal(fd.Failover, opts.TTL))
	}
	if len(fd.ProofFailover.Samples) > 0 {
		t.Rows = append(t.Rows, proofFailoverGoal(fd.ProofFailover))
	}
	if len(fd.Handoff.Samples) > 0 && len(etcd.Handoff.Samples) > 0 && etcd.Handoff.Percentile(50) > 0 {
		t.Rows = append(t.Rows, ratio("frontdesk: handoff p50 over etcd Mutex's", fd.Handoff, etcd.Handoff, report.Below(1, "below 1x")))
	}
	return t
}

// FailoverTable is RunFailover's lines as a report.
func FailoverTable(r FailoverRows, opts PeersOptions) report.Table {
	t := report.Table{Title: "Failover", Note: fmt.Sprintf("Lease %s", opts.TTL),
		Rows: []report.Row{failoverRow("frontdesk", r.Lease)}}
	if len(r.Proof.Samples) > 0 {
		t.Rows = append(t.Rows, proofFailoverRow("frontdesk", r.Proof))
	}
	t.Rows = append(t.Rows, failoverGoal(r.Lease, opts.TTL))
	if len(r.Proof.Samples) > 0 {
		t.Rows = append(t.Rows, proofFailoverGoal(r.Proof))
	}
	return t
}

func failoverRow(system string, r Row) report.Row {
	return secondsRow(system+": crash failover (holder SIGKILLed → next holder's fenced write)", r)
}

// proofFailoverRow is the failover on proof (proof.go).
func proofFailoverRow(system string, r Row) report.Row {
	return secondsRow(system+": failover on proof (holder SIGKILLed, its pod reported Failed → next holder holds)", r)
}

// secondsRow is a failover row's figure: its p50, with its p99 and the
// slowest, in seconds.
func secondsRow(name string, r Row) report.Row {
	s := func(d time.Duration) float64 { return d.Seconds() }
	return report.Row{Name: name, N: len(r.Samples),
		Figure: report.Figure{Label: "p50", Value: s(r.Percentile(50)), Unit: report.Seconds},
		Detail: []report.Figure{{Label: "p99", Value: s(r.Percentile(99)), Unit: report.Seconds}, {Label: "max", Value: s(r.Percentile(100)), Unit: report.Seconds}}}
}

// proofFailoverGoal holds the slowest failover on proof to its goal.
func proofFailoverGoal(r Row) report.Row {
	return report.Row{Name: "frontdesk: failover on proof, slowest", N: len(r.Samples), Figure: report.Figure{Value: r.Percentile(100).Seconds(), Unit: report.Seconds},
		Goal: report.Below(goalProofFailover, fmt.Sprintf("under %g s after the kubelet's report", goalProofFailover))}
}

func failoverGoal(r Row, ttl time.Duration) report.Row {
	return report.Row{Name: "frontdesk: crash failover, slowest", N: len(r.Samples), Figure: report.Figure{Value: r.Percentile(100).Seconds(), Unit: report.Seconds},
		Goal: report.AtMost(ttl.Seconds()+goalFailoverSlack, fmt.Sprintf("at most TTL + %.0f ms", goalFailoverSlack*1000))}
}

// GuardPriceTable is RunGuardPrice's table as a report: each row's ratio
// (the worst Lease's: difference) with its 90 % band, against its goal.
func GuardPriceTable(rows []PriceRow, opts GuardPriceOptions) report.Table {
	t := report.Table{Title: "The guard's price", Note: fmt.Sprintf("Guarded side over open side (the worst Lease: guarded minus open), with the run's 90 %% bootstrap band; "+
		"%d samples per side in blocks of %d, hand-offs %d per side in blocks of %d, throughput %d rounds of %s; lease %ds",
		opts.Iterations, opts.Block, opts.Handoffs, opts.HandoffBlock, opts.ThroughputRounds, opts.Throughput, opts.LeaseDurationSeconds)}
	for _, r := range rows {
		var row report.Row
		switch r.Goal {
		case goalThroughput:
			v, lo, hi := r.Ratio()
			row = report.Row{Name: r.Name, N: len(r.GuardedRates), Figure: report.Figure{Value: v, Unit: report.Ratio}, Lo: &lo, Hi: &hi,
				Detail: []report.Figure{{Label: "open", Value: mean(r.OpenRates), Unit: report.PerSec}, {Label: "guarded", Value: mean(r.GuardedRates), Unit: report.PerSec}},
				Goal:   report.AtLeast(goalPriceThroughput, fmt.Sprintf("at least %.2fx", goalPriceThroughput))}
		case goalMillis:
			v, lo, hi := r.Delta()
			rv, _, _ := r.Ratio()
			row = report.Row{Name: r.Name, N: len(r.Guarded.Samples), Figure: report.Figure{Value: v, Unit: report.Delta}, Lo: &lo, Hi: &hi,
				Detail: []report.Figure{{Label: "open p50", Value: millis(r.Open.Percentile(50)), Unit: report.Millis},
					{Label: "guarded p50", Value: millis(r.Guarded.Percentile(50)), Unit: report.Millis}, {Value: rv, Unit: report.Ratio}},
				Goal: report.AtMost(goalPriceWorstMillis, fmt.Sprintf("at most +%g ms", goalPriceWorstMillis))}
		default:
			v, lo, hi := r.Ratio()
			d, _, _ := r.Delta()
			row = report.Row{Name: r.Name, N: len(r.Guarded.Samples), Figure: report.Figure{Value: v, Unit: report.Ratio}, Lo: &lo, Hi: &hi,
				Detail: []report.Figure{{Label: "open p50", Value: millis(r.Open.Percentile(50)), Unit: report.Millis},
					{Label: "guarded p50", Value: millis(r.Guarded.Percentile(50)), Unit: report.Millis}, {Value: d, Unit: report.Delta}}}
			if r.Goal == goalPercent {
				row.Goal = report.AtMost(goalPriceRatio, fmt.Sprintf("at most +%.0f %%", (goalPriceRatio-1)*100))
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}
