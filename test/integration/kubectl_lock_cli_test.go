package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manager"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

// pluginEnv runs kubectl-dlock against kubeconfig with extra environment
// variables (and without a $LOCK_IDENTITY the test run may have).
func pluginEnv(t *testing.T, kubeconfig, namespace string, env []string, args ...string) pluginRun {
	t.Helper()
	cmd := exec.Command(kubectlLock(t), append([]string{"--kubeconfig", kubeconfig, "-n", namespace}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LOCK_IDENTITY=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return pluginRun{code: exitCode(t, err), stdout: out.String(), stderr: errOut.String()}
}

// leaseSpec is the Lease's spec, to compare before and after a command that
// must not write.
func leaseSpec(g Gomega, namespace, name string) coordinationv1.LeaseSpec {
	return getLease(g, namespace, name).Spec
}

// A flag that cannot be honoured fails the command before it takes the lock
// (`acquire -o xml` must not take the lock and then fail on the format,
// leaving it held under an identity nobody saw). And when the grant cannot
// be printed (stdout closed), it is released again.
func TestKubectlLockAcquireChecksFlagsBeforeTakingTheLock(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	before := leaseSpec(g, ns, "billing")
	g.Expect(before.HolderIdentity).To(BeNil())

	r := runPlugin(t, ns, "acquire", "billing", "-o", "xml")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring(`unknown output format "xml": use json or yaml`))
	g.Expect(leaseSpec(g, ns, "billing")).To(Equal(before), "acquire -o xml must not touch the Lease")

	r = runPlugin(t, ns, "acquire", "billing", "--wait", "-5s")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring("--wait -5s is negative"))
	g.Expect(leaseSpec(g, ns, "billing")).To(Equal(before), "acquire --wait -5s must not touch the Lease")

	r = runPlugin(t, ns, "get", "billing", "-o", "xml")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring(`unknown output format "xml": use json, yaml or wide`))

	// stdout is a pipe nobody reads: the grant cannot be printed.
	rd, wr, err := os.Pipe()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rd.Close()).To(Succeed())
	cmd := pluginCommand(t, ns, "acquire", "billing", "--identity", "unseen")
	var errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = wr, &errOut
	runErr := cmd.Run()
	_ = wr.Close()
	g.Expect(exitCode(t, runErr)).To(Equal(1), errOut.String())
	g.Expect(errOut.String()).To(ContainSubstring("printing the grant of " + ns + "/billing failed, so it was released again"))
	after := leaseSpec(g, ns, "billing")
	g.Expect(after.HolderIdentity).To(BeNil(), "the grant nobody saw must be released")
	g.Expect(ptr.Deref(after.LeaseTransitions, 0)).To(BeEquivalentTo(1), "it was granted (token 1), then released")
}

func TestKubectlLockReleaseUsesLockIdentity(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)

	r := pluginEnv(t, kubeconfigPath, ns, []string{"LOCK_IDENTITY=alice"}, "acquire", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring("as alice with fencing token 1"))

	r = pluginEnv(t, kubeconfigPath, ns, []string{"LOCK_IDENTITY=bob"}, "release", "billing")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring("held by alice, not bob; nothing released"))
	g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.HolderIdentity, "")).To(Equal("alice"))

	r = pluginEnv(t, kubeconfigPath, ns, []string{"LOCK_IDENTITY=alice"}, "release", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring("released " + ns + "/billing (was held by alice)"))
	g.Expect(getLease(g, ns, "billing").Spec.HolderIdentity).To(BeNil())

	// --identity wins over $LOCK_IDENTITY.
	r = pluginEnv(t, kubeconfigPath, ns, []string{"LOCK_IDENTITY=carol"}, "acquire", "billing", "--identity", "dave")
	g.Expect(r.code).To(Equal(0), r.stderr)
	r = pluginEnv(t, kubeconfigPath, ns, []string{"LOCK_IDENTITY=carol"}, "release", "billing", "--identity", "dave")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(getLease(g, ns, "billing").Spec.HolderIdentity).To(BeNil())

	r = pluginEnv(t, kubeconfigPath, ns, nil, "release", "billing")
	g.Expect(r.code).To(Equal(1))
	g.Expect(r.stderr).To(ContainSubstring("--identity is required (or set $LOCK_IDENTITY)"))
}

func TestKubectlLockGetInEmptyNamespaceSaysSo(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	r := runPlugin(t, ns, "get")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(BeEmpty(), "no header without locks")
	g.Expect(r.stderr).To(Equal("No locks found in namespace " + ns + ".\n"))
}

