package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// These tests are adversarial interleavings of the lock lifecycle: each
// is one that could hand a token out twice, let a candidate act alongside
// the next, or leave a Lease or namespace stuck.

// refuseLeaseCreate makes the apiserver refuse to create the named Lease
// (it stands in for a controller that crashed between two passes, or an
// apiserver it could not reach) until the returned func is called.
func refuseLeaseCreate(t *testing.T, ns, name string) func() {
	t.Helper()
	rule := admissionregistrationv1.Rule{APIGroups: []string{"coordination.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"leases"}}
	return refuse(t, "refuse-create-"+ns, admissionregistrationv1.Create, rule,
		"object.metadata.name != '"+name+"' || object.metadata.namespace != '"+ns+"'",
		func(ctx context.Context) error { // a dry run, which changes nothing
			return k8sClient.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, client.DryRunAll)
		})
}

// refuseStatusUpdates makes the apiserver refuse every status write of the
// named lock (the controller's pass then fails after its Lease writes, as
// when it loses a status write race) until the returned func is called.
func refuseStatusUpdates(t *testing.T, ns, name string) func() {
	t.Helper()
	rule := admissionregistrationv1.Rule{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, APIVersions: []string{locksv1alpha1.GroupVersion.Version},
		Resources: []string{"distributedlocks/status"}}
	return refuse(t, "refuse-status-"+ns, admissionregistrationv1.Update, rule,
		"object.metadata.name != '"+name+"' || object.metadata.namespace != '"+ns+"'",
		func(ctx context.Context) error { // a dry run, which changes nothing
			lk := &locksv1alpha1.DistributedLock{}
			if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, lk); err != nil {
				return err
			}
			return k8sClient.Status().Update(ctx, lk, client.DryRunAll)
		})
}

// refuse installs a ValidatingAdmissionPolicy that denies op on rule's
// resources unless expression holds, waits until probe is refused (the
// apiserver picks policies up asynchronously), and returns the func that
// removes it.
func refuse(t *testing.T, policyName string, op admissionregistrationv1.OperationType, rule admissionregistrationv1.Rule, expression string,
	probe func(context.Context) error) func() {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	fail := admissionregistrationv1.Fail
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{op}, Rule: rule},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: expression, Message: "test: " + policyName}},
		},
	}
	g.Expect(k8sClient.Create(ctx, policy)).To(Succeed())
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policyName},
		Spec:       admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policyName, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	g.Expect(k8sClient.Create(ctx, binding)).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) {
		err := probe(ctx)
		g.Expect(apierrors.IsInvalid(err) || apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
	})
	return func() {
		g.Expect(k8sClient.Delete(ctx, binding)).To(Succeed())
		g.Expect(k8sClient.Delete(ctx, policy)).To(Succeed())
	}
}

// grantAndRelease takes and gives back the lock n times.
func grantAndRelease(t *testing.T, c *lock.Client, n int) int64 {
	t.Helper()
	g := NewWithT(t)
	var last int64
	for range n {
		gr, err := c.TryAcquire(context.Background())
		g.Expect(err).NotTo(HaveOccurred())
		last = gr.Token()
		g.Expect(gr.Release(context.Background())).To(Succeed())
	}
	return last
}

// The Lease is gone (deleted, its finalizer released) and cannot be
// recreated when the lock is deleted: the lock waits until it can leave a
// record behind, and the next lock of its name continues from it (were it
// to go at once, the next one would start again at token 1).
func TestLockDeletedWhileItsLeaseIsGoneKeepsItsTokens(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	last := grantAndRelease(t, newLockClient(t, ns, "billing", "worker"), 3)
	eventually(t, 3*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(Equal(last)) })

	allow := refuseLeaseCreate(t, ns, "billing")
	g.Expect(k8sClient.Delete(ctx, getLease(g, ns, "billing"))).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "billing"}, &coordinationv1.Lease{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "lease still there: %v", err)
	})
	g.Expect(k8sClient.Delete(ctx, getLock(g, ns, "billing"))).To(Succeed())
	NewWithT(t).Consistently(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "billing"}, &locksv1alpha1.DistributedLock{})).To(Succeed())
	}).WithTimeout(2*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "the lock went without leaving its tokens behind")
	allow()
	eventually(t, 30*time.Second, func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "billing"}, &locksv1alpha1.DistributedLock{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	})
	expectRetiredRecord(g, ns, "billing", "billing", last)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	gr, err := newLockClient(t, ns, "billing", "worker-2").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gr.Token()).To(Equal(last + 1))
}

