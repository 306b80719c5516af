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
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/frontdesk-dev/frontdesk/test/bench"
)

var (
	withPeers, failoverOnly bool
	cpuProfile              string
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "peer-holder" {
		os.Exit(bench.HolderMain(os.Args[2:]))
	}
	opts := bench.Options{}
	var waiters, crowds string
	flag.StringVar(&opts.AssetsDir, "assets", "", "Directory with kube-apiserver, etcd and kubectl (default: $KUBEBUILDER_ASSETS, else bin/k8s).")
	flag.IntVar(&opts.Iterations, "iterations", 500, "Samples of each uncontended operation.")
	flag.IntVar(&opts.Handoffs, "handoffs", 200, "Handoffs measured per waiter count.")
	flag.IntVar(&opts.HandoffRounds, "handoff-rounds", 4, "Turns each waiter count gets: the handoffs are measured in that many blocks, alternating between the waiter counts.")
	flag.BoolVar(&opts.LeaseGuard, "lease-guard", true, "Install config/lease-policy (as config/default does) so that every Lease write measured passes through it.")
	flag.StringVar(&waiters, "waiters", "1,10,50,200", "Comma-separated waiter counts for the handoff and writes measurements.")
	flag.StringVar(&crowds, "crowds", "20,50,200", "Comma-separated sizes of crowds arriving at once whose writes per grant are counted.")
	var duration int
	flag.IntVar(&duration, "lease-duration", 15, "Lease duration of the locks, in seconds.")
	var costSizes string
	cost := bench.CostOptions{}
	flag.StringVar(&costSizes, "cost", "", "Instead of latencies, measure the controller's cost with these numbers of locks, e.g. 1000,10000.")
	flag.IntVar(&cost.RenewalsPerSecond, "cost-renewals", 50, "Renewals per second across all locks while measuring status lag.")
	flag.DurationVar(&cost.Duration, "cost-duration", 20*time.Second, "How long to renew while measuring status lag.")
	flag.IntVar(&cost.Pods, "cost-pods", 0, "Unrelated pods to create before measuring the controller's cost.")
	flag.IntVar(&cost.ForeignLeases, "cost-foreign-leases", 0, "Leases that back no lock (like node heartbeats) to create before measuring the controller's cost.")
	flag.BoolVar(&cost.ForeignChurn, "cost-churn", true, "While measuring the controller's cost, renew every foreign Lease every 10 s and change 1 unrelated pod in 60 each second.")
	flag.StringVar(&cost.ManagerBinary, "cost-manager", "", "Manager binary to measure the cost of (default: built from this checkout), e.g. an older version to compare.")
	peers := bench.PeersOptions{Locks: []int{1, 10, 100}}
	flag.BoolVar(&withPeers, "peers", true, "Also measure etcd's Mutex and Redis side by side (same run, same TTL).")
	flag.DurationVar(&peers.TTL, "peers-ttl", 2*time.Second, "TTL of every system in the side-by-side run.")
	flag.IntVar(&peers.FailoverTrials, "failover-trials", 20, "SIGKILLed holders per system.")
	flag.BoolVar(&failoverOnly, "failover-only", false, "Measure only frontdesk's failover after a SIGKILLed holder, at --peers-ttl, --failover-trials times.")
	admission := bench.AdmissionOptions{}
	var admissionWaiting string
	var admissionOnly bool
	flag.StringVar(&admissionWaiting, "admission", "1,10,50", "Comma-separated numbers of gated pods waiting for the lock-admitted pod measurement (empty: skip it).")
	flag.IntVar(&admission.Admissions, "admissions", 20, "Admissions measured per number of gated pods waiting.")
	flag.BoolVar(&admissionOnly, "admission-only", false, "Measure only lock-admitted pods (--admission).")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "Write a CPU profile of this process (the lock clients; not the apiserver) to this file.")
	flag.Parse()
	if cpuProfile != "" {
		stopProfile := startCPUProfile(cpuProfile)
		defer stopProfile()
	}
	opts.LeaseDurationSeconds = int32(duration)
	admission.AssetsDir, admission.LeaseDurationSeconds = opts.AssetsDir, int32(duration)
	if admissionWaiting != "" {
		admission.Waiting = positiveInts("admission", admissionWaiting)
	}
	opts.Waiters = positiveInts("waiters", waiters)
	opts.Crowds = positiveInts("crowds", crowds)
	if costSizes != "" {
		cost.AssetsDir = opts.AssetsDir
		cost.Sizes = positiveInts("cost", costSizes)
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	klog.SetLogger(ctrl.Log) // watches cancelled at the end are not errors worth printing
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if failoverOnly {
		self, err := os.Executable()
		if err == nil {
			peers.AssetsDir, peers.HolderCommand = opts.AssetsDir, []string{self, "peer-holder"}
			_, err = bench.RunFailover(ctx, peers, os.Stdout)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "frontdesk-bench:", err)
			os.Exit(1) //nolint:gocritic // exitAfterDefer: a failed run exits without stopping the CPU profile, as it always has
		}
		return
	}
	if len(cost.Sizes) > 0 {
		if _, err := bench.RunCost(ctx, cost, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "frontdesk-bench:", err)
			os.Exit(1)
		}
		return
	}
	if !admissionOnly {
		if _, _, err := bench.Run(ctx, opts, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "frontdesk-bench:", err)
			os.Exit(1)
		}
	}
	if len(admission.Waiting) > 0 {
		if _, err := bench.RunAdmission(ctx, admission, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "frontdesk-bench:", err)
			os.Exit(1)
		}
	}
	if admissionOnly {
		return
	}
	if !withPeers {
		return
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "frontdesk-bench:", err)
		os.Exit(1)
	}
	peers.AssetsDir, peers.Iterations, peers.Handoffs = opts.AssetsDir, opts.Iterations, opts.Handoffs
	peers.Throughput = 3 * time.Second
	peers.HolderCommand = []string{self, "peer-holder"}
	if _, err := bench.RunPeers(ctx, peers, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "frontdesk-bench:", err)
		os.Exit(1)
	}
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
