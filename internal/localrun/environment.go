package localrun

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
)

// EnvironmentOptions configure StartEnvironment.
type EnvironmentOptions struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl (see controlplane).
	AssetsDir string
	// KubeconfigPath, when set, is where the admin kubeconfig is written.
	KubeconfigPath string
	// MetricsBindAddress serves the manager's metrics (plain HTTP); "0"
	// disables them.
	MetricsBindAddress string
}

// Environment is a local control plane with the frontdesk manager running
// against it.
type Environment struct {
	// ControlPlane is the running etcd and kube-apiserver.
	ControlPlane *controlplane.ControlPlane
	// Client talks to the apiserver directly (no cache).
	Client client.Client

	stopManager context.CancelFunc
	managerDone chan error
}

// StartEnvironment starts etcd, kube-apiserver (with the CRD) and the
// manager. Stop it with Stop.
func StartEnvironment(ctx context.Context, opts EnvironmentOptions) (*Environment, error) {
	cp, err := controlplane.Start(controlplane.Options{AssetsDir: opts.AssetsDir, KubeconfigPath: opts.KubeconfigPath})
	if err != nil {
		return nil, err
	}
	mgrOpts := manager.DefaultOptions()
	mgrOpts.MetricsBindAddress = opts.MetricsBindAddress
	mgrOpts.SecureMetrics = false
	mgrOpts.HealthProbeBindAddress = "0"
	mgrOpts.AllowSeveralInProcess = true // tools may start one environment after another
	mgrCtx, stopManager := context.WithCancel(ctx)
	mgr, err := manager.New(mgrCtx, cp.Config, mgrOpts)
	if err == nil {
		var c client.Client
		if c, err = client.New(cp.Config, client.Options{Scheme: manager.NewScheme()}); err == nil {
			env := &Environment{ControlPlane: cp, Client: c, stopManager: stopManager, managerDone: make(chan error, 1)}
			go func() { env.managerDone <- mgr.Start(mgrCtx) }()
			return env, nil
		}
	}
	stopManager()
	_ = cp.Stop()
	return nil, fmt.Errorf("starting the frontdesk manager: %w", err)
}

// Stop stops the manager, then the control plane.
func (e *Environment) Stop() error {
	e.stopManager()
	<-e.managerDone //nolint:errcheck // stopped by us: how the manager ended is not Stop's result
	return e.ControlPlane.Stop()
}

// WaitReady waits until every named lock in namespace reports Ready.
func (e *Environment) WaitReady(ctx context.Context, namespace string, names []string) error {
	return waitReady(ctx, e.Client, namespace, names)
}

// waitReady waits, up to a minute, until every named lock in namespace
// reports Ready.
func waitReady(ctx context.Context, c client.Client, namespace string, names []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, name := range names {
		for {
			lock := &locksv1alpha1.DistributedLock{}
			err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, lock)
			if err == nil && meta.IsStatusConditionTrue(lock.Status.Conditions, locksv1alpha1.ConditionReady) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for lock %s/%s to become Ready: %w", namespace, name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}
