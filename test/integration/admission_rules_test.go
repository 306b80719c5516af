package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A user who may create pods and nothing else (no lock, no Lease) created a
// pod annotated runs-holding, running as a ServiceAccount that may not use
// locks, and the controller queued and granted it. A pod now runs holding
// a lock only if its ServiceAccount may use the lock itself.
func TestPodAdmissionNeedsTheServiceAccountsRights(t *testing.T) {
	ns := guardedNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	ctx := context.Background()
	g := NewWithT(t)
	for _, sa := range []string{"nobody", "worker"} {
		_, err := clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	letPodsUseLocks(t, ns, "worker")
	// The pod creator: pods, nothing else.
	g.Expect(k8sClient.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-creator", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get"}}}})).To(Succeed())
	g.Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pod-creator", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-creator"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "pod-creator"}}})).To(Succeed())
	creator := restConfig()
	creator.Impersonate = rest.ImpersonationConfig{UserName: "pod-creator"}
	pods := kubernetes.NewForConfigOrDie(creator).CoreV1().Pods(ns)
	eventually(t, 5*time.Second, func(g Gomega) {
		can, err := canI(ctx, creator, ns, "create", "pods")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	sneaky := testutil.MakeGatedPod("sneaky", ns, "billing")
	sneaky.Spec.ServiceAccountName = "nobody"
	_, err := pods.Create(ctx, sneaky, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(podEventReasons(g, ns, "sneaky")).To(ContainElement("NotPermitted"))
	})
	g.Consistently(func(g Gomega) {
		expectGated(g, ns, "sneaky", "billing")
		g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(BeEmpty(), "the controller queued a pod whose ServiceAccount may not use the lock")
		g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(BeEmpty())
	}).WithTimeout(3 * time.Second).Should(Succeed())

	// The honest path: the same creator, a ServiceAccount allowed the lock.
	honest := testutil.MakeGatedPod("honest", ns, "billing")
	honest.Spec.ServiceAccountName = "worker"
	_, err = pods.Create(ctx, honest, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(expectAdmitted(t, ns, "honest", "billing", 10*time.Second)).To(BeNumerically(">", 0))
	expectGated(g, ns, "sneaky", "billing")
}

// An admitted pod that never started (an unsatisfiable node selector, say)
// held its lock for ever, renewed by the controller. Once it has gone
// unstarted for the lock's podStartTimeoutSeconds, the controller deletes
// it, and since it was never bound its grant ends at once: the next pod is
// admitted with the next token. A pod that is bound but whose containers
// have not started is deleted too, and its grant is kept until it is
// proven gone.
func TestAdmittedPodThatNeverStartsIsDeleted(t *testing.T) {
	ns := newNamespace(t)
	lk := testutil.MakeLock("billing", ns).LeaseDuration(3).Obj()
	lk.Spec.PodStartTimeoutSeconds = 2
	createReadyLock(t, lk)
	g := NewWithT(t)
	node := ns + "-node"
	createNode(t, node, true)
	gatedPod(t, ns, "stuck", "billing")
	gatedPod(t, ns, "next", "billing")
	first := expectAdmitted(t, ns, "stuck", "billing", 10*time.Second)
	admitted := time.Now()
	eventually(t, 10*time.Second, func(g Gomega) {
		_, err := clientset.CoreV1().Pods(ns).Get(context.Background(), "stuck", metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the unstarted pod is still there: %v", err)
	})
	g.Expect(time.Since(admitted)).To(BeNumerically(">=", 2*time.Second-100*time.Millisecond), "deleted before its start timeout")
	g.Expect(expectAdmitted(t, ns, "next", "billing", 10*time.Second)).To(Equal(first+1), "the next pod holds the next token")
	// "next" is bound to a node that reports, but never starts: deleted,
	// and its grant kept while the pod (terminating: no kubelet here
	// confirms its stop) may still run.
	bound := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "next"}}
	g.Expect(k8sClient.SubResource("binding").Create(context.Background(), bound, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "next"}, Target: corev1.ObjectReference{Kind: "Node", Name: node}})).To(Succeed())
	g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("PodStartTimedOut"))
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(getPod(g, ns, "next").DeletionTimestamp).NotTo(BeNil(), "the bound, unstarted pod is not being deleted")
	})
	g.Consistently(func(g Gomega) {
		g.Expect(lease.Token(getLease(g, ns, "billing"))).To(Equal(first+1), "the grant of a pod that may still run must stay")
		g.Expect(lease.Holder(getLease(g, ns, "billing"))).NotTo(BeEmpty())
	}).WithTimeout(2 * time.Second).Should(Succeed())
}
