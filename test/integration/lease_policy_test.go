package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	fencedelection "github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// guardedNamespace is a namespace the shipped Lease guard policy applies to.
func guardedNamespace(t *testing.T) string {
	t.Helper()
	deployDefault(t)
	g := NewWithT(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "guarded-", Labels: map[string]string{leaseGuardNamespaceLabel: "on"}}}
	g.Expect(k8sClient.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

// The apiserver itself refuses the Lease writes that would break the
// fencing promise, whoever sends them; a lock user cannot untie a Lease from
// its lock either. The controller's repairs come after the fact (a grant
// in between could reuse a token), and nothing else keeps a lock user from
// stripping the token finalizer.
func TestLeaseGuardRefusesWritesThatBreakFencing(t *testing.T) {
	ns := guardedNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(5).Obj())
	user := lockUserConfig(t, ns, "mallory")
	userLeases := kubernetes.NewForConfigOrDie(user).CoordinationV1().Leases(ns)

	c, err := lock.New(user, lock.Config{Namespace: ns, Name: "billing", Identity: "mallory-1"})
	g.Expect(err).NotTo(HaveOccurred())
	var gr *lock.Grant
	eventually(t, 5*time.Second, func(g Gomega) { // the policy may take a moment to load
		gr, err = c.TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred())
	})
	g.Expect(gr.Release(ctx)).To(Succeed())
	// The apiserver enforces a policy only some moments after it is
	// created (a run of this test alone deploys it just now): wait until a
	// dry run, which changes nothing, is refused.
	eventually(t, 10*time.Second, func(g Gomega) {
		l := getLease(g, ns, "billing")
		l.Spec.LeaseTransitions = ptr.To[int32](0)
		_, err := clientset.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		g.Expect(err).To(MatchError(ContainSubstring("may never decrease")))
	})

	refused := []struct {
		name    string
		asAdmin bool
		edit    func(l *coordinationv1.Lease)
		message string
	}{
		{"a lock user lowers the token", false,
			func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To[int32](0) },
			"spec.leaseTransitions is the fencing token of DistributedLock billing and may never decrease (from 1 to 0)"},
		{"even an admin lowers the token", true,
			func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To[int32](0) },
			"may never decrease"},
		{"a holder written without a new token", false,
			func(l *coordinationv1.Lease) {
				now := metav1.NewMicroTime(time.Now())
				l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = new("rogue"), &now, &now
			},
			"DistributedLock billing is free: take it by raising spec.leaseTransitions from 1 to 2 and naming a holder in the same write"},
		{"the token finalizer stripped", false,
			func(l *coordinationv1.Lease) { l.Finalizers = nil },
			"only the frontdesk manager changes what ties Lease billing to DistributedLock billing"},
		{"the lock-uid annotation removed", false,
			func(l *coordinationv1.Lease) { delete(l.Annotations, locksv1alpha1.LockUIDAnnotation) },
			"only the frontdesk manager changes"},
		{"an owner reference added", false,
			func(l *coordinationv1.Lease) {
				l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "mine", UID: "0c0c0c0c-0000-4000-8000-000000000000"}}
			},
			"only the frontdesk manager changes"},
		{"the lock label changed", false,
			func(l *coordinationv1.Lease) { l.Labels[locksv1alpha1.LockNameLabel] = "other" },
			"only the frontdesk manager changes"},
		{"a candidates grant forged", false,
			func(l *coordinationv1.Lease) {
				if l.Annotations == nil {
					l.Annotations = map[string]string{}
				}
				l.Annotations[locksv1alpha1.CandidateGrantAnnotation] = "mallory-1"
			},
			"only the frontdesk manager changes"},
	}
	for _, tc := range refused {
		l := getLease(g, ns, "billing")
		tc.edit(l)
		leases := userLeases
		if tc.asAdmin {
			leases = clientset.CoordinationV1().Leases(ns)
		}
		_, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		g.Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%s: want refused, got %v", tc.name, err)
		g.Expect(err).To(MatchError(ContainSubstring(tc.message)), tc.name)
	}
	final := getLease(g, ns, "billing")
	g.Expect(ptr.Deref(final.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(1))
	g.Expect(final.Finalizers).To(ContainElement(locksv1alpha1.LeaseTokenFinalizer))

	// A lock user may not create a Lease that passes for a lock's either.
	_, err = userLeases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "forged",
		Labels: map[string]string{locksv1alpha1.LockNameLabel: "billing"}}}, metav1.CreateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want refused, got %v", err)
}

