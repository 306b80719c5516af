// Command frontdesk-local is the quick start: it builds the manager
// (bin/manager), starts a local etcd and kube-apiserver (built by
// `make k8s-binaries`), installs the CRD, runs the manager against them as a
// process of its own, applies sample locks and prints the kubectl command to
// look at them, and how to stop and restart the manager by hand. Ctrl-C (or
// SIGTERM, SIGHUP, an error) stops everything and removes the control plane's
// temporary directories.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/frontdesk-dev/frontdesk/internal/localrun"
)

func main() {
	opts := localrun.Options{ManagerOutput: os.Stderr}
	var samples string
	flag.StringVar(&opts.AssetsDir, "assets", "", "Directory with kube-apiserver, etcd and kubectl (default: $KUBEBUILDER_ASSETS, else bin/k8s).")
	flag.StringVar(&samples, "sample", "config/samples/locks_v1alpha1_distributedlock.yaml", "Comma-separated YAML files to apply.")
	flag.StringVar(&opts.Namespace, "namespace", "default", "Namespace for samples that name none.")
	flag.StringVar(&opts.KubeconfigPath, "kubeconfig-out", "bin/frontdesk-local.kubeconfig", "Where to write the admin kubeconfig.")
	flag.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:8080", "Where the manager serves metrics (plain HTTP); 0 disables.")
	flag.StringVar(&opts.ManagerBinary, "manager", "", "The manager executable to run (default: bin/manager in the repository).")
	flag.BoolVar(&opts.BuildManager, "build-manager", true, "Build the manager executable first (go build -o bin/manager .).")
	flag.BoolVar(&opts.ExitWhenReady, "exit-when-ready", false, "Print `kubectl get distributedlocks` once the samples are Ready, then stop.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts), zap.WriteTo(os.Stderr)))
	opts.SamplePaths = strings.Split(samples, ",")

	// Caught until Run returns, so a second Ctrl-C cannot cut the cleanup
	// short.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := localrun.Run(ctx, opts, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "frontdesk-local:", err)
		os.Exit(1)
	}
}
