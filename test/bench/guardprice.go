package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/localrun"
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/guardcost"
)

// The guard's price: the same operations, by the same kind of client (a
// participant: a ServiceAccount bound to the shipped frontdesk-lock-user
// ClusterRole, with tokens bound to its pods, as workloads have), in two
// namespaces of one control plane: one that the lease guard's bindings
// select (config/lease-policy, as shipped, its bindings given a namespace
// selector) and one they do not. The sides alternate in blocks, so that
// both are measured over the same stretch of the run, and each row is the
// ratio of the guarded side's p50 to the open side's, with a 90 % band
// (bootstrap over the samples of each side). The guard skips the manager
// and cluster admins (its matchConditions): a bench whose clients were
// admins would measure nothing.

// GuardPriceOptions size the guard's price measurement.
type GuardPriceOptions struct {
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string
	// Iterations is the number of samples of each latency row, per side.
	Iterations int
	// Block is how many samples a side takes before the other's turn.
	Block int
	// Handoffs is the number of handoffs measured per waiter count and
	// side, in blocks of HandoffBlock.
	Handoffs, HandoffBlock int
	// Waiters are the waiter counts for the handoffs.
	Waiters []int
	// Queues are the queue lengths at which the single writes are
	// measured (renewal, registration, withdrawal, hand-off), with values
	// as the library writes them; the worst Lease (MaxPlaces places, the
	// longest values of the grammar) is always measured too.
	Queues []int
	// Locks are the numbers of locks of the throughput measurement, each
	// measured for Throughput per side and round, ThroughputRounds rounds.
	Locks            []int
	Throughput       time.Duration
	ThroughputRounds int
	// LeaseDurationSeconds of every lock.
	LeaseDurationSeconds int32
	// APIServerProfile, when set, is where a CPU profile of kube-apiserver
	// taken during the single writes at the first queue length goes (its
	// /debug/pprof/profile): where the guard's time goes.
	APIServerProfile string
}

// The goals of PriceRow.Goal.
const (
	goalPercent    = "pct"
	goalMillis     = "ms"
	goalThroughput = "tput"
)

// PriceRow is one operation measured on both sides.
type PriceRow struct {
	Name string
	// Goal: goalPercent (at most +15 % on the p50), goalMillis (at most +1 ms on the
	// p50), goalThroughput (at least 0.90× the throughput), or "" (reported only).
	Goal string
	// Open and Guarded are the samples of each side (latency rows).
	Open, Guarded Row
	// Throughput rows: operations per second of each side, per round.
	OpenRates, GuardedRates []float64
}

// Ratio is guarded / open (p50s, or throughputs) and its 90 % band.
func (r PriceRow) Ratio() (ratio, lo, hi float64) {
	if r.Goal == goalThroughput {
		return bootstrap(r.GuardedRates, r.OpenRates, func(g, o []float64) float64 { return mean(g) / mean(o) })
	}
	g, o := durations(r.Guarded.Samples), durations(r.Open.Samples)
	return bootstrap(g, o, func(g, o []float64) float64 { return median(g) / median(o) })
}

// Delta is guarded p50 - open p50, in milliseconds, and its 90 % band.
func (r PriceRow) Delta() (delta, lo, hi float64) {
	g, o := durations(r.Guarded.Samples), durations(r.Open.Samples)
	return bootstrap(g, o, func(g, o []float64) float64 { return (median(g) - median(o)) * 1000 })
}

// Met says whether the row meets its goal: "yes", "no", "noise" (the goal
// lies within the band), or "".
func (r PriceRow) Met() string {
	var v, lo, hi, bar float64
	switch r.Goal {
	case goalPercent:
		v, lo, hi = r.Ratio()
		bar = goalPriceRatio
	case goalMillis:
		v, lo, hi = r.Delta()
		bar = goalPriceWorstMillis
	case goalThroughput:
		v, lo, hi = r.Ratio()
		// higher is better: flip
		v, lo, hi, bar = -v, -hi, -lo, -goalPriceThroughput
	default:
		return ""
	}
	switch {
	case hi <= bar:
		return "yes"
	case lo > bar:
		return "no"
	case v <= bar:
		return "yes (band crosses)"
	default:
		return "no (band crosses)"
	}
}

// guardSide is one namespace and its participants.
type guardSide struct {
	guarded bool
	ns      string
	parts   []participant
	next    int
	mu      sync.Mutex
}

// participant is one pod's client: its token's requests.
type participant struct {
	cs        kubernetes.Interface
	dyn       dynamic.Interface
	principal string
}

