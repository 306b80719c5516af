// Command frontdesk-bench measures lock operations on a local control plane
// (built by `make k8s-binaries`) and prints one table: the raw Lease
// compare-and-swap, frontdesk's uncontended acquire and release, and the
// handoff latency with several waiters.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/frontdesk-dev/frontdesk/test/bench"
	"github.com/frontdesk-dev/frontdesk/test/bench/report"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "peer-holder" {
		os.Exit(bench.HolderMain(os.Args[2:]))
	}
	o := parseFlags()
	if o.reportPath != "" && o.costSizes != "" {
		fmt.Fprintln(os.Stderr, "frontdesk-bench: --report: the controller's cost (--cost) has no report")
		os.Exit(2)
	}
	res := &results{path: o.reportPath, started: time.Now(),
		rep: report.Report{Args: reportedArgs(os.Args[1:]), GoVersion: runtime.Version(), CPUs: runtime.NumCPU()}}
	if o.cpuProfile != "" {
		stopProfile := startCPUProfile(o.cpuProfile)
		defer stopProfile()
	}
	o.complete()
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	klog.SetLogger(ctrl.Log) // watches cancelled at the end are not errors worth printing
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dispatch(ctx, o, res)
}

// options are what the command line asks for: the options of each
// measurement, and the flag values complete turns into some of them.
type options struct {
	bench     bench.Options
	cost      bench.CostOptions
	peers     bench.PeersOptions
	admission bench.AdmissionOptions
	price     bench.GuardPriceOptions

	// Comma-separated lists, and the lease duration in seconds, as given.
	waiters, crowds, costSizes, admissionWaiting string
	priceWaiters, priceQueues, priceLocks        string
	duration                                     int

	withPeers, failoverOnly, admissionOnly, guardPrice bool
	cpuProfile, reportPath                             string
}