// `kubectl delete lease,distributedlock billing`: the Lease first, the lock
// right after, with nothing injected. Tokens never start over.
func TestDeletingTheLeaseThenTheLockKeepsTokens(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	for round := range 4 {
		ns := newNamespace(t)
		createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(1).Obj())
		last := grantAndRelease(t, newLockClient(t, ns, "billing", "worker"), 3)
		eventually(t, 3*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(Equal(last)) })
		g.Expect(k8sClient.Delete(ctx, getLease(g, ns, "billing"))).To(Succeed())
		time.Sleep(time.Duration(round) * 5 * time.Millisecond) // the race window, not an assertion
		deleteLockAndWait(t, ns, "billing", 15*time.Second)
		createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(1).Obj())
		gr, err := newLockClient(t, ns, "billing", "worker-2").TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(gr.Token()).To(Equal(last+1), "round %d: a token was granted again", round)
	}
}

// A Lease wound back while the manager is down, then the lock deleted: the
// retirement raises the record to the recorded token first, and a
// long-lived client that saw the higher token never grants below it.
func TestWoundBackLeaseIsRetiredAtTheRecordedToken(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	c := newLockClient(t, ns, "billing", "worker")
	last := grantAndRelease(t, c, 5)
	eventually(t, 3*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(Equal(last)) })

	g.Expect(stopRunningManager()).To(Succeed())
	wound := getLease(g, ns, "billing")
	wound.Spec.LeaseTransitions = ptr.To[int32](2)
	g.Expect(k8sClient.Update(ctx, wound)).To(Succeed())
	g.Expect(k8sClient.Delete(ctx, getLock(g, ns, "billing"))).To(Succeed())
	g.Expect(startManager()).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "billing"}, &locksv1alpha1.DistributedLock{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	})
	expectRetiredRecord(g, ns, "billing", "billing", last)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	gr, err := c.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gr.Token()).To(Equal(last + 1))
}

// The lock's finalizer removed by hand (a "stuck" deletion forced), with
// the manager down: its Lease still names the dead lock. A new lock of the
// same name takes it over (two locks of one name cannot exist at once, so
// the old one is gone) and continues its tokens.
func TestLockFinalizerRemovedByHandLeavesTheNameUsable(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	last := grantAndRelease(t, newLockClient(t, ns, "billing", "w"), 2)
	eventually(t, 3*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(Equal(last)) })
	withManagerStopped(t)
	g.Expect(k8sClient.Delete(ctx, getLock(g, ns, "billing"))).To(Succeed())
	forced := getLock(g, ns, "billing")
	forced.Finalizers = nil
	g.Expect(k8sClient.Update(ctx, forced)).To(Succeed())
	g.Expect(startManager()).To(Succeed())
	defer func() { g.Expect(stopRunningManager()).To(Succeed()) }() // withManagerStopped starts it again

	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	gr, err := newLockClient(t, ns, "billing", "w2").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gr.Token()).To(Equal(last + 1))
}

