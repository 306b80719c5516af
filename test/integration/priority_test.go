package integration

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// The flood and the holders of TestLeasePriorityKeepsRenewalsOnTime.
const (
	apfLease          = 3 * time.Second // each lock's lease duration
	apfRenewEvery     = 250 * time.Millisecond
	apfLocks          = 4
	apfFloodClients   = 160 // users, one LIST in flight each: more flows than global-default has queues (128)
	apfConfigMaps     = 400 // what each LIST returns (limit 500)
	apfFloodFor       = 10 * time.Second
	apfFloodGroup     = "frontdesk-test-flood"
	apfHolderUser     = "apf-holder"
	apfPlainUser      = "apf-bystander" // an ordinary client, to show the flood is one
	apfPriorityConfig = "priority"      // config/<this>
	// apfFloodEffect is how many times the protected renewals' p99 the
	// unprotected ones' must reach for the flood to count as one.
	apfFloodEffect = 3
)

// A flood of LIST requests from many low-priority users (loopback, one in
// flight per user, each bounded to one page) fills the apiserver's
// global-default priority level, where a lock holder's renewals land too
// unless config/priority is installed: without it they queue behind the
// flood (p99 at least apfFloodEffect times the p99 with it, or failing);
// with it they have a level of their own and keep their latency (p99 under
// a third of the lease, none failed). The apiserver runs with few seats
// (max-requests-inflight 8, max-mutating 4) so that a flood a test can
// afford fills them; how much the flood delays the unprotected renewals
// still depends on the machine's speed (global-default may borrow seats),
// which is why that side is judged against the protected side, not the
// lease.
func TestLeasePriorityKeepsRenewalsOnTime(t *testing.T) {
	if testing.Short() {
		t.Skip("floods an apiserver of its own for about 30 s")
	}
	ctx := context.Background()
	cp, err := controlplane.Start(controlplane.Options{
		KubeconfigPath: filepath.Join(t.TempDir(), "kubeconfig"),
		Configure: func(e *envtest.Environment) {
			args := e.ControlPlane.GetAPIServer().Configure()
			args.Set("max-requests-inflight", "8")
			args.Set("max-mutating-requests-inflight", "4")
		},
	})
	if err != nil {
		t.Fatalf("starting a control plane of the test's own: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	admin, err := client.New(cp.Config, client.Options{Scheme: manager.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	stopManager := startManagerOn(t, cp.Config)
	defer stopManager()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "dlock-apf-"}}
	must(t, admin.Create(ctx, ns))
	setUpFloodAndHolder(ctx, t, admin, ns.Name)

	without := measureRenewalsUnderFlood(ctx, t, cp.Config, admin, ns.Name, "without")
	t.Logf("without config/priority: %s", without)

	uid := installPriority(ctx, t, admin)
	with := measureRenewalsUnderFlood(ctx, t, cp.Config, admin, ns.Name, "with")
	t.Logf("with config/priority: %s", with)

	third := apfLease / 3
	delayed := without.failed > 0 || with.p99 > time.Duration(math.MaxInt64)/apfFloodEffect || without.p99 >= apfFloodEffect*with.p99
	if !delayed {
		t.Errorf("without config/priority the flood did not delay renewals (p99 %s, want at least %d times the %s with it): the test shows nothing",
			orFailed(without.p99), apfFloodEffect, orFailed(with.p99))
	}
	if with.p99 >= third {
		t.Errorf("with config/priority, renewal p99 %s, want under a third of the lease (%s)", orFailed(with.p99), third)
	}
	if with.failed > 0 || with.lost > 0 {
		t.Errorf("with config/priority: %d renewals failed, %d grants lost; want none", with.failed, with.lost)
	}
	if n := with.bySchema[uid]; n != with.renewals {
		t.Errorf("with config/priority: %d of %d renewals classified under its FlowSchema (%s); by schema UID: %v", n, with.renewals, uid, with.bySchema)
	}
}

