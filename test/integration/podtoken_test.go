package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// newPodParticipant is a participant as a workload really is one: Pod pod
// of ServiceAccount sa in ns (created, with sa bound to roles, by default
// frontdesk-lock-user), whose requests carry a ServiceAccount token bound
// to that pod (a TokenRequest with the pod as its bound object, what
// `kubectl create token SA --bound-object-kind Pod` and a projected volume
// get), and nothing else: no impersonation, no client certificate. Its
// principal is the apiserver's own answer to a SelfSubjectReview with that
// token ("pod=<pod uid> user=system:serviceaccount:<ns>:<sa>"). No kubelet
// runs in the test control plane: the pod stays Pending, which is all a
// bound token needs. Several pods of one ServiceAccount are several
// principals of one user.
func newPodParticipant(t *testing.T, ns, sa, pod string, roles ...string) participant {
	t.Helper()
	deployDefault(t)
	ctx := context.Background()
	g := NewWithT(t)
	if len(roles) == 0 {
		roles = []string{"frontdesk-lock-user"}
	}
	err := k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}})
	g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "creating ServiceAccount %s: %v", sa, err)
	for _, role := range roles {
		err := k8sClient.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + role, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
		})
		g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "binding %s: %v", role, err)
	}
	p, err := clientset.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod},
		Spec: corev1.PodSpec{
			ServiceAccountName:           sa,
			AutomountServiceAccountToken: new(false),
			Containers:                   []corev1.Container{{Name: "main", Image: "frontdesk.invalid/participant:never-pulled"}},
		},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "creating pod %s", pod)
	tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "requesting a token of %s bound to pod %s", sa, pod)
	g.Expect(tr.Status.Token).NotTo(BeEmpty())

	cfg := rest.AnonymousClientConfig(restConfig())
	cfg.BearerToken = tr.Status.Token
	cs, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "a SelfSubjectReview with the token bound to pod %s", pod)
	user := review.Status.UserInfo
	g.Expect(user.Username).To(Equal("system:serviceaccount:" + ns + ":" + sa))
	g.Expect(user.Extra[lease.PodUIDExtra]).To(ConsistOf(string(p.UID)),
		"the apiserver must name the pod a bound token is bound to (the %s user extra): %+v", lease.PodUIDExtra, user.Extra)
	principal := lock.Principal(user)
	g.Expect(principal).To(Equal("pod=" + string(p.UID) + " user=" + user.Username))
	eventually(t, 5*time.Second, func(g Gomega) { // RBAC caches catch up with the new bindings
		can, err := canI(ctx, cfg, ns, "patch", "leases.coordination.k8s.io")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	return participant{name: pod, cfg: cfg, principal: principal, pod: p}
}

// Real pod-bound tokens (not impersonation): two pods of one ServiceAccount
// are two principals; a grant is bound to the pod that took it, and the
// other pod cannot release it.
func TestPodBoundTokensAreThePodsPrincipals(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	pod1 := newPodParticipant(t, ns, "worker", "worker-1")
	pod2 := newPodParticipant(t, ns, "worker", "worker-2")
	g := NewWithT(t)
	g.Expect(pod1.principal).NotTo(Equal(pod2.principal))
	g1, err := pod1.lockClient(t, ns, "billing", "worker-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(pod1.principal))
	refused(g, pod2.lockClient(t, ns, "billing", "worker-1").Release(context.Background()), "and you are "+pod2.principal)
	stillHolds(g, ns, "billing", g1, time.Now())
	g.Expect(g1.Release(context.Background())).To(Succeed())
}
