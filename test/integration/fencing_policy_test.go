package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/internal/manifests"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

const (
	fencingTokenAnnotation = "locks.frontdesk.dev/fencing-token"
	fencingLockAnnotation  = "locks.frontdesk.dev/fencing-lock"
)

var installPolicy sync.Once

// installFencingPolicy applies config/fencing-policy as shipped.
func installFencingPolicy(t *testing.T) {
	t.Helper()
	var err error
	installPolicy.Do(func() {
		err = manifests.CreateShippedPolicy(context.Background(), k8sClient, "fencing-policy")
	})
	if err != nil {
		t.Fatal(err)
	}
}

// writeConfigMap updates the ConfigMap as a writer holding token would.
func writeConfigMap(ns, name, value string, annotations map[string]string) error {
	cm := &corev1.ConfigMap{}
	if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
		return err
	}
	cm.Annotations = annotations
	cm.Data = map[string]string{"value": value}
	return k8sClient.Update(context.Background(), cm)
}

func fenced(lock, token string) map[string]string {
	return map[string]string{fencingLockAnnotation: lock, fencingTokenAnnotation: token}
}

func TestApiserverRejectsStaleWritersOfFencedObjects(t *testing.T) {
	installFencingPolicy(t)
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	for range 2 {
		_, err := testutil.Grant(ctx, clientset, ns, "billing", "writer")
		g.Expect(err).NotTo(HaveOccurred())
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(2))
	})

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "invoice-run", Namespace: ns, Annotations: fenced("billing", "2")},
		Data: map[string]string{"value": "start"}}
	g.Expect(k8sClient.Create(ctx, cm)).To(Succeed())
	// The apiserver picks new policies up asynchronously: wait until a
	// malformed token is refused, which changes nothing when it is.
	eventually(t, 20*time.Second, func(g Gomega) {
		err := writeConfigMap(ns, "invoice-run", "start", fenced("billing", "two"))
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "policy not active yet: %v", err)
		g.Expect(err.Error()).To(ContainSubstring(`locks.frontdesk.dev/fencing-token must be a non-negative integer, not "two"`))
	})

	// The current holder (token 2) writes.
	g.Expect(writeConfigMap(ns, "invoice-run", "charged 1-100", fenced("billing", "2"))).To(Succeed())

	// A paused writer with token 1 is refused by the apiserver itself.
	err := writeConfigMap(ns, "invoice-run", "stale", fenced("billing", "1"))
	g.Expect(apierrors.IsConflict(err) || apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
	g.Expect(err.Error()).To(ContainSubstring("stale fencing token 1: this object was last written with token 2 (DistributedLock billing)"))

	// A new grant: the writer with token 2 is now stale against the lock,
	// even though the object itself last saw token 2.
	_, err = testutil.Grant(ctx, clientset, ns, "billing", "successor")
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 5*time.Second, func(g Gomega) {
		err := writeConfigMap(ns, "invoice-run", "late write", fenced("billing", "2"))
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(ContainSubstring("stale fencing token 2 for DistributedLock billing: its current fencing token is 3"))
	})
	g.Expect(writeConfigMap(ns, "invoice-run", "charged 101-200", fenced("billing", "3"))).To(Succeed())

	// Stripping the token is refused too.
	err = writeConfigMap(ns, "invoice-run", "sneaky", map[string]string{fencingLockAnnotation: "billing"})
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("the locks.frontdesk.dev/fencing-token annotation was removed: this object is fenced by DistributedLock billing"))

	// Pointing the object at another lock, or at none, is refused too.
	err = writeConfigMap(ns, "invoice-run", "elsewhere", fenced("other-lock", "9"))
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("the locks.frontdesk.dev/fencing-lock annotation may not change: this object is fenced by DistributedLock billing"))

	final := &corev1.ConfigMap{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), final)).To(Succeed())
	g.Expect(final.Data["value"]).To(Equal("charged 101-200"), "only current holders' writes landed")

	// A fenced object where no DistributedLock could check it is refused.
	lockless := newNamespace(t)
	err = k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: lockless, Annotations: fenced("billing", "1")}})
	g.Expect(err).To(HaveOccurred(), "a fenced object in a namespace without locks")

	// Objects without the annotations are untouched by the policy.
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns}}
	g.Expect(k8sClient.Create(ctx, plain)).To(Succeed())
	plain.Data = map[string]string{"k": "v"}
	g.Expect(k8sClient.Update(ctx, plain)).To(Succeed())
}
