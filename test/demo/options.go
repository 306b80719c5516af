// Package demo runs the billing scenario end to end: a nightly job that must
// charge each customer exactly once, ten worker processes competing for a
// DistributedLock, a holder frozen with SIGSTOP past its lease, and a ledger
// that counts what happened, first without fencing and then with it.
package demo

import (
	"fmt"
	"time"
)

// Options are the scenario's parameters. Defaults are the incident's
// numbers; Fast scales time down for tests.
type Options struct {
	// Customers to charge, once each.
	Customers int
	// Workers is the number of worker processes (replicas).
	Workers int
	// LeaseDuration is the lock's TTL.
	LeaseDuration time.Duration
	// JobDuration is how long the job takes when nobody interferes.
	JobDuration time.Duration
	// PauseAt is the fraction of the job after which the holder is frozen.
	PauseAt float64
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string
	// KubeconfigPath is where the admin kubeconfig is written.
	KubeconfigPath string
	// ProgressEvery is the interval of the progress line.
	ProgressEvery time.Duration
	// Rounds selects which runs to do: without fencing, with fencing.
	Rounds []bool
	// WorkerCommand is the command that runs a worker process (the demo's
	// own binary in worker mode); the worker flags are appended.
	WorkerCommand []string
	// WorkerEnv is added to the worker processes' environment.
	WorkerEnv []string
}

// DefaultOptions are the incident: 50,000 customers, 10 replicas, TTL 120 s,
// a 90 s job, the holder frozen at 70 % until the lease has passed on.
func DefaultOptions() Options {
	return Options{
		Customers:     50000,
		Workers:       10,
		LeaseDuration: 120 * time.Second,
		JobDuration:   90 * time.Second,
		PauseAt:       0.7,
		ProgressEvery: 2 * time.Second,
		Rounds:        []bool{false, true},
	}
}

// Fast scales the scenario down to finish well under a minute.
func (o Options) Fast() Options {
	o.Customers = 2000
	o.LeaseDuration = 3 * time.Second
	o.JobDuration = 5 * time.Second
	o.ProgressEvery = time.Second
	return o
}

// Validate says what to fix in o.
func (o Options) Validate() error {
	switch {
	case o.Customers < 10:
		return fmt.Errorf("--customers %d: need at least 10", o.Customers)
	case o.Workers < 2:
		return fmt.Errorf("--workers %d: need at least 2 for a takeover", o.Workers)
	case o.LeaseDuration < time.Second || o.LeaseDuration%time.Second != 0:
		return fmt.Errorf("--ttl %s: use whole seconds, at least 1s", o.LeaseDuration)
	case o.JobDuration <= 0:
		return fmt.Errorf("--job-duration %s: must be positive", o.JobDuration)
	case o.PauseAt <= 0 || o.PauseAt >= 1:
		return fmt.Errorf("--pause-at %v: use a fraction between 0 and 1", o.PauseAt)
	case len(o.WorkerCommand) == 0:
		return fmt.Errorf("no worker command")
	}
	return nil
}

// perCharge is the pause between two charges that makes the job take
// JobDuration.
func (o Options) perCharge() time.Duration {
	return o.JobDuration / time.Duration(o.Customers)
}
