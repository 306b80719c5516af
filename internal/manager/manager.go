// Package manager builds the frontdesk controller manager. main.go, the
// local control-plane command and the integration tests all use it, so the
// tests exercise the same wiring that ships.
package manager

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Options configure the manager. The zero value is not useful; start from
// DefaultOptions.
type Options struct {
	// MetricsBindAddress is where metrics are served; "0" disables them.
	MetricsBindAddress string
	// SecureMetrics serves metrics over HTTPS behind authentication and
	// authorization (TokenReview and SubjectAccessReview).
	SecureMetrics bool
	// EnableHTTP2 allows HTTP/2 on the metrics server. Off by default
	// (HTTP/2 Rapid Reset, CVE-2023-44487).
	EnableHTTP2 bool
	// HealthProbeBindAddress is where /healthz and /readyz are served; "0"
	// disables them.
	HealthProbeBindAddress string
	// LeaderElection makes only one replica reconcile at a time.
	LeaderElection bool
	// LeaderElectionID names the Lease used for leader election.
	LeaderElectionID string
	// LeaderElectionNamespace is where that Lease lives (defaults to the
	// namespace the manager runs in).
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election:
	// a standby takes over at most LeaseDuration after the leader stopped
	// renewing.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// MaxConcurrentReconciles bounds parallel reconciles.
	MaxConcurrentReconciles int
	// Clock is the controller's clock; nil means the real one.
	Clock clock.PassiveClock
	// GracefulShutdownTimeout bounds how long runnables get to stop.
	GracefulShutdownTimeout time.Duration
	// AllowSeveralInProcess lets more than one manager run in one process
	// (benchmarks and tools that start several local environments).
	AllowSeveralInProcess bool
}

// DefaultOptions are the defaults main.go's flags start from.
func DefaultOptions() Options {
	return Options{
		MetricsBindAddress:      ":8443",
		SecureMetrics:           true,
		HealthProbeBindAddress:  ":8081",
		LeaderElectionID:        "frontdesk-controller-leader",
		MaxConcurrentReconciles: 4,
		GracefulShutdownTimeout: 30 * time.Second,
		LeaseDuration:           15 * time.Second,
		RenewDeadline:           10 * time.Second,
		RetryPeriod:             2 * time.Second,
	}
}

// NewScheme returns a scheme with the built-in types and the frontdesk API.
func NewScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(locksv1alpha1.AddToScheme(scheme))
	return scheme
}

// New builds a manager with the DistributedLock controller, health and
// readiness checks registered.
func New(ctx context.Context, cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	scheme := NewScheme()
	metricsOpts := metricsserver.Options{
		BindAddress:   opts.MetricsBindAddress,
		SecureServing: opts.SecureMetrics,
	}
	if !opts.EnableHTTP2 {
		metricsOpts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	if opts.SecureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	shutdown, leaseDuration, renewDeadline, retryPeriod := opts.GracefulShutdownTimeout, opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         cacheOptions(),
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        opts.HealthProbeBindAddress,
		LeaderElection:                opts.LeaderElection,
		LeaderElectionID:              opts.LeaderElectionID,
		LeaderElectionNamespace:       opts.LeaderElectionNamespace,
		LeaderElectionResourceLock:    "leases",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &leaseDuration,
		RenewDeadline:                 &renewDeadline,
		RetryPeriod:                   &retryPeriod,
		GracefulShutdownTimeout:       &shutdown,
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	principal, err := managerPrincipal(ctx, cfg)
	if err != nil {
		return nil, err
	}
	warnIfUnguarded(ctx, cfg)
	holderPods, err := cache.New(cfg, holderPodCacheOptions(scheme, mgr.GetRESTMapper(), mgr.GetHTTPClient()))
	if err != nil {
		return nil, fmt.Errorf("creating the holder-pod cache: %w", err)
	}
	if err := mgr.Add(everyReplica{holderPods}); err != nil {
		return nil, fmt.Errorf("adding the holder-pod cache: %w", err)
	}
	reconciler := &controllers.DistributedLockReconciler{
		HolderPods:              holderPods,
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorder("frontdesk-controller"),
		Clock:                   opts.Clock,
		Principal:               principal,
		MaxConcurrentReconciles: opts.MaxConcurrentReconciles,
		SkipNameValidation:      opts.AllowSeveralInProcess,
	}
	if err := reconciler.SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("setting up distributedlock controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", readyWhenCacheSynced(mgr.GetCache(), holderPods)); err != nil {
		return nil, fmt.Errorf("adding readiness check: %w", err)
	}
	return mgr, nil
}

// managerPrincipal is the principal the controller's own grants and places
// carry: "user=<the manager's username>", asked of the apiserver (a
// SelfSubjectReview), with no pod, so every replica writes the same.
func managerPrincipal(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("building a client to learn the manager's principal: %w", err)
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking the apiserver who the manager is (SelfSubjectReview): %w", err)
	}
	principal := lease.Principal(review.Status.UserInfo.Username, nil)
	if !lease.ValidPrincipal(principal) {
		return "", fmt.Errorf("the manager's username %q cannot be a principal (grammar %s)", review.Status.UserInfo.Username, lease.PrincipalPattern)
	}
	return principal, nil
}

// warnIfUnguarded logs, at start, when the cluster has no lease-guard policy
// (config/lease-policy): every lock then says so in its Guarded condition.
func warnIfUnguarded(ctx context.Context, cfg *rest.Config) {
	log := ctrl.Log.WithName("setup")
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return
	}
	policies, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{
		LabelSelector: locksv1alpha1.PolicyLabel + "=" + locksv1alpha1.PolicyLabelLeaseGuard})
	switch {
	case err != nil:
		log.Error(err, "cannot tell whether the lease guard is installed")
	case len(policies.Items) == 0:
		log.Info("WARNING: the lease-guard ValidatingAdmissionPolicy (config/lease-policy) is not installed: nothing keeps " +
			"participants from ending each other's grants; every lock says so in its Guarded condition")
	}
}

// readyWhenCacheSynced reports ready once the informer caches the controller
// reads from (locks, Leases, participant pods; every pod, for proofs of a
// holder's death) have synced.
func readyWhenCacheSynced(caches ...cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		for _, c := range caches {
			if !c.WaitForCacheSync(ctx) {
				return fmt.Errorf("informer caches not synced")
			}
		}
		return nil
	}
}

// everyReplica runs a cache on every replica, not only the leader, as the
// manager's own cache runs: a standby keeps it synced (readiness waits for
// it) and takes over with it warm. A cache of several ByObject settings
// does not say so itself.
type everyReplica struct{ cache.Cache }

// NeedLeaderElection reports that the cache needs no leader election.
func (everyReplica) NeedLeaderElection() bool { return false }