// take is the next participant, round robin: each pod's principal holds
// at most lease.MaxPlacesPerPrincipal places of a lock.
func (s *guardSide) take() participant {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.parts[s.next%len(s.parts)]
	s.next++
	return p
}

func (s *guardSide) name() string {
	if s.guarded {
		return "guarded"
	}
	return "open"
}

// guardPriceLabel selects the namespaces the bench's bindings of the guard
// apply to.
const guardPriceLabel = "bench.frontdesk.dev/lease-guard"

// Names as long as Kubernetes allows, so that the participants' principals
// are as long as a ServiceAccount's can be (339 of the grammar's 340
// characters): the guard compares them with every place and grant.
var (
	guardedNS       = padName("guard-price-on-", 63)
	openNS          = padName("guard-price-off-", 63)
	participantSA   = padName("participant-", 253)
	participantPods = 8
)

func padName(prefix string, n int) string { return prefix + strings.Repeat("x", n-len(prefix)) }

// RunGuardPrice starts a local control plane with the manager, measures
// every operation on both sides, and prints a table.
func RunGuardPrice(ctx context.Context, opts GuardPriceOptions, out io.Writer) ([]PriceRow, error) {
	if opts.Iterations < 1 || opts.Handoffs < 1 || len(opts.Waiters) == 0 {
		return nil, fmt.Errorf("guard price: iterations (%d), handoffs (%d) and waiters (%v) are needed", opts.Iterations, opts.Handoffs, opts.Waiters)
	}
	opts.Block = max(opts.Block, 1)
	opts.HandoffBlock = max(opts.HandoffBlock, 1)
	opts.ThroughputRounds = max(opts.ThroughputRounds, 1)
	env, err := localrun.StartEnvironment(ctx, localrun.EnvironmentOptions{AssetsDir: opts.AssetsDir, MetricsBindAddress: "0"})
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Stop() }()
	admin, err := kubernetes.NewForConfig(lock.ProtobufConfig(env.ControlPlane.Config))
	if err != nil {
		return nil, err
	}
	sides, err := setupGuardPrice(ctx, env, admin, opts)
	if err != nil {
		return nil, err
	}
	before, err := readAdmissionMetrics(ctx, admin)
	if err != nil {
		return nil, err
	}
	var rows []PriceRow
	r, err := priceUncontended(ctx, sides, opts)
	if err != nil {
		return nil, err
	}
	rows = append(rows, r...)
	for i, q := range append(slices.Clone(opts.Queues), -1) {
		var profiled chan error
		if i == 0 && opts.APIServerProfile != "" {
			profiled = make(chan error, 1)
			go func() { profiled <- profileAPIServer(ctx, admin, opts.APIServerProfile, 20*time.Second) }()
		}
		r, err := priceWrites(ctx, admin, sides, opts, q)
		if err != nil {
			return nil, err
		}
		if profiled != nil {
			if err := <-profiled; err != nil {
				return nil, err
			}
		}
		rows = append(rows, r...)
	}
	r, err = priceHandoffs(ctx, admin, sides, opts)
	if err != nil {
		return nil, err
	}
	rows = append(rows, r...)
	r, err = priceThroughput(ctx, sides, opts)
	if err != nil {
		return nil, err
	}
	rows = append(rows, r...)
	after, err := readAdmissionMetrics(ctx, admin)
	if err != nil {
		return nil, err
	}
	printGuardPrice(out, rows, opts, after.minus(before))
	return rows, nil
}