// startManagerOn runs the frontdesk manager against rc until the returned
// stop is called.
func startManagerOn(t *testing.T, rc *rest.Config) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := manager.DefaultOptions()
	opts.MetricsBindAddress, opts.HealthProbeBindAddress = "0", "0"
	opts.AllowSeveralInProcess = true
	opts.GracefulShutdownTimeout = 5 * time.Second
	mgr, err := manager.New(ctx, rc, opts)
	if err != nil {
		cancel()
		t.Fatalf("starting a manager: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// setUpFloodAndHolder gives the flood's users (group apfFloodGroup) and the
// bystander the right to list ConfigMaps, creates the ConfigMaps they list,
// and binds the shipped lock-user ClusterRole to the holder.
func setUpFloodAndHolder(ctx context.Context, t *testing.T, admin client.Client, ns string) {
	t.Helper()
	roles, err := manifests.CreateFromFiles(ctx, admin, "", repoFile(t, "config", "rbac", "lock_user_role.yaml"))
	must(t, err)
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "holder-locks", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: roles[0].GetName()},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: apfHolderUser}},
	}))
	must(t, admin.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "list-configmaps", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
	}))
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "list-configmaps", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "list-configmaps"},
		Subjects: []rbacv1.Subject{{Kind: "Group", Name: apfFloodGroup},
			{Kind: "User", Name: apfPlainUser}},
	}))
	data := map[string]string{"v": strings.Repeat("x", 1024)}
	var wg sync.WaitGroup
	errs := make(chan error, apfConfigMaps)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < apfConfigMaps; i += 8 {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%04d", i), Namespace: ns}, Data: data}
				if err := admin.Create(ctx, cm); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	must(t, <-errs)
}

func repoFile(t *testing.T, elem ...string) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	must(t, err)
	return filepath.Join(append([]string{root}, elem...)...)
}

// installPriority creates config/priority's objects as config/default names
// them, waits until the apiserver classifies a Lease write under the
// FlowSchema, and returns the FlowSchema's UID.
func installPriority(ctx context.Context, t *testing.T, admin client.Client) string {
	t.Helper()
	dir := repoFile(t, "config", apfPriorityConfig)
	objs, err := manifests.CreateFromFiles(ctx, admin, "", filepath.Join(dir, "prioritylevel.yaml"), filepath.Join(dir, "flowschema.yaml"))
	must(t, err)
	var uid, name string
	for _, o := range objs {
		if o.GetKind() == "FlowSchema" {
			uid, name = string(o.GetUID()), o.GetName()
		}
	}
	if uid == "" {
		t.Fatalf("config/%s has no FlowSchema", apfPriorityConfig)
	}
	// The apiserver's APF configuration controller picks new objects up
	// asynchronously; the FlowSchema's Dangling condition says it did.
	eventually(t, 30*time.Second, func(g Gomega) {
		fs := &unstructured.Unstructured{}
		fs.SetAPIVersion("flowcontrol.apiserver.k8s.io/v1")
		fs.SetKind("FlowSchema")
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: name}, fs)).To(Succeed())
		conds, _, _ := unstructured.NestedSlice(fs.Object, "status", "conditions")
		g.Expect(conds).To(ContainElement(And(HaveKeyWithValue("type", "Dangling"), HaveKeyWithValue("status", "False"))))
	})
	return uid
}

// renewalStats are the holders' Lease writes during a flood.
type renewalStats struct {
	renewals, failed, lost int
	p50, p99, max          time.Duration
	bystanderP50           time.Duration
	bystanderFailed        int
	floodLists, flood429   int
	bySchema               map[string]int // FlowSchema UID (response header) -> renewals
}

func (s renewalStats) String() string {
	return fmt.Sprintf("%d renewals, p50 %s, p99 %s, max %s, %d failed, %d grants lost; bystander GET p50 %s (%d failed); flood %d LISTs, %d answered 429",
		s.renewals, orFailed(s.p50), orFailed(s.p99), orFailed(s.max), s.failed, s.lost, s.bystanderP50, s.bystanderFailed, s.floodLists, s.flood429)
}

// orFailed renders a latency, or "failed" for a renewal that never came back.
func orFailed(d time.Duration) string {
	if d == time.Duration(math.MaxInt64) {
		return "failed"
	}
	return d.Round(time.Millisecond).String()
}

// leaseWriteTimer times the Lease writes lock clients send, through the
// transports it wraps.
type leaseWriteTimer struct {
	mu       sync.Mutex
	on       bool
	times    []time.Duration
	failed   int
	bySchema map[string]int
}

type timedTransport struct {
	l    *leaseWriteTimer
	next http.RoundTripper
}