// A lock deleted right after it was created: the pass that finalizes it
// may not see in its cache the Lease the pass before created. The Lease
// must not be left tied to the deleted lock.
func TestLockDeletedRightAfterCreationLeavesNoTiedLease(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	for round := range 12 {
		ns := newNamespace(t)
		lk := testutil.MakeLock("billing", ns).LeaseDuration(2).Obj()
		g.Expect(k8sClient.Create(ctx, lk)).To(Succeed())
		time.Sleep(time.Duration(round%6) * 3 * time.Millisecond) // the race window, not an assertion
		g.Expect(k8sClient.Delete(ctx, lk)).To(Succeed())
		eventually(t, 10*time.Second, func(g Gomega) {
			err := k8sClient.Get(ctx, client.ObjectKeyFromObject(lk), &locksv1alpha1.DistributedLock{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
		})
		l := &coordinationv1.Lease{}
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "billing"}, l)
		if apierrors.IsNotFound(err) {
			continue
		}
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Annotations).NotTo(HaveKey(locksv1alpha1.LockUIDAnnotation), "round %d: the Lease is still tied to the deleted lock", round)
	}
}

// A Lease created by an earlier frontdesk version: tied by an owner
// reference, no origin annotation. It is taken as frontdesk's own (the
// cautious direction): moved to the annotation, and on deletion kept as a
// record after its live holder lapses, never handed back without its
// finalizer.
func TestLeaseFromAnEarlierVersionIsKeptAsARecord(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	withManagerStopped(t)
	lk := testutil.MakeLock("billing", ns).LeaseDuration(3).Obj()
	g.Expect(k8sClient.Create(ctx, lk)).To(Succeed())
	legacy := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns,
			Labels:     map[string]string{locksv1alpha1.LockNameLabel: "billing"},
			Finalizers: []string{locksv1alpha1.LeaseTokenFinalizer},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "DistributedLock",
				Name: "billing", UID: lk.UID, Controller: new(true), BlockOwnerDeletion: new(true)}}},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](3), LeaseTransitions: ptr.To[int32](4)},
	}
	g.Expect(k8sClient.Create(ctx, legacy)).To(Succeed())
	g.Expect(startManager()).To(Succeed())
	defer func() { g.Expect(stopRunningManager()).To(Succeed()) }()
	eventually(t, 5*time.Second, func(g Gomega) {
		l := getLease(g, ns, "billing")
		g.Expect(l.Annotations).To(HaveKeyWithValue(locksv1alpha1.LockUIDAnnotation, string(lk.UID)))
		g.Expect(l.Annotations).To(HaveKeyWithValue(locksv1alpha1.LeaseOriginAnnotation, locksv1alpha1.LeaseOriginCreated))
		g.Expect(l.OwnerReferences).To(BeEmpty())
	})
	gr, err := newLockClient(t, ns, "billing", "holder").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gr.Token()).To(BeEquivalentTo(5))
	deleteLockAndWait(t, ns, "billing", 15*time.Second)
	g.Expect(gr.Err()).To(MatchError(lock.ErrLost), "the lock went while its holder believed it held it")
	expectRetiredRecord(g, ns, "billing", "billing", 5)
}

// Deleting a candidates-mode lock removes the holder pod's marks before
// the grant is revoked, and a lock created again at once does not grant the
// next pod until the hand-off delay has passed since then.
func TestDeletingACandidatesLockUnmarksFirstAndWaits(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "c-0", web, true)
	createPod(t, ns, "c-1", web, true)
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(3).Candidates(web).Obj())
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(getPod(g, ns, "c-0").Labels).To(HaveKey(locksv1alpha1.HolderLabelKey("leader")))
	})
	g.Expect(k8sClient.Delete(ctx, getLock(g, ns, "leader"))).To(Succeed())
	setReady(t, c0, false) // so the next lock grants c-1
	var unmarkedAt time.Time
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getPod(g, ns, "c-0").Labels).NotTo(HaveKey(locksv1alpha1.HolderLabelKey("leader")))
		unmarkedAt = time.Now()
	})
	eventually(t, 10*time.Second, func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "leader"}, &locksv1alpha1.DistributedLock{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	})
	g.Expect(k8sClient.Create(ctx, testutil.MakeLock("leader", ns).LeaseDuration(3).Candidates(web).Obj())).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("c-1")) })
	granted := getLease(g, ns, "leader").Spec.AcquireTime.Time
	g.Expect(granted.Sub(unmarkedAt)).To(BeNumerically(">=", 3*time.Second-100*time.Millisecond),
		"c-1 granted %s after c-0 was unmarked; the hand-off delay is 3s", granted.Sub(unmarkedAt))
}

