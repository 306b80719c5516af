package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
)

// CostOptions size the controller-cost measurement.
type CostOptions struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string
	// Sizes are the numbers of locks to measure with.
	Sizes []int
	// RenewalsPerSecond is the rate of renewals across all locks while the
	// status lag is measured.
	RenewalsPerSecond int
	// Duration of the renewal phase.
	Duration time.Duration
	// Pods is how many unrelated pods (no lock names them, not labelled as
	// participants) to create before measuring.
	Pods int
	// ForeignLeases is how many Leases that back no lock (as node
	// heartbeats and other components' leader elections do) to create
	// before measuring.
	ForeignLeases int
	// ForeignChurn: while measuring, every foreign Lease is renewed every
	// 10 s, as a node's heartbeat is, and one unrelated pod in 60 changes
	// each second (a status or label change).
	ForeignChurn bool
	// ManagerBinary, when set, is the manager to measure instead of one
	// built from this checkout (to compare with an older version).
	ManagerBinary string
}

// CostRow is the controller's cost with one number of locks.
type CostRow struct {
	Locks        int
	Setup        time.Duration
	CatchUp      time.Duration // after setup, until status showed every grant
	RSSBytes     int64
	PeakRSSBytes int64
	// Lag is, for each takeover grant, from the Lease Update's answer to
	// the status event that shows its token.
	Lag Row
	// Renewals and Grants are the Lease writes made while measuring;
	// StatusWrites the lock status changes seen meanwhile.
	Renewals, Grants, StatusWrites int
	// LeaseEvents and PodEvents are the watch events the apiserver sent for
	// Leases and pods while measuring (apiserver_watch_events_total): the
	// manager is the only client watching them, but kube-apiserver itself
	// watches every pod (to check bound service-account tokens), so each
	// pod change is one event to begin with.
	LeaseEvents, PodEvents float64
	// ForeignLeaseWrites and PodWrites are the foreign Lease and unrelated
	// pod changes made while measuring.
	ForeignLeaseWrites, PodWrites int
}

// RunCost starts a control plane and the manager binary as a process of
// its own (so its memory is its own), creates and grants locks, renews them
// and takes them over at a steady rate, and measures the manager's RSS and
// how long status takes to show each grant.
func RunCost(ctx context.Context, opts CostOptions, out io.Writer) ([]CostRow, error) {
	dir, err := os.MkdirTemp("", "frontdesk-cost-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cp, err := controlplane.Start(controlplane.Options{AssetsDir: opts.AssetsDir, KubeconfigPath: kubeconfig})
	if err != nil {
		return nil, err
	}
	defer func() { _ = cp.Stop() }()
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	bin := opts.ManagerBinary
	if bin == "" {
		bin = filepath.Join(dir, "manager")
		build := exec.Command("go", "build", "-o", bin, ".")
		build.Dir = root // with the root module's dependencies, as `make build`
		if b, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building the manager: %w: %s", err, b)
		}
	}
	mgr := exec.Command(bin, "--kubeconfig", kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--max-concurrent-reconciles", "8", "--zap-log-level", "error")
	if err := mgr.Start(); err != nil {
		return nil, fmt.Errorf("starting the manager: %w", err)
	}
	defer func() { _ = mgr.Process.Kill(); _ = mgr.Wait() }()

	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: manager.NewScheme()})
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	if err := createPods(ctx, c, opts.Pods); err != nil {
		return nil, err
	}
	if err := createForeignLeases(ctx, cs, opts.ForeignLeases); err != nil {
		return nil, err
	}
	var rows []CostRow
	for _, n := range opts.Sizes {
		row, err := measureCost(ctx, c, cs, mgr.Process.Pid, n, opts)
		if err != nil {
			return rows, err
		}
		rows = append(rows, row)
	}
	printCost(out, rows, opts)
	return rows, nil
}