// setupGuardPrice creates both namespaces, the shipped lock-user role, the
// participants (a ServiceAccount, its pods and a token bound to each), the
// locks, and installs the guard with bindings that select the guarded
// namespace only; it returns once the guard is in force there and not in
// the other.
func setupGuardPrice(ctx context.Context, env *localrun.Environment, admin kubernetes.Interface, opts GuardPriceOptions) ([2]*guardSide, error) {
	sides := [2]*guardSide{{guarded: true, ns: guardedNS}, {ns: openNS}}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return sides, err
	}
	if err := createLockUserRole(ctx, env); err != nil {
		return sides, err
	}
	names := []string{"solo", "probe"}
	for _, w := range opts.Waiters {
		names = append(names, fmt.Sprintf("handoff-%d", w))
	}
	for _, q := range append(slices.Clone(opts.Queues), -1) {
		names = append(names, writesLock(q))
	}
	for i := range max(slicesMax(opts.Locks), 1) {
		names = append(names, fmt.Sprintf("tp-%d", i))
	}
	for _, s := range sides {
		labels := map[string]string{}
		if s.guarded {
			labels[guardPriceLabel] = "on"
		}
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			return sides, fmt.Errorf("creating namespace: %w", err)
		}
		if err := createParticipants(ctx, env.ControlPlane.Config, admin, s); err != nil {
			return sides, err
		}
		for _, name := range names {
			l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
				Spec: locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: opts.LeaseDurationSeconds}}
			if err := env.Client.Create(ctx, l); err != nil {
				return sides, fmt.Errorf("creating lock %s: %w", name, err)
			}
		}
		if err := env.WaitReady(ctx, s.ns, names); err != nil {
			return sides, err
		}
	}
	// The guard as shipped, its bindings scoped to the guarded namespace.
	policy := filepath.Join(root, "config", "lease-policy", "policy.yaml")
	if other := os.Getenv("FRONTDESK_BENCH_POLICY"); other != "" {
		policy = other // another version of the policies, to price it
	}
	for _, file := range []string{policy, filepath.Join(root, "config", "lease-policy", "binding.yaml")} {
		if err := createShipped(ctx, env, file, func(o *unstructured.Unstructured) bool {
			if o.GetKind() == "ValidatingAdmissionPolicyBinding" {
				sel := map[string]any{"matchLabels": map[string]any{guardPriceLabel: "on"}}
				if err := unstructured.SetNestedField(o.Object, sel, "spec", "matchResources", "namespaceSelector"); err != nil {
					panic(err)
				}
			}
			return true
		}); err != nil {
			return sides, err
		}
	}
	// In force on one side, not on the other: a participant's write of
	// another holder without a new token is refused only where guarded.
	for _, s := range sides {
		if err := waitGuard(ctx, s); err != nil {
			return sides, err
		}
	}
	// The manager agrees: Guarded on one side only.
	for _, s := range sides {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			var l locksv1alpha1.DistributedLock
			if err := env.Client.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "solo"}, &l); err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(l.Status.Conditions, locksv1alpha1.ConditionGuarded)
			return c != nil && (c.Status == metav1.ConditionTrue) == s.guarded, nil
		})
		if err != nil {
			return sides, fmt.Errorf("the %s side's lock does not say Guarded=%t: %w", s.name(), s.guarded, err)
		}
	}
	return sides, nil
}

// createShipped creates the objects of a shipped manifest, each as edit
// leaves it.
func createShipped(ctx context.Context, env *localrun.Environment, path string, edit func(*unstructured.Unstructured) bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	objs, err := manifests.Decode(data)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if !edit(o) {
			continue
		}
		if err := env.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %s %s from %s: %w", o.GetKind(), o.GetName(), path, err)
		}
	}
	return nil
}

// createLockUserRole creates the shipped frontdesk-lock-user ClusterRole
// (config/rbac, named as config/default names it).
func createLockUserRole(ctx context.Context, env *localrun.Environment) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	return createShipped(ctx, env, filepath.Join(root, "config", "rbac", "lock_user_role.yaml"), func(o *unstructured.Unstructured) bool {
		o.SetName("frontdesk-" + o.GetName()) // config/default's namePrefix
		return true
	})
}

// bindLockUser creates ServiceAccount sa in ns and binds the shipped
// frontdesk-lock-user ClusterRole to it (createLockUserRole), as a
// workload's RoleBinding does (config/samples/lock_user_rolebinding.yaml).
func bindLockUser(ctx context.Context, admin kubernetes.Interface, ns, sa string) error {
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, sa, err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "lock-user-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "frontdesk-lock-user"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("binding frontdesk-lock-user to %s/%s: %w", ns, sa, err)
	}
	return nil
}

// createBoundPod creates pod name in ns, of ServiceAccount sa, with one
// container (never started: no kubelet runs here), and requests a token of
// sa bound to it (TokenRequest), as the kubelet projects into the pod. It
// returns the pod and the token.
func createBoundPod(ctx context.Context, admin kubernetes.Interface, ns, sa, name string) (*corev1.Pod, string, error) {
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: sa, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "main", Image: "frontdesk.invalid/participant:never-pulled"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("creating pod %s: %w", name, err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3 * 3600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("requesting a token bound to pod %s: %w", pod.Name, err)
	}
	return pod, tr.Status.Token, nil
}

