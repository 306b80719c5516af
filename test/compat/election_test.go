package compat

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// The operator's election timing: short, so that the test is too.
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 3 * time.Second
	retryPeriod   = 500 * time.Millisecond
)

var (
	scheme    = runtime.NewScheme()
	cfg       *rest.Config
	k8sClient client.Client
	// skip is why the tests cannot run here ("" when they can).
	skip string
	// managerLog is the frontdesk manager's output, shown when a test fails.
	managerLog string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

// run starts kube-apiserver and etcd with controller-runtime v0.21's
// envtest (the CRD from config/crd/bases) and the frontdesk manager, built
// from the root module, as a process of its own.
func run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(locksv1alpha1.AddToScheme(scheme))
	log.SetLogger(logr.Discard())
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		skip = "KUBEBUILDER_ASSETS is not set: `make test` sets it to bin/k8s (kube-apiserver, etcd)"
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "frontdesk-compat-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)

	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
	}
	if cfg, err = env.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest: %v\n", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	if k8sClient, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop, err := startManager(env, dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the frontdesk manager: %v\n", err)
		return 1
	}
	defer stop()
	return m.Run()
}

// startManager runs the frontdesk manager ($FRONTDESK_MANAGER, else built
// from the root module into dir) against env, and returns what stops it.
func startManager(env *envtest.Environment, dir string) (func(), error) {
	bin := os.Getenv("FRONTDESK_MANAGER")
	if bin == "" {
		bin = filepath.Join(dir, "manager")
		build := exec.Command("go", "build", "-o", bin, ".")
		build.Dir = filepath.Join("..", "..")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("building the manager: %w", err)
		}
	}
	user, err := env.AddUser(envtest.User{Name: "frontdesk-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	kubeconfigPath := filepath.Join(dir, "manager.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	managerLog = filepath.Join(dir, "manager.log")
	out, err := os.Create(managerLog)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--metrics-bind-address=0", "--health-probe-bind-address=0", "--leader-elect=false")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfigPath)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		out.Close()
	}, nil
}

// An operator on controller-runtime v0.21 and client-go v0.33 elects its
// leader through pkg/leaderelection (Options.LeaderElectionResourceLockInterface)
// on the Lease of a DistributedLock, which the frontdesk manager creates.
// Each leader fences a write with its Term's token and takes a second lock
// with pkg/lock for its work. The first leader's token is the Lease's
// leaseTransitions and the lock's status.fencingToken; when it stops
// (releasing on cancel) its Term ends, the standby leads with the next
// token, and a late write with the old token is refused.
func TestControllerRuntimeV021OperatorLeadsWithFencingTokens(t *testing.T) {
	if skip != "" {
		t.Skip(skip)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(managerLog); err == nil {
				t.Logf("frontdesk manager output:\n%s", b)
			}
		}
	})
	const election, job = "compat-operator", "compat-job"
	ns := newNamespace(t)
	createReadyLock(t, ns, election)
	createReadyLock(t, ns, job)
	ledger := fencing.NewMemoryGuard()

	a := startOperator(t, ns, election, job, "op-a", ledger)
	termA := a.nextTerm(t, 20*time.Second)
	eventually(t, 10*time.Second, func() error { return leaseAndLockRecord(ns, election, "op-a", termA.Token()) })
	jobA := a.nextJobToken(t, 10*time.Second)

	b := startOperator(t, ns, election, job, "op-b", ledger)
	a.stop(t) // releases the Lease (LeaderElectionReleaseOnCancel)
	if cause := context.Cause(termA.Context()); !errors.Is(cause, leaderelection.ErrReleased) {
		t.Errorf("the stopped leader's Term ended with %v, want %v", cause, leaderelection.ErrReleased)
	}
	if termA.Err() == nil {
		t.Error("the stopped leader's Term still reports no error")
	}

	termB := b.nextTerm(t, 10*time.Second)
	if termB.Token() != termA.Token()+1 {
		t.Errorf("the new leader's token is %d, want %d (the old leader's plus one)", termB.Token(), termA.Token()+1)
	}
	eventually(t, 10*time.Second, func() error { return leaseAndLockRecord(ns, election, "op-b", termB.Token()) })
	if jobB := b.nextJobToken(t, 10*time.Second); jobB <= jobA {
		t.Errorf("the job lock's token went from %d to %d, want it to rise", jobA, jobB)
	}

	// The old leader's token no longer passes the guard its successor wrote through.
	err := ledger.Fence(context.Background(), termA.FencingKey(), termA.Token(), func(context.Context) error { return nil })
	if !errors.Is(err, fencing.ErrStaleToken) {
		t.Errorf("a write with the old leader's token %d: got %v, want %v", termA.Token(), err, fencing.ErrStaleToken)
	}
}

// operator is a controller-runtime manager that elects its leader through
// pkg/leaderelection. Its one leader-only runnable fences a write to ledger
// with the Term's token, acquires and releases the job lock with pkg/lock,
// and reports both.
type operator struct {
	lock   *leaderelection.Lock
	terms  chan *leaderelection.Term
	jobs   chan int64
	errs   chan error
	cancel context.CancelFunc
	done   chan error
}

