package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// podParticipant is newPodParticipant, named by its ServiceAccount: a pod of
// sa in ns whose requests carry a real token bound to it.
func podParticipant(t *testing.T, ns, sa, pod string, roles ...string) participant {
	t.Helper()
	p := newPodParticipant(t, ns, sa, pod, roles...)
	p.name = sa
	return p
}

// podTokenConfig is a client config whose requests carry a real token bound
// to pod (TokenRequest for its ServiceAccount, created if missing, and
// bound to frontdesk-lock-user in its namespace), as a process in the pod
// would have.
func podTokenConfig(t *testing.T, pod *corev1.Pod) *rest.Config {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	_, err := clientset.CoreV1().ServiceAccounts(pod.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "creating ServiceAccount %s: %v", sa, err)
	letPodsUseLocks(t, pod.Namespace, sa)
	token, err := clientset.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: new(int64(3600)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "requesting a token bound to pod %s", pod.Name)
	cfg := rest.AnonymousClientConfig(restConfig())
	cfg.BearerToken = token.Status.Token
	cfg.QPS = -1
	return cfg
}

// podLockClient is a lock client in pod: its requests carry a token bound
// to the pod (podTokenConfig).
func podLockClient(t *testing.T, pod *corev1.Pod, lockName, identity string, mutate ...func(*lock.Config)) *lock.Client {
	t.Helper()
	cfg := lock.Config{Namespace: pod.Namespace, Name: lockName, Identity: identity}
	for _, m := range mutate {
		m(&cfg)
	}
	c, err := lock.New(podTokenConfig(t, pod), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// deletePod deletes p's pod (at once: no kubelet runs to confirm it) and
// waits until it is gone; p's token stops working with it.
func (p participant) deletePod(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	err := clientset.CoreV1().Pods(p.pod.Namespace).Delete(ctx, p.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting pod %s: %v", p.pod.Name, err)
	}
	eventually(t, 10*time.Second, func(g Gomega) {
		_, err := clientset.CoreV1().Pods(p.pod.Namespace).Get(ctx, p.pod.Name, metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "pod %s still there: %v", p.pod.Name, err)
	})
}
