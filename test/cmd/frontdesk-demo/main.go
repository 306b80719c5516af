// Command frontdesk-demo runs the billing scenario on a local control plane:
// ten worker processes compete for a DistributedLock to charge 50,000
// customers exactly once; the holder is frozen (SIGSTOP) past its lease;
// the run is done without and with fencing at the ledger, and the ledger's
// counts are printed side by side. Its subcommands run the parts as
// processes of their own, as the e2e tests run them in pods: `ledger`, `worker`
// (competes for the lock with the client library) and `charge` (charges with
// the token of a grant held for it, as a lock-admitted pod does). The e2e
// failover test runs two more: `elector` (an operator's replica, client-go's
// leader election through pkg/leaderelection or on client-go's own
// LeaseLock) and `store` (a fenced store that records when it accepted each
// write).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/frontdesk-dev/frontdesk/test/demo"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(demo.WorkerMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "ledger" {
		os.Exit(demo.LedgerMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "charge" {
		os.Exit(demo.ChargeMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "elector" {
		os.Exit(electorMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "store" {
		os.Exit(storeMain(os.Args[2:]))
	}
	opts := demo.DefaultOptions()
	fast := flag.Bool("fast", false, "Scaled-down run (2,000 customers, TTL 3s, job 5s) that finishes well under a minute.")
	flag.IntVar(&opts.Customers, "customers", opts.Customers, "Customers to charge once each.")
	flag.IntVar(&opts.Workers, "workers", opts.Workers, "Worker processes competing for the lock.")
	flag.DurationVar(&opts.LeaseDuration, "ttl", opts.LeaseDuration, "Lock TTL (lease duration), whole seconds.")
	flag.DurationVar(&opts.JobDuration, "job-duration", opts.JobDuration, "How long the job takes undisturbed.")
	flag.Float64Var(&opts.PauseAt, "pause-at", opts.PauseAt, "Fraction of the job after which the holder is frozen.")
	flag.StringVar(&opts.AssetsDir, "assets", "", "Directory with kube-apiserver, etcd and kubectl (default: $KUBEBUILDER_ASSETS, else bin/k8s).")
	flag.StringVar(&opts.KubeconfigPath, "kubeconfig-out", "", "Where to write the admin kubeconfig (default: a temporary file).")
	flag.Parse()
	if *fast {
		explicit := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
		scaled := opts.Fast()
		if !explicit["customers"] {
			opts.Customers = scaled.Customers
		}
		if !explicit["ttl"] {
			opts.LeaseDuration = scaled.LeaseDuration
		}
		if !explicit["job-duration"] {
			opts.JobDuration = scaled.JobDuration
		}
		opts.ProgressEvery = scaled.ProgressEvery
	}
	if opts.KubeconfigPath == "" {
		dir, err := os.MkdirTemp("", "frontdesk-demo-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "frontdesk-demo:", err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
		opts.KubeconfigPath = dir + "/kubeconfig"
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "frontdesk-demo: finding own binary for the workers:", err)
		os.Exit(1) //nolint:gocritic // exitAfterDefer: a failed run leaves its temporary kubeconfig, as it always has
	}
	opts.WorkerCommand = []string{self, "worker"}

	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	klog.SetLogger(ctrl.Log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := demo.Run(ctx, opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "frontdesk-demo:", err)
		os.Exit(1)
	}
}