// parseFlags registers every flag of the command line and parses it; a
// flag it cannot parse exits, as flag.Parse does.
func parseFlags() *options {
	o := &options{peers: bench.PeersOptions{Locks: []int{1, 10, 100}}}
	flag.StringVar(&o.bench.AssetsDir, "assets", "", "Directory with kube-apiserver, etcd and kubectl (default: $KUBEBUILDER_ASSETS, else bin/k8s).")
	flag.IntVar(&o.bench.Iterations, "iterations", 500, "Samples of each uncontended operation.")
	flag.IntVar(&o.bench.Handoffs, "handoffs", 200, "Handoffs measured per waiter count.")
	flag.IntVar(&o.bench.HandoffRounds, "handoff-rounds", 4, "Turns each waiter count gets: the handoffs are measured in that many blocks, alternating between the waiter counts.")
	flag.BoolVar(&o.bench.LeaseGuard, "lease-guard", true, "Install config/lease-policy (as config/default does) so that every Lease write measured passes through it.")
	flag.StringVar(&o.waiters, "waiters", "1,10,50,200", "Comma-separated waiter counts for the handoff and writes measurements.")
	flag.StringVar(&o.crowds, "crowds", "20,50,200", "Comma-separated sizes of crowds arriving at once whose writes per grant are counted.")
	flag.IntVar(&o.duration, "lease-duration", 15, "Lease duration of the locks, in seconds.")
	flag.StringVar(&o.costSizes, "cost", "", "Instead of latencies, measure the controller's cost with these numbers of locks, e.g. 1000,10000.")
	flag.IntVar(&o.cost.RenewalsPerSecond, "cost-renewals", 50, "Renewals per second across all locks while measuring status lag.")
	flag.DurationVar(&o.cost.Duration, "cost-duration", 20*time.Second, "How long to renew while measuring status lag.")
	flag.IntVar(&o.cost.Pods, "cost-pods", 0, "Unrelated pods to create before measuring the controller's cost.")
	flag.IntVar(&o.cost.ForeignLeases, "cost-foreign-leases", 0, "Leases that back no lock (like node heartbeats) to create before measuring the controller's cost.")
	flag.BoolVar(&o.cost.ForeignChurn, "cost-churn", true, "While measuring the controller's cost, renew every foreign Lease every 10 s and change 1 unrelated pod in 60 each second.")
	flag.StringVar(&o.cost.ManagerBinary, "cost-manager", "", "Manager binary to measure the cost of (default: built from this checkout), e.g. an older version to compare.")
	flag.BoolVar(&o.withPeers, "peers", true, "Also measure etcd's Mutex and Redis side by side (same run, same TTL).")
	flag.DurationVar(&o.peers.TTL, "peers-ttl", 2*time.Second, "TTL of every system in the side-by-side run.")
	flag.IntVar(&o.peers.FailoverTrials, "failover-trials", 20, "SIGKILLed holders per system.")
	flag.IntVar(&o.peers.ProofTrials, "proof-trials", 20, "Holders proven dead (SIGKILLed, then their pod reported Failed as a kubelet would) for frontdesk's failover on proof, "+
		"beside its crash failover at the same TTL; 0 skips it.")
	flag.BoolVar(&o.failoverOnly, "failover-only", false, "Measure only frontdesk's failover, at --peers-ttl: after a SIGKILLed holder's lease (--failover-trials times) and on proof (--proof-trials times).")
	flag.StringVar(&o.admissionWaiting, "admission", "1,10,50", "Comma-separated numbers of gated pods waiting for the lock-admitted pod measurement (empty: skip it).")
	flag.IntVar(&o.admission.Admissions, "admissions", 20, "Admissions measured per number of gated pods waiting.")
	flag.BoolVar(&o.admissionOnly, "admission-only", false, "Measure only lock-admitted pods (--admission).")
	flag.BoolVar(&o.guardPrice, "guard-price", false, "Measure only the lease guard's price: the same operations by participants in a namespace the guard applies to and one it does not, alternating in blocks (--price-*).")
	flag.IntVar(&o.price.Iterations, "price-iterations", 200, "Guard price: samples of each latency row, per side.")
	flag.IntVar(&o.price.Block, "price-block", 20, "Guard price: samples a side takes before the other's turn.")
	flag.IntVar(&o.price.Handoffs, "price-handoffs", 60, "Guard price: handoffs measured per waiter count and side.")
	flag.IntVar(&o.price.HandoffBlock, "price-handoff-block", 10, "Guard price: handoffs a side takes before the next turn.")
	flag.StringVar(&o.priceWaiters, "price-waiters", "1,50", "Guard price: waiter counts of the handoffs.")
	flag.StringVar(&o.priceQueues, "price-queues", "1,50", "Guard price: queue lengths of the single writes (the worst Lease is always measured too).")
	flag.StringVar(&o.priceLocks, "price-locks", "1,10,100", "Guard price: numbers of locks of the throughput rows.")
	flag.DurationVar(&o.price.Throughput, "price-throughput", 2*time.Second, "Guard price: how long each side runs per throughput round.")
	flag.StringVar(&o.price.APIServerProfile, "price-apiserver-profile", "", "Guard price: write a CPU profile of kube-apiserver, taken during the single writes at the first queue length, to this file.")
	flag.IntVar(&o.price.ThroughputRounds, "price-throughput-rounds", 6, "Guard price: throughput rounds (each side once per round).")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "Write a CPU profile of this process (the lock clients; not the apiserver) to this file.")
	flag.StringVar(&o.reportPath, "report", "", "Also write the results to this file, as JSON: every table's rows with their goals (what make bench-doc reads).")
	flag.Parse()
	return o
}

// complete fills in the measurements' options the flags imply: the lease
// duration, the assets directory and the parsed lists (but those of the
// guard price, which only --guard-price parses). A list that is not of
// positive numbers exits (see positiveInts).
func (o *options) complete() {
	o.bench.LeaseDurationSeconds = int32(o.duration)
	o.admission.AssetsDir, o.admission.LeaseDurationSeconds = o.bench.AssetsDir, int32(o.duration)
	if o.admissionWaiting != "" {
		o.admission.Waiting = positiveInts("admission", o.admissionWaiting)
	}
	o.bench.Waiters = positiveInts("waiters", o.waiters)
	o.bench.Crowds = positiveInts("crowds", o.crowds)
	if o.costSizes != "" {
		o.cost.AssetsDir = o.bench.AssetsDir
		o.cost.Sizes = positiveInts("cost", o.costSizes)
	}
}

// results is the report a run fills in, and the file it goes to (none
// when path is empty).
type results struct {
	path    string
	started time.Time
	rep     report.Report
}

// add appends tables to the report.
func (r *results) add(tables ...report.Table) { r.rep.Tables = append(r.rep.Tables, tables...) }

// write writes the report, with how long the run took, to path, or fails
// saying why it cannot. Without a path it does nothing.
func (r *results) write() {
	if r.path == "" {
		return
	}
	r.rep.Seconds = time.Since(r.started).Seconds()
	if err := r.rep.Write(r.path); err != nil {
		fail(fmt.Errorf("--report: %w", err))
	}
}