// What the guard must let through: grants, renewals, releases and breaks
// by lock users, the manager's own lifecycle (create, adopt, retire), and
// client-go leader election, which raises the token on every change of
// leader and leaves metadata alone.
func TestLeaseGuardAllowsLocksAndClientGoLeaderElection(t *testing.T) {
	ns := guardedNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	user := lockUserConfig(t, ns, "alice")

	c, err := lock.New(user, lock.Config{Namespace: ns, Name: "billing", Identity: "alice-1", RenewInterval: 200 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	var gr *lock.Grant
	eventually(t, 5*time.Second, func(g Gomega) {
		gr, err = c.TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred())
	})
	first := getLease(g, ns, "billing").Spec.RenewTime
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLease(g, ns, "billing").Spec.RenewTime.Time.After(first.Time)).To(BeTrue(), "renewals land")
	})
	g.Expect(gr.Release(ctx)).To(Succeed())
	// A break needs the verb, even of a free lock (it burns a token).
	_, err = c.Break(ctx)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a lock user breaks a free lock: %v", err)
	admin, err := lock.New(lockAdminConfig(t, ns, "oncall"), lock.Config{Namespace: ns, Name: "billing", Identity: "oncall"})
	g.Expect(err).NotTo(HaveOccurred())
	res, err := admin.Break(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Token).To(Equal(gr.Token() + 1))

	// Two stock client-go leader electors, as the lock user, take turns.
	leaders := make(chan string, 8)
	var wg sync.WaitGroup
	elect := func(ctx context.Context, id string) {
		defer wg.Done()
		// client-go's own LeaseLock where config/mutating binds its grants
		// to its principal, else pkg/leaderelection's Lock, which does.
		var lk resourcelock.Interface = &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: "billing"},
			Client:     kubernetes.NewForConfigOrDie(user).CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		}
		if !servesMutatingPolicies() {
			var err error
			if lk, err = fencedelection.NewForConfig(user, fencedelection.Config{Namespace: ns, Name: "billing", Identity: id}); err != nil {
				t.Error(err)
				return
			}
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:          lk,
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { leaders <- id },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			t.Error(err)
			return
		}
		le.Run(ctx)
	}
	ctxA, stopA := context.WithCancel(ctx)
	wg.Add(1)
	go elect(ctxA, "le-a")
	g.Eventually(leaders).WithTimeout(5 * time.Second).Should(Receive(Equal("le-a")))
	tokenA := ptr.Deref(getLease(g, ns, "billing").Spec.LeaseTransitions, 0)
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	wg.Add(1)
	go elect(ctxB, "le-b")
	stopA() // released on cancel; b takes over with the next token
	g.Eventually(leaders).WithTimeout(8 * time.Second).Should(Receive(Equal("le-b")))
	g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.LeaseTransitions, 0)).To(Equal(tokenA + 1))
	eventually(t, 3*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "billing")
		g.Expect(lk.Status.Holder).To(Equal("le-b"))
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(tokenA + 1))
	})
	stopB()
	wg.Wait()

	// The manager retires the Lease when the lock goes: allowed.
	deleteLockAndWait(t, ns, "billing", 10*time.Second)
	expectRetiredRecord(g, ns, "billing", "billing", int64(tokenA+1))
}

// Every lock says whether the lease guard applies to it (condition
// Guarded): True in a namespace the suite's bindings select, False with
// what is missing elsewhere; and it follows a binding that comes or goes.
func TestLocksSayWhetherTheLeaseGuardApplies(t *testing.T) {
	guarded := guardedNamespace(t)
	bare := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", guarded).Obj())
	createReadyLock(t, testutil.MakeLock("billing", bare).Obj())
	condition := func(g Gomega, ns string) *metav1.Condition {
		c := meta.FindStatusCondition(getLock(g, ns, "billing").Status.Conditions, locksv1alpha1.ConditionGuarded)
		g.Expect(c).NotTo(BeNil(), "no Guarded condition in %s", ns)
		return c
	}
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(condition(g, guarded).Status).To(Equal(metav1.ConditionTrue))
		c := condition(g, bare)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(locksv1alpha1.ReasonLeaseGuardMissing))
		g.Expect(c.Message).To(ContainSubstring("no binding of it with validationActions Deny applies to namespace " + bare))
	})
	// Labelled like the guarded namespaces, the bare one is guarded too.
	ns := &corev1.Namespace{}
	g := NewWithT(t)
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Name: bare}, ns)).To(Succeed())
	ns.Labels[leaseGuardNamespaceLabel] = "on"
	g.Expect(k8sClient.Update(context.Background(), ns)).To(Succeed())
	// A namespace's labels wake no lock: the next pass of the lock (here,
	// a grant) reads them.
	_, err := harness.Grant(context.Background(), clientset, bare, "billing", "someone")
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(condition(g, bare).Status).To(Equal(metav1.ConditionTrue))
	})
}