func (tt timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !leaseWriteRequest(req) {
		return tt.next.RoundTrip(req)
	}
	l := tt.l
	start := time.Now()
	resp, err := tt.next.RoundTrip(req)
	took := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.on {
		return resp, err
	}
	if err != nil || resp.StatusCode >= 400 {
		l.failed++
		return resp, err
	}
	l.times = append(l.times, took)
	l.bySchema[resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID")]++
	return resp, err
}

// measureRenewalsUnderFlood has apfLocks holders renew every apfRenewEvery
// while apfFloodClients users LIST ConfigMaps as fast as they are answered,
// and returns what the holders' renewals took.
func measureRenewalsUnderFlood(ctx context.Context, t *testing.T, adminCfg *rest.Config, admin client.Client, ns, phase string) renewalStats {
	t.Helper()
	timer := &leaseWriteTimer{bySchema: map[string]int{}}
	holderCfg := rest.CopyConfig(adminCfg)
	holderCfg.Impersonate = rest.ImpersonationConfig{UserName: apfHolderUser}
	holderCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return timedTransport{l: timer, next: rt} })

	// 1. Locks held, renewing.
	grants := make([]*lock.Grant, 0, apfLocks)
	for i := range apfLocks {
		name := fmt.Sprintf("%s-%d", phase, i)
		must(t, admin.Create(ctx, testutil.MakeLock(name, ns).LeaseDuration(int32(apfLease/time.Second)).Obj()))
		eventually(t, 10*time.Second, func(g Gomega) {
			l := &locksv1alpha1.DistributedLock{}
			g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(l.Status.Conditions, locksv1alpha1.ConditionReady)).To(BeTrue())
		})
		c, err := lock.New(holderCfg, lock.Config{Namespace: ns, Name: name, Identity: name + "-holder", RenewInterval: apfRenewEvery})
		must(t, err)
		g, err := c.TryAcquire(ctx)
		must(t, err)
		grants = append(grants, g)
	}
	defer func() {
		for _, g := range grants {
			if g.Err() == nil {
				_ = g.Release(ctx)
			}
		}
	}()

	// 2. The flood, and an ordinary client beside it.
	floodCtx, stopFlood := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var st renewalStats
	for i := range apfFloodClients {
		fc := rest.CopyConfig(adminCfg)
		fc.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("flood-%d", i), Groups: []string{apfFloodGroup}}
		cs := kubernetes.NewForConfigOrDie(fc)
		wg.Go(func() {
			for floodCtx.Err() == nil {
				_, err := cs.CoreV1().ConfigMaps(ns).List(floodCtx, metav1.ListOptions{Limit: 500})
				mu.Lock()
				st.floodLists++
				if apierrors.IsTooManyRequests(err) {
					st.flood429++
				}
				mu.Unlock()
			}
		})
	}
	var bystander []time.Duration
	bc := rest.CopyConfig(adminCfg)
	bc.Impersonate = rest.ImpersonationConfig{UserName: apfPlainUser}
	bcs := kubernetes.NewForConfigOrDie(bc)
	wg.Go(func() {
		for floodCtx.Err() == nil {
			start := time.Now()
			_, err := bcs.CoreV1().ConfigMaps(ns).Get(floodCtx, "cm-0000", metav1.GetOptions{})
			mu.Lock()
			if err != nil && floodCtx.Err() == nil {
				st.bystanderFailed++
			} else if err == nil {
				bystander = append(bystander, time.Since(start))
			}
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	})

	// 3. Renewals timed while the flood runs (its first second ramps up).
	time.Sleep(time.Second)
	timer.mu.Lock()
	timer.on = true
	timer.mu.Unlock()
	time.Sleep(apfFloodFor)
	timer.mu.Lock()
	timer.on = false
	times, failed := slices.Clone(timer.times), timer.failed
	for k, v := range timer.bySchema {
		st.bySchema = mapSet(st.bySchema, k, v)
	}
	timer.mu.Unlock()
	stopFlood()
	wg.Wait()

	for _, g := range grants {
		if g.Err() != nil {
			st.lost++
		}
	}
	st.renewals, st.failed = len(times), failed
	// A failed renewal counts as one that never came back.
	all := slices.Concat(times, slices.Repeat([]time.Duration{time.Duration(math.MaxInt64)}, failed))
	st.p50, st.p99, st.max = percentile(all, 0.50), percentile(all, 0.99), percentile(all, 1)
	st.bystanderP50 = percentile(bystander, 0.50)
	if st.renewals == 0 && st.failed == 0 {
		st.p99 = time.Duration(math.MaxInt64) // no renewal got through at all
	}
	return st
}

func mapSet(m map[string]int, k string, v int) map[string]int {
	if m == nil {
		m = map[string]int{}
	}
	m[k] = v
	return m
}

// percentile is the q-th quantile of ds (nearest rank); 0 for none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