func TestKubectlLockHelpNamesKubectlLock(t *testing.T) {
	g := NewWithT(t)
	for _, args := range [][]string{{"--help"}, {"get", "--help"}, {"describe", "--help"}, {"acquire", "--help"},
		{"release", "--help"}, {"break", "--help"}} {
		r := runPlugin(t, "default", args...)
		g.Expect(r.code).To(Equal(0), r.stderr)
		g.Expect(r.stdout).NotTo(ContainSubstring("kubectl-dlock"), "help for %v", args)
		usage := "kubectl dlock"
		if len(args) == 2 {
			usage += " " + args[0]
		}
		g.Expect(r.stdout).To(ContainSubstring("Usage:\n  "+usage+" "), "help for %v", args)
	}
}

// Events are those of this lock, by UID: a lock deleted and created again
// under the same name does not show its predecessor's history.
func TestKubectlLockDescribeShowsOnlyThisLocksEvents(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	r := runPlugin(t, ns, "acquire", "billing", "--identity", "alice")
	g.Expect(r.code).To(Equal(0), r.stderr)
	eventually(t, 10*time.Second, func(g Gomega) {
		r := runPlugin(t, ns, "describe", "billing")
		g.Expect(r.code).To(Equal(0), r.stderr)
		g.Expect(r.stdout).To(MatchRegexp(`Acquired\s+.*alice acquired the lock`))
	})
	r = runPlugin(t, ns, "release", "billing", "--identity", "alice")
	g.Expect(r.code).To(Equal(0), r.stderr)

	old := getLock(g, ns, "billing")
	g.Expect(k8sClient.Delete(context.Background(), old)).To(Succeed())
	eventually(t, 30*time.Second, func(g Gomega) {
		err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "billing"}, &locksv1alpha1.DistributedLock{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "lock still there: %v", err)
	})
	recreated := createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g.Expect(recreated.UID).NotTo(Equal(old.UID))

	r = runPlugin(t, ns, "acquire", "billing", "--identity", "bob")
	g.Expect(r.code).To(Equal(0), r.stderr)
	eventually(t, 10*time.Second, func(g Gomega) {
		r := runPlugin(t, ns, "describe", "billing")
		g.Expect(r.code).To(Equal(0), r.stderr)
		g.Expect(r.stdout).To(MatchRegexp(`Acquired\s+.*bob acquired the lock`))
	})
	// The old lock's events are still stored under the same name...
	var evs corev1.EventList
	g.Expect(k8sClient.List(context.Background(), &evs, client.InNamespace(ns))).To(Succeed())
	var oldEvents int
	for _, ev := range evs.Items {
		if ev.InvolvedObject.UID == old.UID {
			oldEvents++
		}
	}
	g.Expect(oldEvents).To(BeNumerically(">", 0), "the deleted lock's events should still exist for this test to mean anything")
	// ...and describe does not show them.
	r = runPlugin(t, ns, "describe", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).NotTo(ContainSubstring("alice"), "describe shows the deleted lock's history:\n%s", r.stdout)
	g.Expect(r.stdout).To(MatchRegexp(`\nUID:\s+` + string(recreated.UID) + `\n`))
	_ = runPlugin(t, ns, "release", "billing", "--identity", "bob")
}

// secondControlPlane is a control plane of a test's own, whose manager the
// test starts and stops (the suite's manager must keep running for the
// other tests).
type secondControlPlane struct {
	t          *testing.T
	kubeconfig string
	client     client.Client
	cp         *controlplane.ControlPlane
}