func startOperator(t *testing.T, ns, election, job, identity string, ledger fencing.Guard) *operator {
	t.Helper()
	lk, err := leaderelection.NewForConfig(cfg, leaderelection.Config{
		Namespace: ns, Name: election, Identity: identity, RenewDeadline: renewDeadline,
		Labels: map[string]string{"app.kubernetes.io/name": election},
	})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                              scheme,
		Metrics:                             metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:              "0",
		LeaderElection:                      true,
		LeaderElectionID:                    election,
		LeaderElectionNamespace:             ns,
		LeaderElectionResourceLockInterface: lk,
		LeaderElectionReleaseOnCancel:       true,
		LeaseDuration:                       ptr.To(leaseDuration),
		RenewDeadline:                       ptr.To(renewDeadline),
		RetryPeriod:                         ptr.To(retryPeriod),
	})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := lock.New(cfg, lock.Config{Namespace: ns, Name: job, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	op := &operator{lock: lk, terms: make(chan *leaderelection.Term, 1), jobs: make(chan int64, 1),
		errs: make(chan error, 1), done: make(chan error, 1)}
	// A Runnable that does not say otherwise runs only on the leader.
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if err := op.lead(ctx, ledger, jobs); err != nil && ctx.Err() == nil {
			op.errs <- err
		}
		<-ctx.Done()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	op.cancel = cancel
	go func() { op.done <- mgr.Start(ctx) }()
	t.Cleanup(func() { op.stop(t) })
	return op
}

// lead is the leader's work: fence, then act.
func (op *operator) lead(ctx context.Context, ledger fencing.Guard, jobs *lock.Client) error {
	term, err := op.lock.WaitForTerm(ctx)
	if err != nil {
		return err
	}
	op.terms <- term
	if err := ledger.Fence(term.Context(), term.FencingKey(), term.Token(), func(context.Context) error { return term.Err() }); err != nil {
		return fmt.Errorf("fenced write with token %d: %w", term.Token(), err)
	}
	g, err := jobs.Acquire(term.Context())
	if err != nil {
		return fmt.Errorf("acquiring the job lock: %w", err)
	}
	op.jobs <- g.Token()
	if err := g.Release(ctx); err != nil {
		return fmt.Errorf("releasing the job lock: %w", err)
	}
	return nil
}

func (op *operator) nextTerm(t *testing.T, timeout time.Duration) *leaderelection.Term {
	t.Helper()
	select {
	case term := <-op.terms:
		return term
	case err := <-op.errs:
		t.Fatalf("%s: %v", op.lock.Identity(), err)
	case <-time.After(timeout):
		t.Fatalf("%s did not lead within %s", op.lock.Identity(), timeout)
	}
	return nil
}

func (op *operator) nextJobToken(t *testing.T, timeout time.Duration) int64 {
	t.Helper()
	select {
	case token := <-op.jobs:
		return token
	case err := <-op.errs:
		t.Fatalf("%s: %v", op.lock.Identity(), err)
	case <-time.After(timeout):
		t.Fatalf("%s did not take the job lock within %s", op.lock.Identity(), timeout)
	}
	return 0
}

// stop cancels the manager and waits for it to return; it may be called
// again.
func (op *operator) stop(t *testing.T) {
	t.Helper()
	if op.cancel == nil {
		return
	}
	op.cancel()
	op.cancel = nil
	select {
	case err := <-op.done:
		if err != nil {
			t.Errorf("%s: manager stopped with %v", op.lock.Identity(), err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("%s: manager did not stop within 15s", op.lock.Identity())
	}
}

// leaseAndLockRecord checks that the Lease names holder with token as its
// leaseTransitions and the leader's label, and that the lock's status
// says the same.
func leaseAndLockRecord(ns, name, holder string, token int64) error {
	ctx := context.Background()
	l := &coordinationv1.Lease{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l); err != nil {
		return err
	}
	if h, tr := ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.LeaseTransitions; h != holder || tr == nil || int64(*tr) != token {
		return fmt.Errorf("lease: holder %q, leaseTransitions %v; want %q, %d", h, tr, holder, token)
	}
	if got := l.Labels["app.kubernetes.io/name"]; got != name {
		return fmt.Errorf("lease: label app.kubernetes.io/name %q, want %q (leaderelection.Config.Labels)", got, name)
	}
	lk := &locksv1alpha1.DistributedLock{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, lk); err != nil {
		return err
	}
	if lk.Status.Holder != holder || lk.Status.FencingToken != token {
		return fmt.Errorf("lock status: holder %q, fencingToken %d; want %q, %d", lk.Status.Holder, lk.Status.FencingToken, holder, token)
	}
	return nil
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "compat-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// createReadyLock creates a DistributedLock whose lease duration is the
// operator's and waits until the manager has created its Lease (Ready).
func createReadyLock(t *testing.T, ns, name string) {
	t.Helper()
	lk := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: int32(leaseDuration / time.Second)},
	}
	if err := k8sClient.Create(context.Background(), lk); err != nil {
		t.Fatalf("creating lock %s: %v", name, err)
	}
	eventually(t, 15*time.Second, func() error {
		got := &locksv1alpha1.DistributedLock{}
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(lk), got); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, locksv1alpha1.ConditionReady) {
			return fmt.Errorf("lock %s not Ready: %+v", name, got.Status.Conditions)
		}
		return nil
	})
}

// eventually polls check until it returns nil, failing t with its last
// error after timeout.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