// A revoked candidate grant whose Lease is deleted: the Lease goes only
// once the hand-off delay has passed, so the recreated Lease is not granted
// early.
func TestDeletedLeaseOfARevokedCandidateStillWaitsTheHandOff(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "c-0", web, true)
	createPod(t, ns, "c-1", web, true)
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(4).Candidates(web).Obj())
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("c-0")) })
	setReady(t, c0, false)
	eventually(t, 3*time.Second, func(g Gomega) { g.Expect(heldReason(getLock(g, ns, "leader"))).To(Equal(locksv1alpha1.ReasonRevoked)) })
	revokedAt := getLease(g, ns, "leader").Spec.RenewTime.Time
	g.Expect(k8sClient.Delete(ctx, getLease(g, ns, "leader"))).To(Succeed())
	eventually(t, 15*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("c-1")) })
	g.Expect(getLease(g, ns, "leader").Spec.AcquireTime.Time.Sub(revokedAt)).To(BeNumerically(">=", 4*time.Second))
}

// A candidates grant cleared by someone else (a lock user releasing as the
// pod) is waited out like a revocation; turning candidates mode off revokes
// the grant and then releases it.
func TestCandidateGrantsEndOnlyThroughTheHandOff(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	web := map[string]string{"app": "web"}
	createPod(t, ns, "c-0", web, true)
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(3).Candidates(web).Obj())
	var holder string
	eventually(t, 5*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.HolderPod).To(Equal("c-0"))
		holder = lk.Status.Holder
	})
	before := ptr.Deref(getLease(g, ns, "leader").Spec.LeaseTransitions, 0)
	cleared := time.Now()
	g.Expect(harness.Release(ctx, clientset, ns, "leader", holder)).To(Succeed())
	var regranted *coordinationv1.Lease
	eventually(t, 8*time.Second, func(g Gomega) {
		regranted = getLease(g, ns, "leader")
		g.Expect(ptr.Deref(regranted.Spec.LeaseTransitions, 0)).To(BeNumerically(">", before))
		g.Expect(regranted.Spec.AcquireTime).NotTo(BeNil())
	})
	g.Expect(regranted.Spec.AcquireTime.Time.Sub(cleared)).To(BeNumerically(">=", 3*time.Second-100*time.Millisecond),
		"a grant cleared by hand was granted again before the hand-off delay")

	// Candidates mode off: the grant is revoked (marks off at once), then
	// released after the delay.
	lk := getLock(g, ns, "leader")
	patch := client.MergeFrom(lk.DeepCopy()) // no resourceVersion: the controller writes status meanwhile
	lk.Spec.Candidates = nil
	g.Expect(k8sClient.Patch(ctx, lk, patch)).To(Succeed())
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getPod(g, ns, "c-0").Labels).NotTo(HaveKey(locksv1alpha1.HolderLabelKey("leader")))
		g.Expect(heldReason(getLock(g, ns, "leader"))).To(Equal(locksv1alpha1.ReasonRevoked))
	})
	eventually(t, 8*time.Second, func(g Gomega) {
		l := getLease(g, ns, "leader")
		g.Expect(l.Spec.HolderIdentity).To(BeNil())
		g.Expect(l.Annotations).NotTo(HaveKey(locksv1alpha1.CandidateGrantAnnotation))
	})
}

