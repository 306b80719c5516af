// Command manager runs the frontdesk controller manager: it reconciles
// DistributedLocks against the Leases that back them.
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/frontdesk-dev/frontdesk/internal/manager"
)

func main() {
	opts := manager.DefaultOptions()
	flag.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", opts.MetricsBindAddress,
		"Address the metrics endpoint binds to, e.g. :8443 (HTTPS) or :8080 (HTTP with --metrics-secure=false); 0 disables it.")
	flag.BoolVar(&opts.SecureMetrics, "metrics-secure", opts.SecureMetrics,
		"Serve metrics over HTTPS, authenticated and authorized against the apiserver.")
	flag.BoolVar(&opts.EnableHTTP2, "enable-http2", opts.EnableHTTP2,
		"Allow HTTP/2 on the metrics server.")
	flag.StringVar(&opts.HealthProbeBindAddress, "health-probe-bind-address", opts.HealthProbeBindAddress,
		"Address the /healthz and /readyz endpoints bind to; 0 disables them.")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", opts.LeaderElection,
		"Elect a leader on a Lease so that only one replica reconciles at a time.")
	flag.StringVar(&opts.LeaderElectionID, "leader-election-id", opts.LeaderElectionID,
		"Name of the Lease used for leader election.")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", opts.LeaderElectionNamespace,
		"Namespace of the leader election Lease (default: the manager's own namespace).")
	flag.DurationVar(&opts.LeaseDuration, "leader-election-lease-duration", opts.LeaseDuration,
		"How long a standby waits after the leader's last renewal before taking over.")
	flag.DurationVar(&opts.RenewDeadline, "leader-election-renew-deadline", opts.RenewDeadline,
		"How long the leader keeps trying to renew before it gives leadership up.")
	flag.DurationVar(&opts.RetryPeriod, "leader-election-retry-period", opts.RetryPeriod,
		"How often leader election clients retry.")
	flag.IntVar(&opts.MaxConcurrentReconciles, "max-concurrent-reconciles", opts.MaxConcurrentReconciles,
		"How many DistributedLocks are reconciled in parallel.")
	flag.DurationVar(&opts.GracefulShutdownTimeout, "graceful-shutdown-timeout", opts.GracefulShutdownTimeout,
		"How long to wait for the controller to stop on shutdown.")
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	ctx := ctrl.SetupSignalHandler()
	mgr, err := manager.New(ctx, ctrl.GetConfigOrDie(), opts)
	if err != nil {
		log.Error(err, "unable to build the manager")
		os.Exit(1)
	}
	log.Info("starting manager", "leaderElection", opts.LeaderElection, "metrics", opts.MetricsBindAddress)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped with an error")
		os.Exit(1)
	}
}