// createParticipants makes s's ServiceAccount, binds it to the shipped
// frontdesk-lock-user ClusterRole, and gives each of its pods a client
// whose requests carry a token bound to that pod (TokenRequest), as a
// process in the pod has.
func createParticipants(ctx context.Context, adminCfg *rest.Config, admin kubernetes.Interface, s *guardSide) error {
	if err := bindLockUser(ctx, admin, s.ns, participantSA); err != nil {
		return err
	}
	for i := range participantPods {
		pod, token, err := createBoundPod(ctx, admin, s.ns, participantSA, fmt.Sprintf("participant-%d", i))
		if err != nil {
			return err
		}
		cfg := rest.AnonymousClientConfig(adminCfg)
		cfg.BearerToken = token
		cfg.QPS = -1
		cs, err := kubernetes.NewForConfig(lock.ProtobufConfig(cfg))
		if err != nil {
			return err
		}
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return err
		}
		principal, err := lock.SelfPrincipal(ctx, cs.AuthenticationV1().SelfSubjectReviews())
		if err != nil {
			return err
		}
		if !strings.HasPrefix(principal, "pod="+string(pod.UID)+" user=system:serviceaccount:") {
			return fmt.Errorf("participant's principal %q: not its pod's", principal)
		}
		s.parts = append(s.parts, participant{cs: cs, dyn: dyn, principal: principal})
	}
	// RBAC caches catch up with the new binding.
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := s.parts[0].cs.CoordinationV1().Leases(s.ns).List(ctx, metav1.ListOptions{Limit: 1})
		if apierrors.IsForbidden(err) {
			err = nil
		}
		_, err2 := s.parts[0].cs.CoordinationV1().Leases(s.ns).Get(ctx, "solo", metav1.GetOptions{})
		return err2 == nil || apierrors.IsNotFound(err2), err
	})
}

// waitGuard waits until a participant's write that names a holder without
// raising the token (what the guard refuses first) is refused on the
// guarded side, and checks that it lands on the open side.
func waitGuard(ctx context.Context, s *guardSide) error {
	leases := s.parts[0].cs.CoordinationV1().Leases(s.ns)
	attempt := 0
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, "probe", metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("reading the probe's lease: %w", err)
		}
		attempt++
		l.Spec.HolderIdentity = new(fmt.Sprintf("probe-%d", attempt))
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case apierrors.IsForbidden(err) && s.guarded:
			return true, nil
		case apierrors.IsForbidden(err):
			return false, fmt.Errorf("the guard refuses writes on the open side: %w", err)
		case err == nil && !s.guarded:
			return true, nil
		case err == nil || apierrors.IsConflict(err):
			return false, nil
		default:
			return false, fmt.Errorf("probing the lease guard: %w", err)
		}
	})
}

// alternate runs block(side) for each side in turn, n times, the order of
// the two sides swapped every other round (ABBA), so that neither side is
// always the one right after the other's writes.
func alternate(ctx context.Context, sides [2]*guardSide, rounds int, block func(s *guardSide) error) error {
	for round := range rounds {
		order := []*guardSide{sides[0], sides[1]}
		if round%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, s := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := block(s); err != nil {
				return fmt.Errorf("%s side: %w", s.name(), err)
			}
		}
	}
	return nil
}

