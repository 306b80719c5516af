// Package bench measures frontdesk's lock operations against a local
// kube-apiserver, side by side with the raw Lease compare-and-swap they are
// built on, and prints one table.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/localrun"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// Options size a run.
type Options struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string
	// Iterations is the number of samples of each uncontended operation.
	Iterations int
	// Handoffs is the number of handoffs measured per waiter count.
	Handoffs int
	// Waiters are the waiter counts for the handoff measurement.
	Waiters []int
	// Crowds are the sizes of the crowds whose writes per grant are
	// counted, every client of a crowd arriving at the same moment.
	Crowds []int
	// HandoffRounds is how many turns each waiter count gets in the
	// handoff measurement (see rotation): Handoffs are measured in that
	// many blocks, alternating between the waiter counts (0 counts as 1).
	HandoffRounds int
	// LeaseDurationSeconds of every lock measured.
	LeaseDurationSeconds int32
	// LeaseGuard installs config/lease-policy before measuring, as
	// config/default does on a cluster: every Lease write then passes
	// through its validating admission policy.
	LeaseGuard bool
}

// Row is one measured operation.
type Row struct {
	// Name says what was measured.
	Name string
	// Samples are the latencies, sorted.
	Samples []time.Duration
}

// Percentile returns the p-th percentile (0 < p <= 100) of the samples.
func (r Row) Percentile(p float64) time.Duration {
	if len(r.Samples) == 0 {
		return 0
	}
	i := int(float64(len(r.Samples))*p/100+0.999999) - 1
	return r.Samples[min(max(i, 0), len(r.Samples)-1)]
}

const namespace = "bench"

// validate says what is wrong with opts before anything starts.
func (opts Options) validate() error {
	if opts.Iterations < 1 || opts.Handoffs < 1 {
		return fmt.Errorf("iterations (%d) and handoffs (%d) must be at least 1", opts.Iterations, opts.Handoffs)
	}
	if len(opts.Waiters) == 0 {
		return errors.New("no waiter counts to measure handoffs with")
	}
	for i, w := range opts.Waiters {
		if w < 1 || slices.Contains(opts.Waiters[:i], w) {
			return fmt.Errorf("waiter counts %v: each must be at least 1 and appear once (each has a lock of its own)", opts.Waiters)
		}
	}
	for i, n := range opts.Crowds {
		if n < 1 || slices.Contains(opts.Crowds[:i], n) {
			return fmt.Errorf("crowd sizes %v: each must be at least 1 and appear once (each has a lock of its own)", opts.Crowds)
		}
	}
	return nil
}

// Run starts a local control plane with the manager, measures, and prints
// the tables to out: latencies, then what each operation costs the
// apiserver in writes. It returns the rows for callers that check them.
func Run(ctx context.Context, opts Options, out io.Writer) ([]Row, []WritesRow, error) {
	if err := opts.validate(); err != nil {
		return nil, nil, err
	}
	env, err := localrun.StartEnvironment(ctx, localrun.EnvironmentOptions{AssetsDir: opts.AssetsDir, MetricsBindAddress: "0"})
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = env.Stop() }()
	cs, err := setupLocks(ctx, env, opts)
	if err != nil {
		return nil, nil, err
	}
	rows, err := measureLatencies(ctx, cs, env, opts, out)
	if err != nil {
		return nil, nil, err
	}
	writes, err := measureWrites(ctx, cs, env, opts)
	if err != nil {
		return rows, nil, err
	}
	printWrites(out, writes)
	return rows, writes, nil
}

