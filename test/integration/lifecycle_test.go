package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// deleteLockAndWait deletes the lock and waits until it is gone.
func deleteLockAndWait(t *testing.T, namespace, name string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	l := &locksv1alpha1.DistributedLock{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l); err != nil {
		t.Fatalf("reading lock %s: %v", name, err)
	}
	if err := k8sClient.Delete(ctx, l); err != nil {
		t.Fatalf("deleting lock %s: %v", name, err)
	}
	eventually(t, timeout, func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &locksv1alpha1.DistributedLock{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "lock %s still exists: %v", name, err)
	})
}

// expectRetiredRecord checks that the Lease stays behind as the record of a
// deleted lock's tokens: no owner, the lock's name, the token finalizer, no
// holder.
func expectRetiredRecord(g Gomega, namespace, leaseName, lockName string, token int64) {
	l := getLease(g, namespace, leaseName)
	g.Expect(l.DeletionTimestamp).To(BeNil())
	g.Expect(l.Annotations).NotTo(HaveKey(locksv1alpha1.LockUIDAnnotation), "a retired record is tied to no lock")
	g.Expect(l.OwnerReferences).To(BeEmpty(), "a record has no owner for the garbage collector to follow")
	g.Expect(l.Labels).To(HaveKeyWithValue(locksv1alpha1.LockNameLabel, lockName))
	g.Expect(l.Annotations).To(HaveKeyWithValue(locksv1alpha1.LeaseOriginAnnotation, locksv1alpha1.LeaseOriginCreated))
	g.Expect(l.Finalizers).To(ContainElement(locksv1alpha1.LeaseTokenFinalizer))
	g.Expect(ptr.Deref(l.Spec.HolderIdentity, "")).To(BeEmpty())
	g.Expect(ptr.Deref(l.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(token))
}

// Deleting a lock and creating it again (GitOps prune and re-sync, kubectl
// replace --force) never reissues a token: the deleted lock's Lease stays as
// the record, and the new lock continues from it (without the record, the
// next grant would get token 1).
func TestDeletedLockKeepsItsTokensForTheNextLockOfThatName(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	var last int64
	for cycle := range 3 {
		createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
		c := newLockClient(t, ns, "billing", "worker")
		for range 2 {
			gr, err := c.TryAcquire(ctx)
			g.Expect(err).NotTo(HaveOccurred(), "cycle %d", cycle)
			g.Expect(gr.Token()).To(BeNumerically(">", last), "cycle %d: a token was granted again", cycle)
			last = gr.Token()
			g.Expect(gr.Release(ctx)).To(Succeed())
		}
		eventually(t, 2*time.Second, func(g Gomega) {
			g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(Equal(last))
		})
		deleteLockAndWait(t, ns, "billing", 10*time.Second)
		expectRetiredRecord(g, ns, "billing", "billing", last)
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement(controllers.EventRetired))
	}
	g.Expect(last).To(BeEquivalentTo(6))

	// Created again with another leaseName, it still continues from the
	// record kept under its name.
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseName("billing-v2").Obj())
	gr, err := newLockClient(t, ns, "billing", "worker").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gr.Token()).To(BeEquivalentTo(7))
}

// A held lock being deleted stays (terminating, Ready=False Deleting) until
// its holder is gone: the holder's next renewal finds the Lease no longer
// the lock's and ends the grant, and only after the grant has lapsed as the
// controller observes does the lock go. A holder that ignores the retirement
// and keeps renewing keeps the lock from going.
func TestDeletingAHeldLockWaitsForItsHolder(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())

	gr, err := newLockClient(t, ns, "billing", "holder").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	l := getLock(g, ns, "billing")
	g.Expect(k8sClient.Delete(ctx, l)).To(Succeed())

	var lostAt time.Time
	select {
	case <-gr.Lost():
		lostAt = time.Now()
	case <-time.After(5 * time.Second):
		t.Fatal("the holder did not learn within 5s that its lock is being deleted")
	}
	g.Expect(gr.Err()).To(MatchError(lock.ErrLost))
	g.Expect(gr.Err().Error()).To(ContainSubstring("was deleted"))
	// Meanwhile the lock is terminating and says why. (The holder follows
	// its Lease, so it can learn of the untie before that status is
	// written.)
	eventually(t, 5*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "billing")
		g.Expect(lk.DeletionTimestamp).NotTo(BeNil())
		g.Expect(meta.FindStatusCondition(lk.Status.Conditions, locksv1alpha1.ConditionReady)).To(
			HaveField("Reason", locksv1alpha1.ReasonDeleting))
	})
	// A client acquiring meanwhile is told the lock is going, not to check
	// whether the controller runs.
	_, err = newLockClient(t, ns, "billing", "latecomer").TryAcquire(ctx)
	g.Expect(err).To(MatchError(lock.ErrLeaseUnavailable))
	g.Expect(err.Error()).To(ContainSubstring("is being deleted"))
	g.Expect(err.Error()).NotTo(ContainSubstring("controller running"))

	deleteLockGone := func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(l), &locksv1alpha1.DistributedLock{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}
	eventually(t, 6*time.Second, deleteLockGone)
	goneAt := time.Now()
	g.Expect(goneAt.After(lostAt)).To(BeTrue())
	expectRetiredRecord(g, ns, "billing", "billing", gr.Token())
	t.Logf("holder lost its grant %s before the lock was gone", goneAt.Sub(lostAt).Round(time.Millisecond))

	// A holder that keeps renewing the retiring Lease holds the deletion up.
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	token, err := harness.Grant(ctx, clientset, ns, "billing", "stubborn")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(int64(token)).To(Equal(gr.Token() + 1))
	g.Expect(k8sClient.Delete(ctx, getLock(g, ns, "billing"))).To(Succeed())
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		// A raw client: a conflict (the controller retiring the Lease)
		// means re-read and renew again.
		err := harness.Renew(ctx, clientset, ns, "billing", "stubborn")
		if apierrors.IsConflict(errors.Unwrap(err)) {
			err = harness.Renew(ctx, clientset, ns, "billing", "stubborn")
		}
		g.Expect(err).To(Succeed())
		time.Sleep(300 * time.Millisecond) // the stubborn holder's renew interval, not an assertion
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(l), &locksv1alpha1.DistributedLock{})).To(Succeed(),
			"the lock went while its holder was still renewing")
	}
	eventually(t, 6*time.Second, deleteLockGone)
	expectRetiredRecord(g, ns, "billing", "billing", int64(token))
}