func measureCost(ctx context.Context, c client.WithWatch, cs kubernetes.Interface, pid, n int, opts CostOptions) (CostRow, error) {
	ns := fmt.Sprintf("cost-%d", n)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return CostRow{}, err
	}
	start := time.Now()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("lock-%05d", i)
	}
	if err := parallel(32, names, func(name string) error {
		return c.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 600}})
	}); err != nil {
		return CostRow{}, fmt.Errorf("creating locks: %w", err)
	}
	// Grant every lock once the controller has created its Lease.
	if err := parallel(32, names, func(name string) error { return grantWhenReady(ctx, cs, ns, name) }); err != nil {
		return CostRow{}, fmt.Errorf("granting locks: %w", err)
	}
	setup := time.Since(start)
	// Measure in steady state: wait until the controller has shown every
	// grant in status (the backlog of setup drained).
	catchUp := time.Now()
	if err := waitAllHeld(ctx, c, ns, n); err != nil {
		return CostRow{}, err
	}
	drained := time.Since(catchUp)

	eventsBefore, err := readWatchEvents(ctx, cs)
	if err != nil {
		return CostRow{}, err
	}
	churnCtx, stopChurn := context.WithCancel(ctx)
	churned := make(chan foreignWrites, 1)
	go func() { churned <- churnForeign(churnCtx, cs, opts) }()
	lag, err := renewAndMeasureLag(ctx, c, cs, ns, names, opts)
	stopChurn()
	foreign := <-churned
	if err != nil {
		return CostRow{}, err
	}
	eventsAfter, err := readWatchEvents(ctx, cs)
	if err != nil {
		return CostRow{}, err
	}
	rss, peak, err := processRSS(pid)
	if err != nil {
		return CostRow{}, err
	}
	return CostRow{Locks: n, Setup: setup, CatchUp: drained, RSSBytes: rss, PeakRSSBytes: peak, Lag: lag.row,
		Renewals: lag.renewals, Grants: lag.grants, StatusWrites: lag.statusWrites,
		LeaseEvents: eventsAfter[leasesResource] - eventsBefore[leasesResource], PodEvents: eventsAfter[podsResource] - eventsBefore[podsResource],
		ForeignLeaseWrites: foreign.leases, PodWrites: foreign.pods}, nil
}

// createPods creates n pods like a typical workload's (two containers with
// environment, resources, probes and mounts) in a namespace of their own.
// No kubelet runs: they stay Pending, as far as the controller cares.
func createPods(ctx context.Context, c client.Client, n int) error {
	if n <= 0 {
		return nil
	}
	const ns = podsNamespace
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = workloadPodName(i)
	}
	if err := parallel(32, names, func(name string) error { return c.Create(ctx, workloadPod(ns, name)) }); err != nil {
		return fmt.Errorf("creating pods: %w", err)
	}
	return nil
}

// podsNamespace holds the unrelated pods of the cost measurement.
const podsNamespace = "cost-pods"

func workloadPodName(i int) string { return fmt.Sprintf("web-%05d", i) }

// workloadPod is a pod of about 3 KiB, as a Deployment's often are.
func workloadPod(ns, name string) *corev1.Pod {
	container := func(name, image string) corev1.Container {
		c := corev1.Container{Name: name, Image: image,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}},
			VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}},
		}
		for i := range 10 {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("APP_SETTING_%02d", i), Value: strings.Repeat("v", 40)})
		}
		return c
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{"app": "web", "tier": "frontend", "pod-template-hash": "5d8f7c9b6"},
			Annotations: map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "8080"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{container("app", "registry.example.com/shop/web:1.42.0"), container("proxy", "registry.example.com/mesh/proxy:1.9.3")},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
				ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-config"}}}}},
		},
	}
}

// waitAllHeld waits until every lock in ns shows its holder in status.
func waitAllHeld(ctx context.Context, c client.Client, ns string, n int) error {
	deadline := time.Now().Add(15 * time.Minute)
	for {
		var list locksv1alpha1.DistributedLockList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		held := 0
		for i := range list.Items {
			if list.Items[i].Status.Holder != "" {
				held++
			}
		}
		if held == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d locks show their holder after 15 minutes", held, n)
		}
		time.Sleep(2 * time.Second) // polling interval
	}
}

// grantWhenReady waits for the lock's Lease and takes it with a CAS.
func grantWhenReady(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		l, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			now := metav1.NewMicroTime(time.Now())
			l.Spec.HolderIdentity = new("cost-holder")
			l.Spec.LeaseTransitions = new(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
			l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
			if _, err = cs.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lease %s/%s: %w", ns, name, err)
		}
		time.Sleep(200 * time.Millisecond) // the controller creates the Lease soon
	}
}