// fail says why the run failed and exits; a failed run writes no report,
// and exits without stopping the CPU profile, as it always has.
func fail(err error) {
	fmt.Fprintln(os.Stderr, "frontdesk-bench:", err)
	os.Exit(1)
}

// dispatch runs the measurements o asks for, printing their tables, and
// writes the report (the controller's cost has none); a measurement that
// fails exits through fail.
func dispatch(ctx context.Context, o *options, res *results) {
	switch {
	case o.failoverOnly:
		runFailover(ctx, o, res)
	case o.guardPrice:
		runGuardPrice(ctx, o, res)
	case len(o.cost.Sizes) > 0:
		if _, err := bench.RunCost(ctx, o.cost, os.Stdout); err != nil {
			fail(err)
		}
	default:
		runLatencies(ctx, o, res)
	}
}

// runFailover measures only frontdesk's failover, after a SIGKILLed
// holder's lease and on proof (--failover-only), and writes the report.
func runFailover(ctx context.Context, o *options, res *results) {
	self, err := os.Executable()
	if err == nil {
		o.peers.AssetsDir, o.peers.HolderCommand = o.bench.AssetsDir, []string{self, "peer-holder"}
		var rows bench.FailoverRows
		rows, err = bench.RunFailover(ctx, o.peers, os.Stdout)
		res.add(bench.FailoverTable(rows, o.peers))
	}
	if err != nil {
		fail(err)
	}
	res.write()
}

// runGuardPrice measures only the lease guard's price (--guard-price),
// and writes the report.
func runGuardPrice(ctx context.Context, o *options, res *results) {
	o.price.AssetsDir, o.price.LeaseDurationSeconds = o.bench.AssetsDir, int32(o.duration)
	o.price.Waiters, o.price.Queues, o.price.Locks = positiveInts("price-waiters", o.priceWaiters), positiveInts("price-queues", o.priceQueues),
		positiveInts("price-locks", o.priceLocks)
	rows, err := bench.RunGuardPrice(ctx, o.price, os.Stdout)
	if err != nil {
		fail(err)
	}
	res.add(bench.GuardPriceTable(rows, o.price))
	res.write()
}

// runLatencies runs the default measurements: the latencies and writes
// (unless --admission-only), the lock-admitted pods (unless --admission is
// empty), and the peers side by side (with --peers, unless
// --admission-only); then it writes the report.
func runLatencies(ctx context.Context, o *options, res *results) {
	if !o.admissionOnly {
		rows, writes, err := bench.Run(ctx, o.bench, os.Stdout)
		if err != nil {
			fail(err)
		}
		res.add(bench.LatencyTable(rows, o.bench), bench.WritesTable(writes))
	}
	if len(o.admission.Waiting) > 0 {
		rows, err := bench.RunAdmission(ctx, o.admission, os.Stdout)
		if err != nil {
			fail(err)
		}
		res.add(bench.AdmissionTable(rows, o.admission))
	}
	if o.admissionOnly || !o.withPeers {
		res.write()
		return
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	o.peers.AssetsDir, o.peers.Iterations, o.peers.Handoffs = o.bench.AssetsDir, o.bench.Iterations, o.bench.Handoffs
	o.peers.Throughput = 3 * time.Second
	o.peers.HolderCommand = []string{self, "peer-holder"}
	rows, err := bench.RunPeers(ctx, o.peers, os.Stdout)
	if err != nil {
		fail(err)
	}
	res.add(bench.PeersTable(rows, o.peers))
	res.write()
}

// startCPUProfile starts a CPU profile written to path, or exits saying why
// it cannot.
func startCPUProfile(path string) (stop func()) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "frontdesk-bench: --cpuprofile:", err)
		os.Exit(2)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

// positiveInts parses a comma-separated flag value of positive numbers, or
// exits saying which part is wrong.
func positiveInts(flagName, value string) []int {
	var out []int
	for f := range strings.SplitSeq(value, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "frontdesk-bench: --%s: %q is not a positive number\n", flagName, f)
			os.Exit(2)
		}
		out = append(out, n)
	}
	return out
}

// reportedArgs are the flags a report records: what was measured, without
// the paths of this machine's files (--report, --assets, the profiles).
func reportedArgs(args []string) []string {
	out := []string{}
	for i := 0; i < len(args); i++ {
		name, _, withValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		switch name {
		case "report", "assets", "cpuprofile", "price-apiserver-profile":
			if !withValue {
				i++ // its value is the next argument
			}
			continue
		}
		out = append(out, args[i])
	}
	return out
}
