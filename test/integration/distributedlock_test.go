package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

func TestLockCreatesOwnedLease(t *testing.T) {
	ns := newNamespace(t)
	lock := createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(20).Obj())

	g := NewWithT(t)
	lease := getLease(g, ns, "billing")
	g.Expect(lease.Annotations).To(HaveKeyWithValue(locksv1alpha1.LockUIDAnnotation, string(lock.UID)), "the Lease is not tied to its lock")
	g.Expect(lease.OwnerReferences).To(BeEmpty(), "no owner reference for the garbage collector to follow")
	g.Expect(lease.Finalizers).To(ContainElement(locksv1alpha1.LeaseTokenFinalizer))
	g.Expect(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)).To(BeEquivalentTo(20))
	g.Expect(lease.Spec.HolderIdentity).To(BeNil())

	g.Expect(lock.Status.LeaseName).To(Equal("billing"))
	g.Expect(lock.Status.ObservedGeneration).To(Equal(lock.Generation))
	g.Expect(lock.Status.Holder).To(BeEmpty())
	g.Expect(heldReason(lock)).To(Equal(locksv1alpha1.ReasonNotHeld))
	g.Expect(lock.Finalizers).To(ContainElement(locksv1alpha1.LockCleanupFinalizer))
}

func TestLeaseNameDefaultsAndOverrides(t *testing.T) {
	ns := newNamespace(t)
	lock := createReadyLock(t, testutil.MakeLock("payments", ns).LeaseName("payments-lease").Obj())
	g := NewWithT(t)
	g.Expect(lock.Status.LeaseName).To(Equal("payments-lease"))
	g.Expect(lock.Spec.LeaseDurationSeconds).To(BeEquivalentTo(15), "apiserver default for leaseDurationSeconds")
	lease := getLease(g, ns, "payments-lease")
	g.Expect(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)).To(BeEquivalentTo(15))
}

func TestGrantShowsInStatusWithinASecond(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	ctx := context.Background()

	token, err := harness.Grant(ctx, clientset, ns, "billing", "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	eventually(t, time.Second, func(g Gomega) {
		lock := getLock(g, ns, "billing")
		g.Expect(lock.Status.Holder).To(Equal("worker-a"))
		g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(token))
		g.Expect(heldReason(lock)).To(Equal(locksv1alpha1.ReasonHeld))
		g.Expect(lock.Status.AcquireTime).NotTo(BeNil())
	})
	t.Logf("status showed the grant %s after the Lease update", time.Since(granted).Round(time.Millisecond))
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement(controllers.EventAcquired))
	})
}

func TestExpiryEndsTheGrantAndTheNextGetsAHigherToken(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	ctx := context.Background()

	first, err := harness.Grant(ctx, clientset, ns, "billing", "worker-a")
	if err != nil {
		t.Fatal(err)
	}
	// Renew twice, then stop: a holder that froze.
	for range 2 {
		time.Sleep(500 * time.Millisecond) // the holder's renew interval, not an assertion
		if err := harness.Renew(ctx, clientset, ns, "billing", "worker-a"); err != nil {
			t.Fatal(err)
		}
	}
	// The controller ends the unrenewed grant: the lock is free, and its
	// status says whose grant lapsed.
	eventually(t, 6*time.Second, func(g Gomega) {
		lock := getLock(g, ns, "billing")
		g.Expect(lock.Status.Holder).To(BeEmpty())
		g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(first))
		g.Expect(heldReason(lock)).To(Equal(locksv1alpha1.ReasonExpired))
		g.Expect(meta.FindStatusCondition(lock.Status.Conditions, locksv1alpha1.ConditionHeld).Message).To(ContainSubstring("worker-a"))
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement(controllers.EventExpired))
	})

	second, err := harness.Grant(ctx, clientset, ns, "billing", "worker-b")
	if err != nil {
		t.Fatal(err)
	}
	if second <= first {
		t.Fatalf("takeover token %d is not greater than the first grant's %d", second, first)
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		lock := getLock(g, ns, "billing")
		g.Expect(lock.Status.Holder).To(Equal("worker-b"))
		g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(second))
		g.Expect(heldReason(lock)).To(Equal(locksv1alpha1.ReasonHeld))
		acquired := slices.DeleteFunc(eventReasons(g, ns, "billing"), func(r string) bool { return r != controllers.EventAcquired })
		g.Expect(acquired).To(HaveLen(2), "worker-b's grant of the free lock is an acquire, not a takeover")
	})

	if err := harness.Release(ctx, clientset, ns, "billing", "worker-b"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		lock := getLock(g, ns, "billing")
		g.Expect(lock.Status.Holder).To(BeEmpty())
		g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(second), "release keeps the token")
		g.Expect(heldReason(lock)).To(Equal(locksv1alpha1.ReasonNotHeld))
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement(controllers.EventReleased))
	})
}