// setupLocks creates the namespace and every lock the run measures (see
// lockNames), waits until they are Ready, and installs the lease guard if
// opts ask for it. It returns the client the measurements use.
func setupLocks(ctx context.Context, env *localrun.Environment, opts Options) (kubernetes.Interface, error) {
	// Protobuf for the built-in types, as lock.New uses: the raw CAS and
	// the library are measured on the same encoding.
	cs, err := kubernetes.NewForConfig(lock.ProtobufConfig(env.ControlPlane.Config))
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating namespace: %w", err)
	}
	names := lockNames(opts)
	for _, name := range names {
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: opts.LeaseDurationSeconds}}
		if err := env.Client.Create(ctx, l); err != nil {
			return nil, fmt.Errorf("creating lock %s: %w", name, err)
		}
	}
	if err := env.WaitReady(ctx, namespace, names); err != nil {
		return nil, err
	}
	if opts.LeaseGuard {
		if err := installLeaseGuard(ctx, env, cs); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

// lockNames are the locks a run measures on, one per measurement (and per
// waiter count and crowd size), in the order they are created.
func lockNames(opts Options) []string {
	names := []string{"raw", "library", "library-raw", "writes-renew"}
	for _, w := range opts.Waiters {
		names = append(names, fmt.Sprintf("handoff-%d", w), fmt.Sprintf("writes-%d", w))
	}
	for _, n := range opts.Crowds {
		names = append(names, fmt.Sprintf("crowd-%d", n))
	}
	if opts.LeaseGuard {
		names = append(names, leaseGuardProbe)
	}
	return names
}

// measureLatencies measures the raw CAS (right after the write before, and
// after a pause as long as a handoff's hold), the uncontended library and
// the handoffs, prints their table to out and returns its rows.
func measureLatencies(ctx context.Context, cs kubernetes.Interface, env *localrun.Environment, opts Options, out io.Writer) ([]Row, error) {
	raw, err := measureRawCAS(ctx, cs, "raw", opts.Iterations, 0, 0)
	if err != nil {
		return nil, err
	}
	// A handoff comes after its holder held the lock (handoffHold), and
	// every request after a pause is slower here than one right after
	// another (docs/benchmarks.md): the same write after the same pause is
	// what a handoff compares with. Half of it is measured before the
	// handoffs and half after, so that the machine's drift during the run
	// weighs on both alike; at most 100 samples (about 11 s).
	pausedSamples := max(min(opts.Iterations, 100)/2, 1)
	pausedBefore, err := measureRawCAS(ctx, cs, "raw", pausedSamples, 0, handoffHold)
	if err != nil {
		return nil, err
	}
	rows := []Row{raw}
	if most := slices.Max(opts.Waiters); most > 1 {
		// What the Lease's size alone costs a write at the most waiters.
		rawQueued, err := measureRawCAS(ctx, cs, "raw", opts.Iterations, most, 0)
		if err != nil {
			return nil, err
		}
		rows = append(rows, rawQueued)
	}
	lib, err := measureUncontended(ctx, cs, env, "library", opts.Iterations)
	if err != nil {
		return nil, err
	}
	rows = append(rows, lib...)
	handoffs, err := measureHandoffs(ctx, cs, env, opts)
	if err != nil {
		return nil, err
	}
	rows = append(rows, handoffs...)
	pausedAfter, err := measureRawCAS(ctx, cs, "raw", pausedSamples, 0, handoffHold)
	if err != nil {
		return nil, err
	}
	paused := sorted(Row{Name: pausedBefore.Name, Samples: append(pausedBefore.Samples, pausedAfter.Samples...)})
	rows = slices.Insert(rows, 1, paused) // right under the raw CAS it is the paused twin of
	printTable(out, rows, opts, raw, paused)
	return rows, nil
}

// measureWrites counts what a renewal and a grant among each number of
// waiters cost the apiserver.
func measureWrites(ctx context.Context, cs kubernetes.Interface, env *localrun.Environment, opts Options) ([]WritesRow, error) {
	dyn, err := dynamic.NewForConfig(env.ControlPlane.Config)
	if err != nil {
		return nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	renewal, err := measureRenewalWrites(ctx, cs, func(cfg lock.Config) (*lock.Client, error) { return lock.NewForClients(cs, dyn, cfg) },
		"writes-renew", 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("counting renewal writes: %w", err)
	}
	rows := []WritesRow{renewal}
	for _, w := range opts.Waiters {
		name := fmt.Sprintf("writes-%d", w)
		row, err := measureGrantWrites(ctx, cs, func(id string) (*lock.Client, error) { return newClient(cs, env, name, id) }, name, w, min(opts.Handoffs, 100))
		if err != nil {
			return rows, fmt.Errorf("counting grant writes with %d waiters: %w", w, err)
		}
		rows = append(rows, row)
	}
	for _, n := range opts.Crowds {
		name := fmt.Sprintf("crowd-%d", n)
		row, err := measureCrowdWrites(ctx, cs, func(id string) (*lock.Client, error) { return newClient(cs, env, name, id) }, n)
		if err != nil {
			return rows, fmt.Errorf("counting the writes of a crowd of %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// measureRawCAS times client-go Lease Updates carrying the resourceVersion
// of the previous write: the floor every lock operation stands on. With
// queued > 0 the Lease first gets a queue of that many waiters (the size a
// Lease has with that many waiting), and loses it after. With pause > 0
// each write waits that long after the one before.
func measureRawCAS(ctx context.Context, cs kubernetes.Interface, name string, n, queued int, pause time.Duration) (Row, error) {
	leases := cs.CoordinationV1().Leases(namespace)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Row{}, fmt.Errorf("reading lease %s: %w", name, err)
	}
	rowName := "raw Lease CAS update"
	if queued == 0 && pause == 0 {
		rowName += " (client-go)"
	}
	if queued > 0 {
		rowName += fmt.Sprintf(", Lease carrying a queue of %d", queued)
		if l, err = writeQueue(ctx, leases, l, queued); err != nil {
			return Row{}, err
		}
		defer clearQueue(leases, name)
	}
	if pause > 0 {
		rowName += fmt.Sprintf(", %s after the one before", pause)
	}
	samples := make([]time.Duration, 0, n)
	for i := range n + n/10 {
		time.Sleep(pause)
		l.Spec.RenewTime = new(metav1.NewMicroTime(time.Now()))
		start := time.Now()
		updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && queued > 0 {
			// The controller removed the head of the made-up queue, whose
			// turn passed on a free lock: put the queue back, and go on
			// (this write is not a sample).
			if l, err = refillQueue(ctx, leases, name, queued); err != nil {
				return Row{}, err
			}
			continue
		}
		if err != nil {
			return Row{}, fmt.Errorf("raw CAS update: %w", err)
		}
		l = updated
		if i >= n/10 { // the first tenth warms up connections and caches
			samples = append(samples, time.Since(start))
		}
	}
	return sorted(Row{Name: rowName, Samples: samples}), nil
}

// refillQueue reads the Lease name afresh and gives it a queue of n.
func refillQueue(ctx context.Context, leases coordinationclient.LeaseInterface, name string, n int) (*coordinationv1.Lease, error) {
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading lease %s: %w", name, err)
	}
	return writeQueue(ctx, leases, l, n)
}

// clearQueue removes the made-up queue from the Lease name, reading it
// afresh after a lost race, so that no made-up waiter is left for the
// controller to remove later, in the middle of another measurement.
func clearQueue(leases coordinationclient.LeaseInterface, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 5 {
		if _, err := refillQueue(ctx, leases, name, 0); !apierrors.IsConflict(err) {
			return
		}
	}
}

// writeQueue replaces l's queue with n waiters shaped like the library's
// (identity and a 16-hex-digit ticket), or removes it.
func writeQueue(ctx context.Context, leases coordinationclient.LeaseInterface, l *coordinationv1.Lease, n int) (*coordinationv1.Lease, error) {
	q := make([]lease.Waiter, n)
	for i := range q {
		q[i] = lease.Waiter{Identity: fmt.Sprintf("waiter-%d", i), Ticket: fmt.Sprintf("%016x", i+1), Principal: fmt.Sprintf("user=waiter-%d", i)}
	}
	updated, err := leases.Update(ctx, lease.SetQueue(l.DeepCopy(), q), metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("writing a queue of %d to lease %s: %w", n, l.Name, err)
	}
	return updated, nil
}

// measureUncontended times one client acquiring and releasing in a loop,
// and, interleaved with them, a raw Lease CAS on another lock's Lease: the
// floor an acquire is compared with, measured in the same conditions (a
// request right after another one, on the same machine at the same time).
func measureUncontended(ctx context.Context, cs kubernetes.Interface, env *localrun.Environment, name string, n int) ([]Row, error) {
	c, err := newClient(cs, env, name, "bench-solo")
	if err != nil {
		return nil, err
	}
	leases := cs.CoordinationV1().Leases(namespace)
	raw, err := leases.Get(ctx, name+"-raw", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading lease %s-raw: %w", name, err)
	}
	acq, rel, both, cas := make([]time.Duration, 0, n), make([]time.Duration, 0, n), make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range n + n/10 {
		raw.Spec.RenewTime = new(metav1.NewMicroTime(time.Now()))
		casStart := time.Now()
		if raw, err = leases.Update(ctx, raw, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("raw CAS update: %w", err)
		}
		if i >= n/10 {
			cas = append(cas, time.Since(casStart))
		}
		start := time.Now()
		g, err := c.TryAcquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("uncontended acquire: %w", err)
		}
		acquired := time.Now()
		if err := g.Release(ctx); err != nil {
			return nil, fmt.Errorf("uncontended release: %w", err)
		}
		if i >= n/10 {
			acq = append(acq, acquired.Sub(start))
			rel = append(rel, time.Since(acquired))
			both = append(both, time.Since(start))
		}
	}
	return []Row{
		sorted(Row{Name: "raw Lease CAS update, interleaved with acquire and release", Samples: cas}),
		sorted(Row{Name: "frontdesk acquire, uncontended", Samples: acq}),
		sorted(Row{Name: "frontdesk release", Samples: rel}),
		sorted(Row{Name: "frontdesk acquire+release", Samples: both}),
	}, nil
}

// measureHandoffs measures the handoffs among each number of waiters, on
// a lock of its own (handoff-<n>): one holder and n clients of the library
// blocked in Acquire (see handoff), measured once every waiter has joined
// the queue (as a watch of the Lease sees it), the numbers of waiters in
// turns (see rotation). The handoffs before a crowd had joined, while it
// was still registering, are a row of their own; the next crowd starts
// once the one before has joined and waits for its turn.
func measureHandoffs(ctx context.Context, cs kubernetes.Interface, env *localrun.Environment, opts Options) ([]Row, error) {
	dyn, err := dynamic.NewForConfig(env.ControlPlane.Config)
	if err != nil {
		return nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	rounds := max(opts.HandoffRounds, 1)
	crowds := make([]handoffCrowd, len(opts.Waiters))
	for i, n := range opts.Waiters {
		crowds[i] = handoffCrowd{what: fmt.Sprintf("handoffs with %d waiters", n), ns: namespace,
			name: fmt.Sprintf("handoff-%d", n), n: n, sys: frontdeskSystem{cs: cs, dyn: dyn}}
	}
	results, err := handoffsInTurns(ctx, cs, crowds, opts.Handoffs, (opts.Handoffs+rounds-1)/rounds)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for i, n := range opts.Waiters {
		h := results[i]
		h.fromDone.Name = fmt.Sprintf("handoff, %d waiters: Release returned → next holds", n)
		h.fromStart.Name = fmt.Sprintf("handoff, %d waiters: Release called → next holds", n)
		rows = append(rows, h.fromDone, h.fromStart)
		if len(h.arriving.Samples) > 0 {
			h.arriving.Name = fmt.Sprintf("handoff, %d waiters still queueing: Release called → next holds", n)
			rows = append(rows, h.arriving)
		}
	}
	return rows, nil
}

// followQueue watches the Lease name until n identities have been seen in
// its queue, or ctx ends.
func followQueue(ctx context.Context, cs kubernetes.Interface, ns, name string, n int) *joinedQueue {
	joined := &joinedQueue{seen: map[string]bool{}}
	go func() {
		// A watch that ends or cannot open is opened again (a second
		// later): the identities seen so far are kept, and a new watch
		// starts with the Lease as it is.
		for {
			w, err := cs.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
			if err == nil {
				joined.follow(w, n)
			}
			if ctx.Err() != nil || joined.count() >= n {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return joined
}

// joinedQueue counts the identities ever seen in a Lease's queue.
type joinedQueue struct {
	mu   sync.Mutex
	seen map[string]bool
}

// follow reads w until n identities have been seen (then it stops w, so
// that the measurement is not also decoding every change of the Lease), or
// w ends or reports an error.
func (j *joinedQueue) follow(w watch.Interface, n int) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return
		}
		if l, ok := ev.Object.(*coordinationv1.Lease); ok {
			j.mu.Lock()
			for _, w := range lease.Queue(l) {
				j.seen[w.Identity] = true
			}
			done := len(j.seen) >= n
			j.mu.Unlock()
			if done {
				return
			}
		}
	}
}

// count is how many identities have been seen in the queue.
func (j *joinedQueue) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.seen)
}

func newClient(cs kubernetes.Interface, env *localrun.Environment, name, identity string) (*lock.Client, error) {
	dyn, err := dynamic.NewForConfig(env.ControlPlane.Config)
	if err != nil {
		return nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	return lock.NewForClients(cs, dyn, lock.Config{Namespace: namespace, Name: name, Identity: identity})
}

func sorted(r Row) Row {
	slices.Sort(r.Samples)
	return r
}

// printTable prints the latencies, each p50 against the raw CAS's, right
// after the write before it (raw) and after a pause as long as a handoff's
// hold (paused).
func printTable(out io.Writer, rows []Row, opts Options, raw, paused Row) {
	guard := "off"
	if opts.LeaseGuard {
		guard = "on"
	}
	fmt.Fprintf(out, "frontdesk bench: %d CPUs, %s, lease %ds, lease guard policy %s, local etcd + kube-apiserver + manager in one process tree\n\n",
		runtime.NumCPU(), runtime.Version(), opts.LeaseDurationSeconds, guard)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintf(w, "operation\tn\tp50\tp99\tp50 / raw CAS p50\tp50 / raw CAS p50 after %s\t\n", handoffHold) //nolint:dupword // adjacent columns are both p50s
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%.2fx\t%.2fx\t\n", r.Name, len(r.Samples), ms(r.Percentile(50)), ms(r.Percentile(99)),
			float64(r.Percentile(50))/float64(raw.Percentile(50)), float64(r.Percentile(50))/float64(paused.Percentile(50)))
	}
	_ = w.Flush()
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}