// priceUncontended: the library's uncontended acquire and release.
func priceUncontended(ctx context.Context, sides [2]*guardSide, opts GuardPriceOptions) ([]PriceRow, error) {
	acq, rel := map[*guardSide][]time.Duration{}, map[*guardSide][]time.Duration{}
	clients := map[*guardSide]*lock.Client{}
	for _, s := range sides {
		p := s.take()
		c, err := lock.NewForClients(p.cs, p.dyn, lock.Config{Namespace: s.ns, Name: "solo", Identity: "bench-solo"})
		if err != nil {
			return nil, err
		}
		clients[s] = c
		for range max(opts.Block/2, 3) { // warm up connections, caches, the principal
			g, err := c.TryAcquire(ctx)
			if err != nil {
				return nil, err
			}
			if err := g.Release(ctx); err != nil {
				return nil, err
			}
		}
	}
	rounds := (opts.Iterations + opts.Block - 1) / opts.Block
	err := alternate(ctx, sides, rounds, func(s *guardSide) error {
		for range opts.Block {
			start := time.Now()
			g, err := clients[s].TryAcquire(ctx)
			if err != nil {
				return fmt.Errorf("uncontended acquire: %w", err)
			}
			acquired := time.Now()
			if err := g.Release(ctx); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			acq[s] = append(acq[s], acquired.Sub(start))
			rel[s] = append(rel[s], time.Since(acquired))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return []PriceRow{
		priceRow("acquire, uncontended (library)", goalPercent, acq, sides),
		priceRow("release (library)", goalPercent, rel, sides),
	}, nil
}

func priceRow(name, goal string, samples map[*guardSide][]time.Duration, sides [2]*guardSide) PriceRow {
	return PriceRow{Name: name, Goal: goal, Guarded: sorted(Row{Samples: samples[sides[0]]}), Open: sorted(Row{Samples: samples[sides[1]]})}
}

// writesLock is the lock of the single writes at queue length q (-1: the
// worst Lease).
func writesLock(q int) string {
	if q < 0 {
		return "writes-worst"
	}
	return fmt.Sprintf("writes-%d", q)
}

// writesState is one side's Lease for the single writes: held by the
// participant holder, with a queue of others' places, and the Lease as the
// manager (an admin) puts it back after each hand-off.
type writesState struct {
	name             string
	holder, joiner   participant
	identity         string
	ticket           string
	base             *coordinationv1.Lease
	current          *coordinationv1.Lease
	leases           func(p participant) leaseWriter
	adminLeases      leaseWriter
	duration         time.Duration
	worst            bool
	places           int
	registerIdentity string
	lost             int
}

type leaseWriter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*coordinationv1.Lease, error)
}

// fillerQueue is a queue of n places of other principals: as the library
// writes them, or (worst) with the longest values of the grammar
// (guardcost.WorstQueue).
func fillerQueue(n int, worst bool) []lease.Waiter {
	if worst {
		return guardcost.WorstQueue(n)
	}
	q := make([]lease.Waiter, n)
	for i := range q {
		q[i] = lease.Waiter{Ticket: fmt.Sprintf("%016x", i+1), Identity: fmt.Sprintf("waiter-%d", i),
			Principal: fmt.Sprintf("user=waiter-%d", i/lease.MaxPlacesPerPrincipal)}
	}
	return q
}

// setupWrites puts side s's Lease of the single writes at queue length q
// in its starting state (as an admin, whom the guard skips): held by a
// participant, with q (worst: MaxPlaces-1) places of others; the
// registration measured adds one (on the worst Lease, the last the queue
// may hold).
func setupWrites(ctx context.Context, admin kubernetes.Interface, s *guardSide, q int, d time.Duration) (*writesState, error) {
	worst := q < 0
	places := q
	if worst {
		places = lease.MaxPlaces - 1
	}
	st := &writesState{name: writesLock(q), holder: s.take(), joiner: s.take(), duration: d, worst: worst, places: places,
		identity: "bench-holder", ticket: "bench-joiner", registerIdentity: "bench-joiner"}
	if worst {
		st.identity = strings.Repeat("h", lease.MaxIdentityLength)
		st.ticket = strings.Repeat("j", lease.MaxTicketLength)
		st.registerIdentity = strings.Repeat("r", lease.MaxIdentityLength)
	}
	ns := s.ns
	st.leases = func(p participant) leaseWriter { return p.cs.CoordinationV1().Leases(ns) }
	st.adminLeases = admin.CoordinationV1().Leases(ns)
	l, err := st.adminLeases.Get(ctx, st.name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	l = lease.SetQueue(l, fillerQueue(places, worst))
	if worst {
		if err := guardcost.WorstSeqs(l); err != nil { // seqs of 15 digits
			return nil, err
		}
	}
	if l, err = lease.Grant(l, st.identity, st.holder.principal, d, time.Now()); err != nil {
		return nil, err
	}
	if l, err = st.adminLeases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("setting up lease %s: %w", st.name, err)
	}
	if got := len(lease.Queue(l)); got != places {
		return nil, fmt.Errorf("lease %s: %d places of the grammar, want %d", st.name, got, places)
	}
	st.base, st.current = l, l
	return st, nil
}

// priceWrites: the single Lease writes of participants at queue length q
// (q < 0: the worst Lease the rules allow), the holder's renewal, another
// participant's registration (behind the queue, making it q long) and
// withdrawal, and the holder's hand-off to the head of the queue, each as
// the library writes it (JSON patches that test what they rest on; the
// withdrawal a merge patch). After each hand-off the Lease is put back (by
// an admin, unmeasured).
func priceWrites(ctx context.Context, admin kubernetes.Interface, sides [2]*guardSide, opts GuardPriceOptions, q int) ([]PriceRow, error) {
	d := time.Duration(opts.LeaseDurationSeconds) * time.Second
	states := map[*guardSide]*writesState{}
	for _, s := range sides {
		st, err := setupWrites(ctx, admin, s, q, d)
		if err != nil {
			return nil, err
		}
		states[s] = st
	}
	renew, register, withdraw, handoff := map[*guardSide][]time.Duration{}, map[*guardSide][]time.Duration{}, map[*guardSide][]time.Duration{},
		map[*guardSide][]time.Duration{}
	warm := true
	cycle := func(s *guardSide) error {
		st := states[s]
		n := opts.Block
		if warm {
			n = max(opts.Block/4, 2)
		}
		for i := 0; i < n; {
			took, lost, err := st.cycle(ctx)
			if err != nil {
				return err
			}
			if lost {
				st.lost++
				if st.lost > opts.Iterations/5+5 {
					return fmt.Errorf("lease %s: %d cycles lost to other writers", st.name, st.lost)
				}
				continue
			}
			i++
			if !warm {
				renew[s] = append(renew[s], took[0])
				register[s] = append(register[s], took[1])
				withdraw[s] = append(withdraw[s], took[2])
				handoff[s] = append(handoff[s], took[3])
			}
		}
		return nil
	}
	if err := alternate(ctx, sides, 1, cycle); err != nil {
		return nil, err
	}
	warm = false
	if err := alternate(ctx, sides, (opts.Iterations+opts.Block-1)/opts.Block, cycle); err != nil {
		return nil, err
	}
	for _, s := range sides {
		if n := states[s].lost; n > 0 {
			fmt.Fprintf(os.Stderr, "guard price: %s side, lease %s: %d cycles lost to other writers (not counted)\n", s.name(), states[s].name, n)
		}
	}
	at := fmt.Sprintf("queue of %d", q)
	goal := goalPercent
	if q < 0 {
		at = fmt.Sprintf("worst Lease: %d places, longest values", lease.MaxPlaces)
		goal = goalMillis
	}
	return []PriceRow{
		priceRow("renewal, "+at, goal, renew, sides),
		priceRow("registration, "+at, goal, register, sides),
		priceRow("withdrawal, "+at, goal, withdraw, sides),
		priceRow("hand-off write, "+at, goal, handoff, sides),
	}, nil
}

// cycle is one renewal, registration, withdrawal and hand-off, timed, and
// the Lease put back. A write whose tests fail (someone else wrote the
// Lease: the controller, following the grants) puts the Lease back and
// reports lost, and the cycle counts for nothing.
func (st *writesState) cycle(ctx context.Context) (took [4]time.Duration, lost bool, err error) {
	holder, joiner := st.leases(st.holder), st.leases(st.joiner)
	patch := func(w leaseWriter, pt types.PatchType, data []byte) (*coordinationv1.Lease, time.Duration, error) {
		start := time.Now()
		l, err := w.Patch(ctx, st.name, pt, data, metav1.PatchOptions{})
		return l, time.Since(start), err
	}
	lostWrite := func(what string, err error) ([4]time.Duration, bool, error) {
		if lease.PatchDidNotApply(err) || apierrors.IsConflict(err) {
			return took, true, st.putBack(ctx, nil)
		}
		return took, false, fmt.Errorf("%s: %w", what, err)
	}
	var l *coordinationv1.Lease
	if l, took[0], err = patch(holder, types.JSONPatchType, lease.RenewPatch(st.current, time.Now()).Bytes()); err != nil {
		return lostWrite("renewal", err)
	}
	w := lease.Waiter{Ticket: st.ticket, Identity: st.registerIdentity, Principal: st.joiner.principal}
	if st.worst {
		w.Priority = lease.MinPriority
	}
	reg, _, err := lease.ExactRegistration(l, w)
	if err != nil {
		return took, false, err
	}
	if _, took[1], err = patch(joiner, types.JSONPatchType, reg.Bytes()); err != nil {
		return lostWrite("registration", err)
	}
	wd, err := lease.Withdrawal(st.ticket)
	if err != nil {
		return took, false, err
	}
	if l, took[2], err = patch(joiner, types.MergePatchType, wd); err != nil {
		return lostWrite("withdrawal", err)
	}
	ho, _, ok, err := lease.HandOffPatch(l, st.identity, st.duration, time.Now())
	if err != nil {
		return took, false, fmt.Errorf("hand-off: %w", err)
	}
	if !ok {
		return took, false, errors.New("hand-off: nobody queued")
	}
	if l, took[3], err = patch(holder, types.JSONPatchType, ho.Bytes()); err != nil {
		return lostWrite("hand-off", err)
	}
	return took, false, st.putBack(ctx, l)
}

// putBack writes the Lease as it started (as an admin, whom the guard
// skips): the holder holds again, with a token raised once more (a token
// never goes down, and a new holder comes with a new one), the queue
// whole again. latest is the Lease as last written, or nil (read it).
func (st *writesState) putBack(ctx context.Context, latest *coordinationv1.Lease) error {
	var err error
	for range 5 {
		if latest == nil {
			if latest, err = st.adminLeases.Get(ctx, st.name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		back := st.base.DeepCopy()
		back.ResourceVersion = latest.ResourceVersion
		back.Spec.LeaseTransitions = new(*latest.Spec.LeaseTransitions + 1)
		now := metav1.NewMicroTime(time.Now())
		back.Spec.AcquireTime, back.Spec.RenewTime = &now, &now
		if st.current, err = st.adminLeases.Update(ctx, back, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			break
		}
		latest = nil
	}
	if err != nil {
		return fmt.Errorf("putting lease %s back: %w", st.name, err)
	}
	return nil
}

// priceHandoffs: the library's handoffs among each number of waiters (all
// participants, spread over the side's pods), the sides and waiter counts
// in turns (rotation).
func priceHandoffs(ctx context.Context, admin kubernetes.Interface, sides [2]*guardSide, opts GuardPriceOptions) ([]PriceRow, error) {
	type entry struct {
		s *guardSide
		n int
	}
	entries := make([]entry, 0, len(opts.Waiters)*len(sides))
	crowds := make([]handoffCrowd, 0, cap(entries))
	for _, n := range opts.Waiters {
		for _, s := range sides {
			entries = append(entries, entry{s, n})
			crowds = append(crowds, handoffCrowd{what: fmt.Sprintf("%s side, handoffs with %d waiters", s.name(), n), ns: s.ns,
				name: fmt.Sprintf("handoff-%d", n), n: n, sys: frontdeskSystem{ns: s.ns, pool: s.take}})
		}
	}
	results, err := handoffsInTurns(ctx, admin, crowds, opts.Handoffs, opts.HandoffBlock)
	if err != nil {
		return nil, err
	}
	var rows []PriceRow
	for i := 0; i < len(entries); i += 2 {
		n := entries[i].n
		g, o := results[i], results[i+1]
		rows = append(rows, PriceRow{Name: fmt.Sprintf("hand-off, %d waiters: Release called → next holds (library)", n), Goal: goalPercent,
			Guarded: g.fromStart, Open: o.fromStart})
	}
	return rows, nil
}

// priceThroughput: acquire+release by one client per lock, on each number
// of locks, the sides in turns.
func priceThroughput(ctx context.Context, sides [2]*guardSide, opts GuardPriceOptions) ([]PriceRow, error) {
	var rows []PriceRow
	for _, n := range opts.Locks {
		rates := map[*guardSide][]float64{}
		err := alternate(ctx, sides, opts.ThroughputRounds, func(s *guardSide) error {
			r, err := throughput(ctx, frontdeskSystem{ns: s.ns, pool: s.take}, n, opts.Throughput)
			rates[s] = append(rates[s], r)
			return err
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, PriceRow{Name: fmt.Sprintf("acquire+release throughput, %d locks (ops/s)", n), Goal: goalThroughput,
			GuardedRates: rates[sides[0]], OpenRates: rates[sides[1]]})
	}
	return rows, nil
}

// profileAPIServer writes a CPU profile of kube-apiserver, taken for d, to
// path.
func profileAPIServer(ctx context.Context, cs kubernetes.Interface, path string, d time.Duration) error {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(int(d.Seconds()))).
		Timeout(d + 30*time.Second).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("profiling kube-apiserver: %w", err)
	}
	return os.WriteFile(path, raw, 0o644)
}

// admissionMetrics are the apiserver's admission histograms' sums and
// counts: the lease guard's own evaluation time (its checks), and all of
// validating admission for Lease updates.
type admissionMetrics map[string]float64

func readAdmissionMetrics(ctx context.Context, cs kubernetes.Interface) (admissionMetrics, error) {
	m := admissionMetrics{}
	for _, name := range []string{"apiserver_validating_admission_policy_check_duration_seconds_sum",
		"apiserver_validating_admission_policy_check_duration_seconds_count"} {
		err := scrapeCounter(ctx, cs, name, func(labels map[string]string, value float64) {
			m[name+"|"+labels["policy"]+"|"+labels["enforcement_action"]] += value
		})
		if err != nil {
			return nil, err
		}
	}
	// The whole ValidatingAdmissionPolicy plugin, every request it saw
	// (the manager's, which no policy judges, too).
	for _, name := range []string{"apiserver_admission_controller_admission_duration_seconds_sum", "apiserver_admission_controller_admission_duration_seconds_count"} {
		err := scrapeCounter(ctx, cs, name, func(labels map[string]string, value float64) {
			if labels["name"] == "ValidatingAdmissionPolicy" && labels["type"] == "validate" && labels["rejected"] == "false" {
				m[name+"|"+labels["operation"]] += value
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m admissionMetrics) minus(o admissionMetrics) admissionMetrics {
	d := admissionMetrics{}
	for k, v := range m {
		d[k] = v - o[k]
	}
	return d
}

// printGuardPrice prints the rows and what the apiserver says the guard's
// checks took.
func printGuardPrice(out io.Writer, rows []PriceRow, opts GuardPriceOptions, metrics admissionMetrics) {
	fmt.Fprintf(out, "frontdesk guard price: %d CPUs, %s, lease %ds; participants with pod-bound ServiceAccount tokens (frontdesk-lock-user), "+
		"config/lease-policy bound to one namespace and not the other, the sides alternating in blocks of %d (hand-offs %d); "+
		"ratio guarded/open with its 90%% bootstrap band\n\n",
		runtime.NumCPU(), runtime.Version(), opts.LeaseDurationSeconds, opts.Block, opts.HandoffBlock)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintf(w, "operation\tn per side\topen p50\tguarded p50\tguarded / open [90%% band]\tΔ p50 [90%% band]\tgoal\tmet\t\n")
	for _, r := range rows {
		ratio, lo, hi := r.Ratio()
		goal := map[string]string{goalPercent: "≤ +15 %", goalMillis: "≤ +1 ms", goalThroughput: "≥ 0.90×"}[r.Goal]
		if r.Goal == goalThroughput {
			fmt.Fprintf(w, "%s\t%d\t%.1f/s\t%.1f/s\t%.2fx [%.2f–%.2f]\t\t%s\t%s\t\n", r.Name, len(r.GuardedRates), mean(r.OpenRates), mean(r.GuardedRates),
				ratio, lo, hi, goal, r.Met())
			continue
		}
		delta, dlo, dhi := r.Delta()
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%.2fx [%.2f–%.2f]\t%+.2fms [%+.2f, %+.2f]\t%s\t%s\t\n", r.Name, len(r.Guarded.Samples),
			ms(r.Open.Percentile(50)), ms(r.Guarded.Percentile(50)), ratio, lo, hi, delta, dlo, dhi, goal, r.Met())
	}
	_ = w.Flush()
	const check = "apiserver_validating_admission_policy_check_duration_seconds"
	fmt.Fprintf(out, "\napiserver's own account over the run (%s, mean per check: it counts refusals only; "+
		"apiserver_admission_controller_admission_duration_seconds for the plugin):\n", check)
	for _, policy := range []string{"lease-guard", "lease-token-guard", "lease-create-guard"} {
		for _, decision := range []string{"allow", "deny"} {
			n := metrics[check+"_count|"+policy+"|"+decision]
			if n > 0 {
				fmt.Fprintf(out, "  %s %s: %.0f checks, mean %.3fms\n", policy, decision, n, metrics[check+"_sum|"+policy+"|"+decision]/n*1000)
			}
		}
	}
	const plugin = "apiserver_admission_controller_admission_duration_seconds"
	for _, op := range []string{"UPDATE", "CREATE"} {
		if n := metrics[plugin+"_count|"+op]; n > 0 {
			fmt.Fprintf(out, "  the ValidatingAdmissionPolicy plugin, every %s it admitted (the manager's too): %.0f, mean %.3fms\n", op, n,
				metrics[plugin+"_sum|"+op]/n*1000)
		}
	}
}

func durations(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds()
	}
	return out
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// bootstrap is stat(g, o) and the 5th and 95th percentiles of stat over
// resamplings (with replacement) of g and o, each on its own.
func bootstrap(g, o []float64, stat func(g, o []float64) float64) (v, lo, hi float64) {
	if len(g) == 0 || len(o) == 0 {
		return 0, 0, 0
	}
	v = stat(g, o)
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 1000
	vals := make([]float64, n)
	rg, ro := make([]float64, len(g)), make([]float64, len(o))
	for i := range vals {
		for j := range rg {
			rg[j] = g[rng.IntN(len(g))]
		}
		for j := range ro {
			ro[j] = o[rng.IntN(len(o))]
		}
		vals[i] = stat(rg, ro)
	}
	slices.Sort(vals)
	return v, vals[n*5/100], vals[n*95/100-1]
}