// Renewals are written to the Lease only: the lock's status (and so its
// resourceVersion) does not change, and no event is recorded. The
// controller's expiry clock still sees every renewal: the grant lapses a
// lease duration after the last one, not after the grant.
func TestRenewalsWriteNoStatusButKeepTheGrantLive(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	ctx := context.Background()
	g := NewWithT(t)
	if _, err := harness.Grant(ctx, clientset, ns, "billing", "worker-a"); err != nil {
		t.Fatal(err)
	}
	// Wait for the grant in status, renewing meanwhile (every 400 ms, as a
	// holder would) so a slow controller does not see the 2 s lease lapse.
	var granted *locksv1alpha1.DistributedLock
	var lastRenewal time.Time
	renew := func(g Gomega) {
		lastRenewal = time.Now() // the controller sees the renewal after it is sent
		g.Expect(harness.Renew(ctx, clientset, ns, "billing", "worker-a")).To(Succeed())
	}
	NewWithT(t).Eventually(func(g Gomega) {
		renew(g)
		granted = getLock(g, ns, "billing")
		g.Expect(heldReason(granted)).To(Equal(locksv1alpha1.ReasonHeld))
	}).WithPolling(400 * time.Millisecond).WithTimeout(5 * time.Second).Should(Succeed())

	// Renew for three lease durations: the grant stays live throughout.
	const renewals = 15
	for range renewals {
		renew(g)
		lock := getLock(g, ns, "billing")
		g.Expect(heldReason(lock)).To(Equal(locksv1alpha1.ReasonHeld), "lapsed while renewing")
		g.Expect(lock.ResourceVersion).To(Equal(granted.ResourceVersion), "a renewal wrote status")
		time.Sleep(400 * time.Millisecond) // renew interval
	}
	// The grant's own events, and nothing for the renewals.
	g.Expect(eventReasons(g, ns, "billing")).To(HaveEach(BeElementOf(controllers.EventLeaseCreated, controllers.EventAcquired)),
		"renewals recorded events")

	// Then silence: Expired about a lease duration after the last renewal.
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(heldReason(getLock(g, ns, "billing"))).To(Equal(locksv1alpha1.ReasonExpired))
	})
	g.Expect(time.Since(lastRenewal)).To(BeNumerically(">=", 2*time.Second), "expired before a lease duration after the last renewal")
	lock := getLock(g, ns, "billing")
	lease := getLease(g, ns, "billing")
	g.Expect(lock.Status.RenewTime.Equal(lease.Spec.RenewTime)).To(BeTrue(), "the Expired status names the record that lapsed")
}

func TestLeaseRecreatedContinuesFromHighestToken(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	ctx := context.Background()
	g := NewWithT(t)

	// Reach token 7 through real grants.
	var token int32
	for i := range 7 {
		var err error
		if token, err = harness.Grant(ctx, clientset, ns, "billing", "worker-"+string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	g.Expect(token).To(BeEquivalentTo(7))
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(7))
	})

	old := getLease(g, ns, "billing")
	g.Expect(clientset.CoordinationV1().Leases(ns).Delete(ctx, "billing", metav1.DeleteOptions{})).To(Succeed())
	// The last holder (worker-g) is still inside its lease: the Lease stays,
	// terminating, so nobody can be granted a fresh one meanwhile.
	eventually(t, 2*time.Second, func(g Gomega) {
		lock := getLock(g, ns, "billing")
		g.Expect(lock.Status.Conditions).To(ContainElement(HaveField("Reason", locksv1alpha1.ReasonLeaseTerminating)))
	})
	terminating := getLease(g, ns, "billing")
	g.Expect(terminating.UID).To(Equal(old.UID))
	g.Expect(terminating.DeletionTimestamp).NotTo(BeNil())
	eventually(t, 10*time.Second, func(g Gomega) {
		lease := getLease(g, ns, "billing")
		g.Expect(lease.UID).NotTo(Equal(old.UID), "lease not yet recreated")
		g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(BeNumerically(">=", 7))
		g.Expect(lease.Spec.HolderIdentity).To(BeNil())
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeNumerically(">=", 7))
	})
	next, err := harness.Grant(ctx, clientset, ns, "billing", "worker-next")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(next).To(BeEquivalentTo(8))
	eventually(t, 2*time.Second, func(g Gomega) {
		lock := getLock(g, ns, "billing")
		g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(8))
		g.Expect(lock.Status.Holder).To(Equal("worker-next"))
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement(controllers.EventLeaseRecreated))
	})
}