func startSecondControlPlane(t *testing.T) *secondControlPlane {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cp, err := controlplane.Start(controlplane.Options{KubeconfigPath: kubeconfig})
	if err != nil {
		t.Fatalf("starting a second control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the second control plane: %v", err)
		}
	})
	c, err := client.New(cp.Config, client.Options{Scheme: manager.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return &secondControlPlane{t: t, kubeconfig: kubeconfig, client: c, cp: cp}
}

// startManager runs a frontdesk manager against the control plane until the
// returned stop is called (stop waits until it has stopped).
func (s *secondControlPlane) startManager() (stop func()) {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := manager.DefaultOptions()
	opts.MetricsBindAddress, opts.HealthProbeBindAddress = "0", "0"
	opts.AllowSeveralInProcess = true
	opts.GracefulShutdownTimeout = 5 * time.Second
	mgr, err := manager.New(ctx, s.cp.Config, opts)
	if err != nil {
		cancel()
		s.t.Fatalf("starting a manager: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			s.t.Errorf("manager: %v", err)
		}
	}
	s.t.Cleanup(stop)
	return stop
}

func (s *secondControlPlane) plugin(namespace string, args ...string) pluginRun {
	s.t.Helper()
	return pluginEnv(s.t, s.kubeconfig, namespace, nil, args...)
}

// While the manager is down the lock's status freezes. get and describe
// read holder and token from the Lease, show the controller's frozen view
// next to it, and say plainly that the status is stale; a missing,
// deleting, foreign or malformed Lease is reported, not a panic.
func TestKubectlLockGetShowsLeaseWhenStatusIsStale(t *testing.T) {
	s := startSecondControlPlane(t)
	g := NewWithT(t)
	ctx := context.Background()
	stopManager := s.startManager()

	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "dlock-stale-"}}
	g.Expect(s.client.Create(ctx, nsObj)).To(Succeed())
	ns := nsObj.Name
	g.Expect(s.client.Create(ctx, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())).To(Succeed())
	lockKey := client.ObjectKey{Namespace: ns, Name: "billing"}

	r := s.plugin(ns, "acquire", "billing", "--identity", "alice", "--wait", "20s")
	g.Expect(r.code).To(Equal(0), r.stderr)
	eventually(t, 10*time.Second, func(g Gomega) {
		r := s.plugin(ns, "get")
		g.Expect(r.code).To(Equal(0), r.stderr)
		g.Expect(r.stdout).To(MatchRegexp(`NAME\s+HOLDER\s+TOKEN\s+HELD\s+WAITING\s+DURATION\s+STATUS\s+AGE\n`))
		g.Expect(r.stdout).To(MatchRegexp(`billing\s+alice\s+1\s+True\s+0\s+30s\s+InSync\s`))
		g.Expect(withoutGuardWarnings(r.stderr)).To(BeEmpty())
	})

	// The manager goes down; grants go on.
	stopManager()
	for _, step := range [][]string{
		{"release", "billing", "--identity", "alice"},
		{"acquire", "billing", "--identity", "bob"},
		{"release", "billing", "--identity", "bob"},
		{"acquire", "billing", "--identity", "carol"},
	} {
		r := s.plugin(ns, step...)
		g.Expect(r.code).To(Equal(0), "%v: %s", step, r.stderr)
	}
	lease := &coordinationv1.Lease{}
	g.Expect(s.client.Get(ctx, lockKey, lease)).To(Succeed())
	g.Expect(ptr.Deref(lease.Spec.HolderIdentity, "")).To(Equal("carol"))
	g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(3))
	lock := &locksv1alpha1.DistributedLock{}
	g.Expect(s.client.Get(ctx, lockKey, lock)).To(Succeed())
	g.Expect(lock.Status.Holder).To(Equal("alice"), "the status froze with the manager")
	g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(1))

	staleLine := "warning: lock billing: status stale: the controller has not recorded token 3 yet (its status shows token 1, holder alice); is the frontdesk manager running?\n"
	r = s.plugin(ns, "get")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`billing\s+carol\s+3\s+Unknown\s+0\s+30s\s+Stale\s`))
	g.Expect(r.stderr).To(Equal(staleLine))

	r = s.plugin(ns, "get", "billing", "-o", "wide")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`RENEWED\n`))
	g.Expect(r.stdout).To(MatchRegexp(`billing\s+carol\s+3\s+Unknown\s+.*Stale\s+\S+\s+billing\s+True\s+` +
		regexp.QuoteMeta(lease.Spec.RenewTime.UTC().Format(time.RFC3339))))

	r = s.plugin(ns, "get", "billing", "-o", "json")
	g.Expect(r.code).To(Equal(0), r.stderr)
	var stored locksv1alpha1.DistributedLock
	g.Expect(json.Unmarshal([]byte(r.stdout), &stored)).To(Succeed(), "stdout stays the object: %s", r.stdout)
	g.Expect(stored.Status.FencingToken).To(BeEquivalentTo(1))
	g.Expect(r.stderr).To(Equal(staleLine))

	r = s.plugin(ns, "describe", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`\nHolder:\s+carol \(from the Lease\)\n`))
	g.Expect(r.stdout).To(MatchRegexp(`\nFencing token:\s+3 \(from the Lease\)\n`))
	g.Expect(r.stdout).To(MatchRegexp(`\nHeld:\s+Unknown\n`))
	g.Expect(r.stdout).To(MatchRegexp(`\nLease duration:\s+30s: a holder that stops renewing lapses this long after its last renewal`))
	g.Expect(strings.Count(r.stdout, "Lease duration:")).To(Equal(1), "the lease duration once:\n%s", r.stdout)
	g.Expect(r.stdout).To(ContainSubstring("the controller has not observed this grant yet, so whether it is still live is unknown here"))
	g.Expect(r.stdout).To(MatchRegexp(`\nStatus:\s+Stale\n\s+status stale: the controller has not recorded token 3 yet`))
	g.Expect(r.stdout).To(MatchRegexp(`Controller's status:\n\s+Holder:\s+alice\n\s+Fencing token:\s+1\n\s+Held:\s+True\n`))

	// The manager comes back and catches up: no more warning.
	stopManager = s.startManager()
	eventually(t, 20*time.Second, func(g Gomega) {
		r := s.plugin(ns, "get")
		g.Expect(r.code).To(Equal(0), r.stderr)
		g.Expect(r.stdout).To(MatchRegexp(`billing\s+carol\s+3\s+True\s+0\s+30s\s+InSync\s`))
		g.Expect(withoutGuardWarnings(r.stderr)).To(BeEmpty())
	})
	stopManager()

	// The Lease is deleted: its finalizer keeps it, as the record, until the
	// controller has seen it go.
	g.Expect(s.client.Get(ctx, lockKey, lease)).To(Succeed())
	g.Expect(s.client.Delete(ctx, lease)).To(Succeed())
	r = s.plugin(ns, "get")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`billing\s+carol\s+3\s+True\s+.*LeaseDeleting\s`))
	g.Expect(r.stderr).To(ContainSubstring("warning: lock billing: Lease billing is being deleted; the controller recreates it with its fencing token preserved"))

	// Gone for good (finalizer removed by hand).
	g.Expect(s.client.Get(ctx, lockKey, lease)).To(Succeed())
	lease.Finalizers = nil
	g.Expect(s.client.Update(ctx, lease)).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(apierrors.IsNotFound(s.client.Get(ctx, lockKey, &coordinationv1.Lease{}))).To(BeTrue())
	})
	for _, args := range [][]string{{"get"}, {"describe", "billing"}} {
		r = s.plugin(ns, args...)
		g.Expect(r.code).To(Equal(0), "%v: %s", args, r.stderr)
		g.Expect(r.stdout + r.stderr).To(ContainSubstring("Lease billing not found; the frontdesk controller creates it: is the frontdesk manager running? (showing the controller's last status)"))
	}
	g.Expect(s.plugin(ns, "get").stdout).To(MatchRegexp(`billing\s+carol\s+3\s+True\s+<unknown>\s+.*LeaseMissing\s`))

	// A Lease written by hand: a holder and no token.
	g.Expect(s.client.Get(ctx, lockKey, lock)).To(Succeed())
	forged := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns,
			Annotations: map[string]string{locksv1alpha1.LockUIDAnnotation: string(lock.UID)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("mallory")},
	}
	g.Expect(s.client.Create(ctx, forged)).To(Succeed())
	r = s.plugin(ns, "get")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`billing\s+mallory\s+0\s+.*LeaseMalformed\s`))
	g.Expect(r.stderr).To(ContainSubstring("Lease billing names holder mallory but has no spec.leaseTransitions, so no fencing token"))
	r = s.plugin(ns, "describe", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring("no spec.leaseTransitions"))

	// A Lease of that name that another object controls is not this lock's.
	g.Expect(s.client.Get(ctx, lockKey, forged)).To(Succeed())
	forged.Annotations = nil
	forged.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "elsewhere",
		UID: "0c0c0c0c-0000-4000-8000-000000000000", Controller: new(true)}}
	g.Expect(s.client.Update(ctx, forged)).To(Succeed())
	r = s.plugin(ns, "get")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`billing\s+carol\s+3\s+.*LeaseNotOwned\s`), "holder and token from the status, not the foreign Lease")
	g.Expect(r.stderr).To(ContainSubstring("Lease billing is not this lock's: it is controlled by ConfigMap elsewhere"))
	r = s.plugin(ns, "describe", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`\nHolder:\s+carol \(from the controller's status: the Lease cannot be used\)\n`))
}