// A long-lived client follows its lock through deletion and re-creation:
// its next Acquire works on the new lock, and a waiter inside Acquire when
// the new lock adopts the record gets it, with the next token.
func TestLongLivedClientFollowsARecreatedLock(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	c := newLockClient(t, ns, "billing", "long-lived")
	first, err := c.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(first.Release(ctx)).To(Succeed())

	deleteLockAndWait(t, ns, "billing", 10*time.Second)
	_, err = c.TryAcquire(ctx)
	g.Expect(err).To(MatchError(lock.ErrLockNotFound))

	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	second, err := c.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(second.Token()).To(Equal(first.Token() + 1))
	g.Expect(second.Release(ctx)).To(Succeed())

	// A waiter already inside Acquire while the held lock is deleted and
	// created again: the watch shows it the retiring Lease (not grantable),
	// then the record adopted by the new lock, which it then takes with the
	// next token.
	other := newLockClient(t, ns, "billing", "other")
	held, err := other.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	got := make(chan *lock.Grant, 1)
	waitErr := make(chan error, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		gr, err := c.Acquire(actx)
		if err != nil {
			waitErr <- err
			return
		}
		got <- gr
	}()
	deleteLockAndWait(t, ns, "billing", 10*time.Second)
	g.Expect(held.Err()).To(MatchError(lock.ErrLost), "the holder of the deleted lock was not told")
	select {
	case gr := <-got:
		t.Fatalf("the waiter got token %d from a deleted lock", gr.Token())
	case err := <-waitErr:
		t.Fatalf("the waiter gave up: %v", err)
	default:
	}
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	select {
	case gr := <-got:
		g.Expect(gr.Token()).To(Equal(held.Token() + 1))
		g.Expect(gr.Release(ctx)).To(Succeed())
	case err := <-waitErr:
		t.Fatalf("waiter: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the re-created lock")
	}
}