// renewAndMeasureLag renews random locks at the configured rate and, ten
// times less often, grants a random lock to a new holder (a takeover: the
// next token), and times, for each grant, from the Update's response to the
// watch event of the lock whose status shows that token. Renewals change
// nothing in status (they are written to the Lease only), so they show as
// load, not as status writes: every status change seen is counted against
// the renewals and grants sent.
func renewAndMeasureLag(ctx context.Context, c client.WithWatch, cs kubernetes.Interface, ns string, names []string, opts CostOptions) (lagResult, error) {
	var list locksv1alpha1.DistributedLockList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return lagResult{}, err
	}
	w, err := c.Watch(ctx, &locksv1alpha1.DistributedLockList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return lagResult{}, err
	}
	defer w.Stop()
	t := &lagTracker{sent: map[string]time.Time{}, seen: map[string]time.Time{}}
	go t.follow(w.ResultChan())
	renewAtRate(ctx, cs, ns, names, opts, t)
	t.waitDrained(time.Minute)
	return t.result(ctx, c, ns)
}

// lagTracker matches the grants the bench sent with the status writes a
// watch of the locks shows, and counts both. Its methods are safe for
// concurrent use.
type lagTracker struct {
	mu   sync.Mutex
	sent map[string]time.Time // "name/token" -> when the grant returned
	seen map[string]time.Time // "name/token" -> status showed it before the grant returned
	lags []time.Duration
	// statusWrites counts the modifications of locks seen; renewals and
	// grants the Lease writes answered.
	statusWrites, renewals, grants int
}

// follow counts every modification of a lock in events as a status write
// and, for a lock with a holder, matches its token with a grant sent (a
// lag), or notes it was seen before the grant's answer. It returns once
// events is closed.
func (t *lagTracker) follow(events <-chan watch.Event) {
	for ev := range events {
		lk, ok := ev.Object.(*locksv1alpha1.DistributedLock)
		if !ok || ev.Type != watch.Modified {
			continue
		}
		key := lk.Name + "/" + strconv.FormatInt(lk.Status.FencingToken, 10)
		t.mu.Lock()
		t.statusWrites++
		if lk.Status.Holder != "" {
			if at, ok := t.sent[key]; ok {
				t.lags = append(t.lags, time.Since(at))
				delete(t.sent, key)
			} else {
				t.seen[key] = time.Now() // before the grant's answer reached the bench
			}
		}
		t.mu.Unlock()
	}
}

// answered records the answer to a Lease write of lock name: a renewal, or,
// with grant, a grant, whose token updated carries. A grant status showed
// already counts as no lag; any other waits for status to show it.
func (t *lagTracker) answered(name string, grant bool, updated *coordinationv1.Lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !grant {
		t.renewals++
		return
	}
	t.grants++
	key := name + "/" + strconv.Itoa(int(ptr.Deref(updated.Spec.LeaseTransitions, 0)))
	answered := time.Now()
	if at, ok := t.seen[key]; ok {
		// Status showed the grant before its answer came back: no lag.
		t.lags = append(t.lags, max(at.Sub(answered), 0))
		delete(t.seen, key)
		return
	}
	t.sent[key] = answered
}

// waitDrained waits until status showed every grant sent, or for at most
// limit.
func (t *lagTracker) waitDrained(limit time.Duration) {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		t.mu.Lock()
		pending := len(t.sent)
		t.mu.Unlock()
		if pending == 0 {
			break
		}
	}
}

// result is what was measured, or an error when no grant showed in status
// at all. Grants that never showed are reported, not hidden: it reads each
// such lock in ns to tell one overtaken by a later grant of the same lock
// before the controller got to it (the status went straight to the later
// token) from one not in status at all.
func (t *lagTracker) result(ctx context.Context, c client.Client, ns string) (lagResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lags) == 0 {
		return lagResult{}, fmt.Errorf("none of %d grants showed in status", len(t.sent))
	}
	overtaken := 0
	for key := range t.sent {
		name, token, _ := strings.Cut(key, "/")
		var lk locksv1alpha1.DistributedLock
		want, _ := strconv.ParseInt(token, 10, 64)
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &lk); err == nil && lk.Status.FencingToken > want {
			overtaken++
		}
	}
	row := sorted(Row{Name: fmt.Sprintf("%d renewals, %d grants: %d status writes; %d grants not shown: %d overtaken by a later grant, %d missing",
		t.renewals, t.grants, t.statusWrites, len(t.sent), overtaken, len(t.sent)-overtaken), Samples: append([]time.Duration(nil), t.lags...)})
	return lagResult{row: row, renewals: t.renewals, grants: t.grants, statusWrites: t.statusWrites}, nil
}