// A grant immediately followed by deleting the Lease, faster than the
// controller can observe the grant: the finalizer holds the Lease until its
// token is recorded, so the recreated Lease never reuses that token.
func TestGrantThenDeleteNeverReusesToken(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(1).Obj())
	ctx := context.Background()
	g := NewWithT(t)

	var last int32
	for round := range 5 {
		var token int32
		// The controller may write the recreated Lease meanwhile (the
		// lapse mark of the previous round's grant): read again then.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() (err error) {
			token, err = harness.Grant(ctx, clientset, ns, "billing", "racer")
			return err
		})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(token).To(BeNumerically(">", last), "round %d", round)
		last = token
		g.Expect(clientset.CoordinationV1().Leases(ns).Delete(ctx, "billing", metav1.DeleteOptions{})).To(Succeed())
		eventually(t, 10*time.Second, func(g Gomega) {
			lease := getLease(g, ns, "billing")
			g.Expect(lease.DeletionTimestamp).To(BeNil(), "old lease still terminating")
			g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(BeNumerically(">=", last))
		})
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(last))
	})
}

func TestLeaseBehindTheFloorIsRaisedAndStaleGrantVoided(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	ctx := context.Background()
	g := NewWithT(t)
	for range 5 {
		_, err := harness.Grant(ctx, clientset, ns, "billing", "worker-a")
		g.Expect(err).NotTo(HaveOccurred())
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(5))
	})

	// Someone edits the Lease by hand and winds the token back to 2.
	lease, err := clientset.CoordinationV1().Leases(ns).Get(ctx, "billing", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	lease.Spec.LeaseTransitions = ptr.To[int32](2)
	lease.Spec.HolderIdentity = new("rogue")
	_, err = clientset.CoordinationV1().Leases(ns).Update(ctx, lease, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	eventually(t, 3*time.Second, func(g Gomega) {
		lease := getLease(g, ns, "billing")
		g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(5))
		g.Expect(lease.Spec.HolderIdentity).To(BeNil(), "the grant made with a reused token is voided")
		lock := getLock(g, ns, "billing")
		g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(5))
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement(controllers.EventTokenFloorRestored))
	})
	next, err := harness.Grant(ctx, clientset, ns, "billing", "worker-b")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(next).To(BeEquivalentTo(6))
}

func TestExistingLeaseAdoptedWhileHeldKeepsItsHolder(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       new("old-timer"),
			LeaseDurationSeconds: ptr.To[int32](30),
			LeaseTransitions:     ptr.To[int32](3),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	g.Expect(k8sClient.Create(ctx, lease)).To(Succeed())

	lock := createReadyLock(t, testutil.MakeLock("legacy", ns).LeaseDuration(5).LeaseAdoption(locksv1alpha1.LeaseAdoptionWhileHeld).Obj())
	adopted := getLease(g, ns, "legacy")
	g.Expect(adopted.Annotations).To(HaveKeyWithValue(locksv1alpha1.LockUIDAnnotation, string(lock.UID)))
	g.Expect(adopted.Finalizers).To(ContainElement(locksv1alpha1.LeaseTokenFinalizer))
	g.Expect(ptr.Deref(adopted.Spec.HolderIdentity, "")).To(Equal("old-timer"))
	g.Expect(ptr.Deref(adopted.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(3))
	g.Expect(ptr.Deref(adopted.Spec.LeaseDurationSeconds, 0)).To(BeEquivalentTo(30), "a live holder's duration is not cut short")
	g.Expect(adopted.Spec.RenewTime.Equal(lease.Spec.RenewTime)).To(BeTrue(), "renewTime untouched")
	eventually(t, 2*time.Second, func(g Gomega) {
		lock := getLock(g, ns, "legacy")
		g.Expect(lock.Status.Holder).To(Equal("old-timer"))
		g.Expect(lock.Status.FencingToken).To(BeEquivalentTo(3))
		g.Expect(heldReason(lock)).To(Equal(locksv1alpha1.ReasonHeld))
		g.Expect(eventReasons(g, ns, "legacy")).To(ContainElement(controllers.EventLeaseAdopted))
	})
}

func TestLeaseControlledByAnotherLockIsNotTaken(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("first", ns).LeaseName("shared").Obj())
	g := NewWithT(t)
	second := testutil.MakeLock("second", ns).LeaseName("shared").Obj()
	g.Expect(k8sClient.Create(context.Background(), second)).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		lock := getLock(g, ns, "second")
		g.Expect(lock.Status.Conditions).To(ContainElement(And(
			HaveField("Type", locksv1alpha1.ConditionReady),
			HaveField("Reason", locksv1alpha1.ReasonLeaseOwnedByOther),
			HaveField("Message", ContainSubstring("spec.leaseName")),
		)))
	})
	lease := getLease(g, ns, "shared")
	g.Expect(lease.Annotations[locksv1alpha1.LockUIDAnnotation]).To(Equal(string(getLock(g, ns, "first").UID)))
}