// A namespace being deleted is not held up by the records of its locks:
// the Leases of its locks are released rather than kept, and a record whose
// lock was deleted earlier lets go when the namespace controller deletes it.
// (envtest runs no namespace controller: the test deletes what it would.)
func TestNamespaceDeletionIsNotHeldUpByRecords(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("old", ns).LeaseDuration(1).Obj())
	grantAndRelease(t, newLockClient(t, ns, "old", "w"), 1)
	deleteLockAndWait(t, ns, "old", 10*time.Second) // leaves a record
	createReadyLock(t, testutil.MakeLock("live", ns).LeaseDuration(1).Obj())
	grantAndRelease(t, newLockClient(t, ns, "live", "w"), 1)

	g.Expect(k8sClient.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	for _, obj := range []client.Object{getLock(g, ns, "live"), getLease(g, ns, "old"), getLease(g, ns, "live")} {
		g.Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed())
	}
	eventually(t, 15*time.Second, func(g Gomega) {
		var leases coordinationv1.LeaseList
		g.Expect(k8sClient.List(ctx, &leases, client.InNamespace(ns))).To(Succeed())
		g.Expect(leases.Items).To(BeEmpty(), "a record holds the namespace up")
		var locks locksv1alpha1.DistributedLockList
		g.Expect(k8sClient.List(ctx, &locks, client.InNamespace(ns))).To(Succeed())
		g.Expect(locks.Items).To(BeEmpty())
	})
}

// kubectl dlock break edits only a Lease the lock controls: not a Lease it
// has not adopted (here a live leader election's).
func TestBreakLeavesALeaseTheLockDoesNotControlAlone(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	now := metav1.NewMicroTime(time.Now())
	g.Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "scheduler", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("leader-1"), LeaseDurationSeconds: ptr.To[int32](60),
			LeaseTransitions: ptr.To[int32](3), AcquireTime: &now, RenewTime: &now},
	})).To(Succeed())
	g.Expect(k8sClient.Create(ctx, testutil.MakeLock("sched", ns).LeaseName("scheduler").Obj())).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		ready := meta.FindStatusCondition(getLock(g, ns, "sched").Status.Conditions, locksv1alpha1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(locksv1alpha1.ReasonLeaseInUse))
	})
	_, err := newLockClient(t, ns, "sched", "admin").Break(ctx)
	g.Expect(err).To(MatchError(lock.ErrLeaseUnavailable))
	l := getLease(g, ns, "scheduler")
	g.Expect(ptr.Deref(l.Spec.HolderIdentity, "")).To(Equal("leader-1"))
	g.Expect(ptr.Deref(l.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(3))
}

// A pass that hands a candidates-mode lock on and then fails its status
// write (here refused; in a cluster, a lost write race) still reports the
// hand-off once a status write lands: the pass that runs again finds the
// Lease written and writes nothing, so the events of the failed pass's
// Lease writes wait for it (pendingEvents) rather than being dropped, and
// the new holder is not reported as a takeover.
func TestHandOffIsReportedAfterAFailedStatusWrite(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "c-0", web, true)
	createPod(t, ns, "c-1", web, true)
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(2).Candidates(web).Obj())
	eventually(t, 3*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("c-0"))
	})

	allow := refuseStatusUpdates(t, ns, "leader")
	g := NewWithT(t)
	g.Expect(k8sClient.Delete(ctx, c0)).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) { // revoked, then handed on, in the Lease alone
		l := getLease(g, ns, "leader")
		g.Expect(locksv1alpha1.PodNameOf(ptr.Deref(l.Spec.HolderIdentity, ""))).To(Equal("c-1"))
		g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("c-0"), "the status write was not refused")
	})
	allow()

	eventually(t, 15*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.HolderPod).To(Equal("c-1"))
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(2))
		g.Expect(eventMessages(g, ns, "leader", controllers.EventHandedOff)).To(
			ContainElement(ContainSubstring("pod c-0 is gone: handed the lock revoked from c-0 to c-1 with fencing token 2")))
		g.Expect(eventReasons(g, ns, "leader")).To(ContainElement(controllers.EventRevoked))
	})
	g.Expect(eventReasons(g, ns, "leader")).NotTo(ContainElement(controllers.EventTakenOver), "the hand-off was reported as a takeover")
}