// renewAtRate writes, for opts.Duration at opts.RenewalsPerSecond, to the
// Lease of a random lock among names: every tenth write a grant, the others
// renewals (see renewOrGrant). It records each answer in t, ignores failed
// writes, and returns once every write is done.
func renewAtRate(ctx context.Context, cs kubernetes.Interface, ns string, names []string, opts CostOptions, t *lagTracker) {
	tick := time.NewTicker(time.Second / time.Duration(max(opts.RenewalsPerSecond, 1)))
	defer tick.Stop()
	end := time.Now().Add(opts.Duration)
	var wg sync.WaitGroup
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		name, grant := names[rand.IntN(len(names))], i%10 == 9
		wg.Go(func() {
			updated, err := renewOrGrant(ctx, cs, ns, name, i, grant)
			if err != nil {
				return
			}
			t.answered(name, grant, updated)
		})
	}
	wg.Wait()
}

// renewOrGrant reads the Lease name and writes it back renewed or, with
// grant, granted to holder cost-holder-<i> (the next token). It returns the
// Lease written.
func renewOrGrant(ctx context.Context, cs kubernetes.Interface, ns, name string, i int, grant bool) (*coordinationv1.Lease, error) {
	l, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	now := metav1.NewMicroTime(time.Now())
	l.Spec.RenewTime = &now
	if grant {
		l.Spec.HolderIdentity = new(fmt.Sprintf("cost-holder-%d", i))
		l.Spec.LeaseTransitions = new(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		l.Spec.AcquireTime = &now
	}
	return cs.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
}

// lagResult is what renewAndMeasureLag measured.
type lagResult struct {
	row                            Row
	renewals, grants, statusWrites int
}

// processRSS reads VmRSS and VmHWM (peak) of a process, in bytes.
func processRSS(pid int) (int64, int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var rss, peak int64
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb * 1024
		case "VmHWM:":
			peak = kb * 1024
		}
	}
	return rss, peak, nil
}

// parallel runs fn over items with n workers and returns the first error.
func parallel(n int, items []string, fn func(string) error) error {
	ch := make(chan string)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for it := range ch {
				if err := fn(it); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for _, it := range items {
		select {
		case ch <- it:
		case err := <-errs:
			close(ch)
			wg.Wait()
			return err
		}
	}
	close(ch)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func printCost(out io.Writer, rows []CostRow, opts CostOptions) {
	churn := "no churn"
	if opts.ForeignChurn {
		churn = "foreign Leases renewed every 10 s, 1 pod in 60 changed per second"
	}
	fmt.Fprintf(out, "\ncontroller cost: manager binary as its own process, every lock held, %d renewals/s (one in ten a takeover grant) across them for %s, %d unrelated pods, %d foreign Leases (%s)\n\n",
		opts.RenewalsPerSecond, opts.Duration, opts.Pods, opts.ForeignLeases, churn)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(w, "locks\tsetup (create+grant)\tstatus caught up after\tmanager RSS\tpeak RSS\tgrant status lag p50\tp99\tn\tLease watch events\tforeign Lease writes\tpod watch events\tpod writes\tnote\t")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%s\t%s\t%.0f MiB\t%.0f MiB\t%s\t%s\t%d\t%.0f\t%d\t%.0f\t%d\t%s\t\n", r.Locks, r.Setup.Round(time.Second), r.CatchUp.Round(time.Second),
			float64(r.RSSBytes)/(1<<20), float64(r.PeakRSSBytes)/(1<<20), ms(r.Lag.Percentile(50)), ms(r.Lag.Percentile(99)), len(r.Lag.Samples),
			r.LeaseEvents, r.ForeignLeaseWrites, r.PodEvents, r.PodWrites, r.Lag.Name)
	}
	_ = w.Flush()
}
