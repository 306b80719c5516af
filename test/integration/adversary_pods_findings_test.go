package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// The pod-creator's findings (the adversary's pod surface,
// adversary_pods_test.go), each as the shortest sequence that shows it:
// a principal that may create, change and delete pods in the namespace
// (what the built-in edit role grants on pods) and nothing for locks.

// podCreatorConfig binds user to a Role that may create, read, patch,
// update and delete pods in ns (and nothing else), and returns a config
// that impersonates it, once the binding is in effect.
func podCreatorConfig(t *testing.T, ns, user string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	err := k8sClient.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-creator", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"},
			Verbs: []string{"create", "get", "list", "watch", "patch", "update", "delete"}}}})
	g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "creating Role pod-creator: %v", err)
	g.Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pod-creator-" + user, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-creator"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: user}}})).To(Succeed())
	cfg := restConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	cfg.UserAgent = user
	eventually(t, 5*time.Second, func(g Gomega) {
		can, err := canI(ctx, cfg, ns, "patch", "pods")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	return cfg
}

// Promise: each gated pod whose ServiceAccount may use the lock is queued
// (docs/annotations.md, "Queued"). A pod name may have 253 characters; its
// identity "<pod>_<uid>" then has 37 more, past the grammar's 253, and
// lease.Registered refuses it. The controller registers the pods it
// queues together in one write: the write fails, every pass, for every
// gated pod of the lock, and the pass ends there (no status is written).
func TestPodWithALongNameDoesNotStopAdmissions(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	letPodsUseLocks(t, ns, "default")
	pods := kubernetes.NewForConfigOrDie(podCreatorConfig(t, ns, "pod-creator")).CoreV1().Pods(ns)
	long := testutil.MakeGatedPod(strings.Repeat("a", 253-len("_")-36+1), ns, "billing") // identity: 254 characters
	_, err := pods.Create(ctx, long, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "a pod name of %d characters", len(long.Name))
	time.Sleep(100 * time.Millisecond) // the honest pod is younger
	_, err = pods.Create(ctx, testutil.MakeGatedPod("honest", ns, "billing"), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	expectAdmitted(t, ns, "honest", "billing", 10*time.Second)
	expectGated(g, ns, long.Name, "billing")
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(podEventReasons(g, ns, long.Name)).To(ContainElement("PodNameTooLong"))
	})
}