// A Lease frontdesk did not create and someone holds (a live leader
// election, say) is not adopted until it is free; with leaseAdoption
// WhileHeld it is adopted at once, holder and all, and when the lock is
// deleted it is handed back as it was, never deleted: it is not the lock's
// to take silently, nor to delete under its holder.
func TestForeignLeasesAreAdoptedOnlyWhenAllowedAndNeverDeleted(t *testing.T) {
	ns := newNamespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := NewWithT(t)
	foreign := func(name string) {
		now := metav1.NewMicroTime(time.Now())
		g.Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: new("kcm-1"), LeaseDurationSeconds: ptr.To[int32](2),
				LeaseTransitions: ptr.To[int32](9), AcquireTime: &now, RenewTime: &now},
		})).To(Succeed())
		go func() { // the leader renews every 500ms until the test ends
			for ctx.Err() == nil {
				_ = harness.Renew(ctx, clientset, ns, name, "kcm-1")
				time.Sleep(500 * time.Millisecond)
			}
		}()
	}

	foreign("kube-controller-manager")
	g.Expect(k8sClient.Create(ctx, testutil.MakeLock("kcm", ns).LeaseName("kube-controller-manager").Obj())).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		ready := meta.FindStatusCondition(getLock(g, ns, "kcm").Status.Conditions, locksv1alpha1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(locksv1alpha1.ReasonLeaseInUse))
		g.Expect(ready.Message).To(ContainSubstring("spec.leaseAdoption: WhileHeld"))
	})
	// It stays unadopted while the holder renews.
	time.Sleep(3 * time.Second) // longer than the foreign lease; what follows is the assertion
	untouched := getLease(g, ns, "kube-controller-manager")
	g.Expect(untouched.Annotations).To(BeEmpty())
	g.Expect(untouched.Finalizers).To(BeEmpty())
	g.Expect(untouched.Labels).NotTo(HaveKey(locksv1alpha1.LockNameLabel))

	foreign("scheduler")
	createReadyLock(t, testutil.MakeLock("sched", ns).LeaseName("scheduler").LeaseAdoption(locksv1alpha1.LeaseAdoptionWhileHeld).Obj())
	eventually(t, 3*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "sched")
		g.Expect(lk.Status.Holder).To(Equal("kcm-1"))
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(9))
		g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonHeld))
	})
	adopted := getLease(g, ns, "scheduler")
	g.Expect(adopted.Annotations).To(HaveKeyWithValue(locksv1alpha1.LeaseOriginAnnotation, locksv1alpha1.LeaseOriginAdopted))

	deleteLockAndWait(t, ns, "sched", 5*time.Second)
	back := getLease(g, ns, "scheduler")
	g.Expect(back.DeletionTimestamp).To(BeNil(), "a Lease frontdesk did not create was deleted")
	g.Expect(back.Annotations).To(BeEmpty(), "frontdesk's annotations were left behind")
	g.Expect(back.Finalizers).To(BeEmpty())
	g.Expect(back.Labels).NotTo(HaveKey(locksv1alpha1.LockNameLabel))
	g.Expect(back.Annotations).NotTo(HaveKey(locksv1alpha1.LeaseOriginAnnotation))
	g.Expect(ptr.Deref(back.Spec.HolderIdentity, "")).To(Equal("kcm-1"), "the holder was disturbed")
	g.Expect(eventReasons(g, ns, "sched")).To(ContainElement(controllers.EventLeaseHandedBack))

	// Once its leader stops, the first Lease is free and adopted.
	cancel()
	eventually(t, 8*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "kcm")
		g.Expect(meta.IsStatusConditionTrue(lk.Status.Conditions, locksv1alpha1.ConditionReady)).To(BeTrue())
		g.Expect(getLease(g, ns, "kube-controller-manager").Annotations).To(HaveKeyWithValue(locksv1alpha1.LockUIDAnnotation, string(lk.UID)))
	})
}

// The retired record of one lock is not taken over by a lock of another
// name: its tokens belong to the name that may come back.
func TestRetiredRecordOfAnotherLockIsNotTaken(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("first", ns).LeaseName("shared").Obj())
	_, err := harness.Grant(context.Background(), clientset, ns, "shared", "w")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(harness.Release(context.Background(), clientset, ns, "shared", "w")).To(Succeed())
	deleteLockAndWait(t, ns, "first", 10*time.Second)

	g.Expect(k8sClient.Create(context.Background(), testutil.MakeLock("second", ns).LeaseName("shared").Obj())).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		ready := meta.FindStatusCondition(getLock(g, ns, "second").Status.Conditions, locksv1alpha1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(locksv1alpha1.ReasonLeaseRetiredByOther))
		g.Expect(ready.Message).To(ContainSubstring("deleted DistributedLock first"))
	})
	expectRetiredRecord(g, ns, "shared", "first", 1)
}

// With the manager down, a Lease wound back by hand below the lock's
// recorded token is not granted on: the library refuses instead of handing
// out a token at or below the recorded one (leaseTransitions+1 would be
// token 4 after 35 had been recorded).
func TestClientRefusesALeaseWoundBackBelowTheRecordedToken(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	c := newLockClient(t, ns, "billing", "worker")
	for range 5 {
		gr, err := c.TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(gr.Release(ctx)).To(Succeed())
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(5))
	})

	withManagerStopped(t)
	wound := getLease(g, ns, "billing")
	wound.Spec.LeaseTransitions = ptr.To[int32](2)
	g.Expect(k8sClient.Update(ctx, wound)).To(Succeed())

	for _, cl := range []*lock.Client{c, newLockClient(t, ns, "billing", "fresh-client")} {
		_, err := cl.TryAcquire(ctx)
		g.Expect(err).To(MatchError(lock.ErrLeaseUnavailable), "%s", cl.Identity())
		g.Expect(err.Error()).To(ContainSubstring("has fencing token 2, below the 5 already granted or recorded"))
	}
	g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.LeaseTransitions, 0)).To(BeEquivalentTo(2), "nothing was granted")
	var unavailable = lock.ErrLeaseUnavailable
	g.Expect(errors.Is(unavailable, lock.ErrHeld)).To(BeFalse())
}

// An unowned Lease of the lock's name that frontdesk created (the record)
// keeps its token finalizer when it is retired, and the controller does not
// put its finalizer on a Lease no lock points at.
func TestControllerKeepsFinalizerOffForeignLeases(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "unrelated", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("someone")}}
	g.Expect(k8sClient.Create(ctx, l)).To(Succeed())
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	got := getLease(g, ns, "unrelated")
	g.Expect(controllerutil.ContainsFinalizer(got, locksv1alpha1.LeaseTokenFinalizer)).To(BeFalse())
	g.Expect(got.Annotations).To(BeEmpty())
}
