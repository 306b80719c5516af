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

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// fencedLabels opt an object in to the fencing policy.
var fencedLabels = map[string]string{locksv1alpha1.FencedLabel: "true"}

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
	return map[string]string{locksv1alpha1.FencingLockAnnotation: lock, locksv1alpha1.FencingTokenAnnotation: token}
}

func TestApiserverRejectsStaleWritersOfFencedObjects(t *testing.T) {
	installFencingPolicy(t)
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	for range 2 {
		_, err := harness.Grant(ctx, clientset, ns, "billing", "writer")
		g.Expect(err).NotTo(HaveOccurred())
	}
	eventually(t, 2*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(BeEquivalentTo(2))
	})

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "invoice-run", Namespace: ns, Labels: fencedLabels, Annotations: fenced("billing", "2")},
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
	_, err = harness.Grant(ctx, clientset, ns, "billing", "successor")
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 5*time.Second, func(g Gomega) {
		err := writeConfigMap(ns, "invoice-run", "late write", fenced("billing", "2"))
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(ContainSubstring("stale fencing token 2 for DistributedLock billing: its current fencing token is 3"))
	})
	g.Expect(writeConfigMap(ns, "invoice-run", "charged 101-200", fenced("billing", "3"))).To(Succeed())

	// A writer that holds nothing claims a token the lock never granted,
	// which would make every honest write after it stale: refused, and the
	// current holder goes on writing.
	err = writeConfigMap(ns, "invoice-run", "hijack", fenced("billing", "999999999999999999"))
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
	g.Expect(err.Error()).To(ContainSubstring("fencing token 999999999999999999 was never granted: DistributedLock billing has granted tokens up to 3"))
	refusedCreate := k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hijacked", Namespace: ns,
		Labels: fencedLabels, Annotations: fenced("billing", "4")}})
	g.Expect(apierrors.IsForbidden(refusedCreate)).To(BeTrue(), "creating an object fenced with a token never granted: %v", refusedCreate)
	g.Expect(writeConfigMap(ns, "invoice-run", "charged 101-200", fenced("billing", "3"))).To(Succeed())

	// Stripping the token is refused too.
	err = writeConfigMap(ns, "invoice-run", "sneaky", map[string]string{locksv1alpha1.FencingLockAnnotation: "billing"})
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
	err = k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: lockless, Labels: fencedLabels,
		Annotations: fenced("billing", "1")}})
	g.Expect(err).To(HaveOccurred(), "a fenced object in a namespace without locks")

	// Objects that do not opt in are untouched by the policy, in a
	// namespace with locks or without (a new namespace's
	// kube-root-ca.crt must be writable), even carrying the annotations.
	for _, where := range []string{ns, lockless} {
		plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: where}}
		g.Expect(k8sClient.Create(ctx, plain)).To(Succeed(), "a ConfigMap of namespace %s", where)
		plain.Data = map[string]string{"k": "v"}
		g.Expect(k8sClient.Update(ctx, plain)).To(Succeed())
		annotated := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "annotated", Namespace: where, Annotations: fenced("billing", "0")}}
		g.Expect(k8sClient.Create(ctx, annotated)).To(Succeed(), "an annotated ConfigMap of namespace %s, without the label", where)
	}

	// The label, once set, stays.
	fresh := &corev1.ConfigMap{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), fresh)).To(Succeed())
	delete(fresh.Labels, locksv1alpha1.FencedLabel)
	err = k8sClient.Update(ctx, fresh)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("the locks.frontdesk.dev/fenced label was removed"))
}