// Promise: an admitted pod that has not started podStartTimeoutSeconds
// after its gate went is deleted (docs/annotations.md, design.md
// "Security model"). The controller judged only the pods its cache holds:
// participant pods whose runs-holding annotation names the lock. Whoever
// may patch the pod removes its participant label (or points its
// annotation at another lock) once it is admitted: the pod is never
// deleted, the controller renews its grant for ever, and nobody else gets
// the lock.
func TestAdmittedPodOutOfTheCacheIsStillDeletedWhenItDoesNotStart(t *testing.T) {
	for _, edit := range []struct {
		name  string
		patch string
	}{
		{"participant label removed", `{"metadata":{"labels":{"` + locksv1alpha1.ParticipantLabel + `":null}}}`},
		{"runs-holding renamed", `{"metadata":{"annotations":{"` + locksv1alpha1.RunsHoldingAnnotation + `":"elsewhere"}}}`},
	} {
		t.Run(edit.name, func(t *testing.T) {
			ns := newNamespace(t)
			lk := testutil.MakeLock("billing", ns).LeaseDuration(3).Obj()
			lk.Spec.PodStartTimeoutSeconds = 2
			createReadyLock(t, lk)
			g := NewWithT(t)
			ctx := context.Background()
			letPodsUseLocks(t, ns, "default")
			pods := kubernetes.NewForConfigOrDie(podCreatorConfig(t, ns, "pod-creator")).CoreV1().Pods(ns)
			_, err := pods.Create(ctx, testutil.MakeGatedPod("stuck", ns, "billing"), metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			first := expectAdmitted(t, ns, "stuck", "billing", 10*time.Second)
			admitted := time.Now()
			_, err = pods.Patch(ctx, "stuck", types.MergePatchType, []byte(edit.patch), metav1.PatchOptions{})
			g.Expect(err).NotTo(HaveOccurred(), "the pod creator edits its admitted pod")
			_, err = pods.Create(ctx, testutil.MakeGatedPod("next", ns, "billing"), metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			deadline := admitted.Add(2*time.Second + 8*time.Second)
			for time.Now().Before(deadline) {
				if _, err := clientset.CoreV1().Pods(ns).Get(ctx, "stuck", metav1.GetOptions{}); apierrors.IsNotFound(err) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if _, err := clientset.CoreV1().Pods(ns).Get(ctx, "stuck", metav1.GetOptions{}); err == nil {
				l := getLease(g, ns, "billing")
				t.Errorf("BROKEN: the admitted pod that never started (%s) is still there %s after its admission (start timeout 2 s); "+
					"the Lease: holder %q, token %d, renewed %s ago", edit.name, time.Since(admitted).Round(time.Second), lease.Holder(l),
					lease.Token(l), time.Since(l.Spec.RenewTime.Time).Round(time.Millisecond))
				return
			}
			g.Expect(expectAdmitted(t, ns, "next", "billing", 10*time.Second)).To(Equal(first+1), "the next pod holds the next token")
		})
	}
}

// Promise: a pod deleted while not bound to a node never ran, so its
// grant ends at once; a pod that went without a confirmed stop (a force
// deletion) has its grant waited out, a lease duration unrenewed
// (docs/annotations.md, "Ended"). The controller's cache holds
// participant pods only: a pod whose participant label is removed leaves
// it with a DELETE event showing its last state. If that state was
// unbound (the label removed right after the gate), the controller noted
// "deleted before it was bound", and when the pod, bound and running
// meanwhile, is force-deleted, it ended the grant at once and admitted the
// next pod while the first may still run.
func TestLabelRemovalIsNotTakenForADeletionBeforeBinding(t *testing.T) {
	ns := newNamespace(t)
	const leaseSeconds = 4
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(leaseSeconds).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	letPodsUseLocks(t, ns, "default")
	node := ns + "-node"
	createNode(t, node, true)
	pods := kubernetes.NewForConfigOrDie(podCreatorConfig(t, ns, "pod-creator")).CoreV1().Pods(ns)
	_, err := pods.Create(ctx, testutil.MakeGatedPod("first", ns, "billing"), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	first := expectAdmitted(t, ns, "first", "billing", 10*time.Second)
	// Ungated, not yet bound: the creator removes the participant label.
	_, err = pods.Patch(ctx, "first", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+locksv1alpha1.ParticipantLabel+`":null}}}`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	time.Sleep(500 * time.Millisecond) // the manager's cache sees it go
	bindPod(t, ns, "first", node)      // the scheduler binds it, its kubelet runs it
	_, err = pods.Create(ctx, testutil.MakeGatedPod("second", ns, "billing"), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	time.Sleep(time.Second) // queued behind "first"
	deleted := time.Now()
	g.Expect(pods.Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})).To(Succeed(), "a force deletion")
	second := expectAdmitted(t, ns, "second", "billing", 3*leaseSeconds*time.Second)
	took := time.Since(deleted)
	g.Expect(second).To(Equal(first + 1))
	if took < leaseSeconds*time.Second-500*time.Millisecond {
		t.Errorf("BROKEN: the force-deleted pod, bound and running, had its grant ended %s after the deletion (a lease is %d s): "+
			"the label's removal was taken for a deletion before binding", took.Round(time.Millisecond), leaseSeconds)
	}
}

// Promise (docs/annotations.md, fenced objects): a holder's write with the
// token of its grant lands. The policy reads its params (the lock's Lease)
// from the apiserver's informers, a moment behind etcd: a write sent right
// after the grant may be judged against the Lease before it, and refused
// as "was never granted" (seen in the adversary's long run, under load).
// Retried for a second, it lands: what the docs now tell writers to do.
func TestFencedWriteRightAfterTheGrantLandsWithinASecond(t *testing.T) {
	installFencingPolicy(t)
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(5).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	user := lockUserConfig(t, ns, "writer")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ledger", Namespace: ns, Labels: fencedLabels, Annotations: fenced("billing", "0")}}
	g.Expect(k8sClient.Create(ctx, cm)).To(Succeed())
	eventually(t, 20*time.Second, func(g Gomega) {
		written := &corev1.ConfigMap{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), written)).To(Succeed())
		written.Annotations[locksv1alpha1.FencingTokenAnnotation] = "x"
		err := k8sClient.Update(ctx, written, client.DryRunAll)
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "policy not active yet: %v", err)
	})
	c, err := lock.New(user, lock.Config{Namespace: ns, Name: "billing", Identity: "writer-1"})
	g.Expect(err).NotTo(HaveOccurred())
	refusedFirst := 0
	const rounds = 100
	for i := range rounds {
		gr, err := c.TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}},"data":{"value":"%d"}}`, locksv1alpha1.FencingTokenAnnotation, itoa(gr.Token()), i)
		sent := time.Now()
		for attempt := 0; ; attempt++ {
			_, err = clientset.CoreV1().ConfigMaps(ns).Patch(ctx, "ledger", types.MergePatchType, []byte(body), metav1.PatchOptions{})
			if err == nil || !strings.Contains(err.Error(), "was never granted") || time.Since(sent) > time.Second {
				break
			}
			if attempt == 0 {
				refusedFirst++
			}
			time.Sleep(20 * time.Millisecond)
		}
		g.Expect(err).NotTo(HaveOccurred(), "the holder of token %d, writing with it (retried for a second)", gr.Token())
		g.Expect(gr.Release(ctx)).To(Succeed())
	}
	t.Logf("%d of %d first writes right after the grant were refused as never granted, and landed when retried", refusedFirst, rounds)
}

// docs/annotations.md: the holder marks are the controller's to write,
// but whoever may create or patch pods can put them on a pod of its own.
// The controller takes the lock's marks off every participant pod that is
// not the holder; a pod without the participant label it does not watch,
// and its marks stay (a Service selecting the holder label trusts whoever
// may write pods in the namespace, as every selector does).
func TestMarksAPodCreatorWritesStayOnlyOnPodsTheManagerDoesNotWatch(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	pods := kubernetes.NewForConfigOrDie(podCreatorConfig(t, ns, "pod-creator")).CoreV1().Pods(ns)
	forge := func(name string, participant bool) {
		pod := testutil.MakePod(name, ns, map[string]string{locksv1alpha1.HolderLabelKey("billing"): "true"})
		if !participant {
			delete(pod.Labels, locksv1alpha1.ParticipantLabel)
		}
		pod.Annotations = map[string]string{locksv1alpha1.TokenAnnotationKey("billing"): "99", locksv1alpha1.MayHoldAnnotation: "billing"}
		_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	forge("watched", true)
	forge("unwatched", false)
	eventually(t, 5*time.Second, func(g Gomega) {
		expectMarked(g, ns, "billing", "", 0, "watched")
	})
	g.Consistently(func(g Gomega) {
		p := getPod(g, ns, "unwatched")
		g.Expect(p.Labels).To(HaveKeyWithValue(locksv1alpha1.HolderLabelKey("billing"), "true"))
		g.Expect(p.Annotations).To(HaveKeyWithValue(locksv1alpha1.TokenAnnotationKey("billing"), "99"))
	}).WithTimeout(2 * time.Second).Should(Succeed())
	g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(BeEmpty(), "status names no pod for marks nobody's grant made")
}

// docs/annotations.md: the controller never ungates a pod without a live
// grant whose token it carries; whoever may update the pod can remove the
// gate itself (Kubernetes lets any update remove a scheduling gate), and
// the pod then runs without the lock: nothing is granted for it, its
// token annotation is whatever its writer put there, and fencing refuses
// that token where it is stale or was never granted.
func TestAPodUngatedByItsCreatorHoldsNothing(t *testing.T) {
	installFencingPolicy(t)
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	for _, sa := range []string{"nobody", "default"} {
		_, err := clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue())
	}
	holder, err := lock.New(lockUserConfig(t, ns, "holder"), lock.Config{Namespace: ns, Name: "billing", Identity: "holder-1"})
	g.Expect(err).NotTo(HaveOccurred())
	gr, err := holder.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = gr.Release(ctx) }()
	pods := kubernetes.NewForConfigOrDie(podCreatorConfig(t, ns, "pod-creator")).CoreV1().Pods(ns)
	pod := testutil.MakeGatedPod("impatient", ns, "billing")
	pod.Spec.ServiceAccountName = "nobody"
	pod.Annotations[locksv1alpha1.TokenAnnotationKey("billing")] = itoa(gr.Token() + 1)
	_, err = pods.Create(ctx, pod, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = pods.Patch(ctx, "impatient", types.JSONPatchType, []byte(`[{"op":"remove","path":"/spec/schedulingGates"}]`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "a pod creator may remove the gate of its own pod")
	g.Consistently(func(g Gomega) {
		l := getLease(g, ns, "billing")
		g.Expect(lease.Holder(l)).To(Equal("holder-1"))
		g.Expect(lease.Queue(l)).To(BeEmpty(), "nothing is queued for an ungated pod")
		g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(BeEmpty())
	}).WithTimeout(2 * time.Second).Should(Succeed())
	// The token it was given is one no grant made: a fenced object refuses it.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ledger", Namespace: ns, Labels: fencedLabels,
		Annotations: fenced("billing", itoa(gr.Token()))}}
	g.Expect(k8sClient.Create(ctx, cm)).To(Succeed())
	eventually(t, 20*time.Second, func(g Gomega) { // dry runs, until the policy judges the namespace's objects
		written := &corev1.ConfigMap{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), written)).To(Succeed())
		written.Annotations[locksv1alpha1.FencingTokenAnnotation] = itoa(gr.Token() + 1)
		err := k8sClient.Update(ctx, written, client.DryRunAll)
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(ContainSubstring("was never granted"))
	})
	err = writeConfigMap(ns, "ledger", "from the ungated pod", fenced("billing", itoa(gr.Token()+1)))
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("was never granted"))
	g.Expect(writeConfigMap(ns, "ledger", "from the holder", fenced("billing", itoa(gr.Token())))).To(Succeed(), "the honest path")
}

// Promise (docs/annotations.md, design.md "Security model"): a gated pod
// whose ServiceAccount may not use the lock stays gated, with a
// NotPermitted warning naming the binding to make. The controller warned
// a pod only when it asked the apiserver about its ServiceAccount: the
// answer is remembered, so a second pod of that ServiceAccount, judged on
// the remembered answer, got no warning, and as long as the first waited
// (asked about first in every pass) it never did.
func TestEveryPodNotPermittedIsWarned(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	_, err := clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	pods := kubernetes.NewForConfigOrDie(podCreatorConfig(t, ns, "pod-creator")).CoreV1().Pods(ns)
	for _, name := range []string{"first", "second", "third"} {
		pod := testutil.MakeGatedPod(name, ns, "billing")
		pod.Spec.ServiceAccountName = "nobody"
		_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		time.Sleep(500 * time.Millisecond)
	}
	eventually(t, 15*time.Second, func(g Gomega) {
		for _, name := range []string{"first", "second", "third"} {
			g.Expect(podEventReasons(g, ns, name)).To(ContainElement("NotPermitted"), "pod %s", name)
		}
	})
	for _, name := range []string{"first", "second", "third"} {
		expectGated(g, ns, name, "billing")
	}
}

// Promise (docs/annotations.md): a fenced object's write is denied when
// its token is not a non-negative integer. An empty token annotation was
// taken for none: on an object naming a lock that does not exist (where
// nothing else is compared) it was accepted.
func TestEmptyFencingTokenIsRefused(t *testing.T) {
	installFencingPolicy(t)
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns, Labels: fencedLabels, Annotations: fenced("billing", "x")}}
	eventually(t, 20*time.Second, func(g Gomega) {
		err := k8sClient.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "the fencing policy is not enforced yet: %v", err)
	})
	for _, lockName := range []string{"billing", "no-such-lock"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "empty-" + lockName, Namespace: ns, Labels: fencedLabels,
			Annotations: fenced(lockName, "")}}
		err := k8sClient.Create(ctx, cm)
		g.Expect(err).To(HaveOccurred(), "an empty token on an object fenced by %s", lockName)
		g.Expect(err.Error()).To(ContainSubstring(`must be a non-negative integer, not ""`))
	}
	g.Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "honest", Namespace: ns, Labels: fencedLabels,
		Annotations: fenced("billing", "0")}})).To(Succeed(), "the honest path")
}
