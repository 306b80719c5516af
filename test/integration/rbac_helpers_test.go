package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// lockUserConfig binds the shipped frontdesk-lock-user ClusterRole to user
// in namespace and returns a config that impersonates that user, once the
// binding is in effect.
func lockUserConfig(t *testing.T, namespace, user string) *rest.Config {
	t.Helper()
	return roleConfig(t, namespace, user, "frontdesk-lock-user", "get")
}

// lockAdminConfig is lockUserConfig with frontdesk-lock-admin too (which
// adds the verbs break and prioritize, and writes nothing by itself).
func lockAdminConfig(t *testing.T, namespace, user string) *rest.Config {
	t.Helper()
	roleConfig(t, namespace, user, "frontdesk-lock-user", "get")
	return roleConfig(t, namespace, user, "frontdesk-lock-admin", "break")
}

// roleConfig binds ClusterRole role to user in namespace and returns a
// config that impersonates that user, once the binding lets it do verb on
// distributedlocks.
func roleConfig(t *testing.T, namespace, user, role, verb string) *rest.Config {
	t.Helper()
	deployDefault(t)
	ctx := context.Background()
	g := NewWithT(t)
	g.Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-" + role, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: user}},
	})).To(Succeed())
	cfg := restConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	eventually(t, 5*time.Second, func(g Gomega) { // RBAC caches catch up with the new binding
		can, err := canI(ctx, cfg, namespace, verb, "distributedlocks.locks.frontdesk.dev")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	return cfg
}

// canI asks the apiserver whether the user of cfg may do verb on resource
// ("pods", or "resource.group") in namespace.
func canI(ctx context.Context, cfg *rest.Config, namespace, verb, resource string) (bool, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false, err
	}
	res, group, _ := strings.Cut(resource, ".")
	review, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: verb, Resource: res, Group: group}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

// eventMessages lists the notes of the Events with the given reason
// recorded on a lock.
func eventMessages(g Gomega, namespace, lockName, reason string) []string {
	var list eventsv1.EventList
	g.Expect(k8sClient.List(context.Background(), &list, client.InNamespace(namespace))).To(Succeed())
	var notes []string
	for _, ev := range list.Items {
		if ev.Regarding.Kind == "DistributedLock" && ev.Regarding.Name == lockName && ev.Reason == reason {
			notes = append(notes, ev.Note)
		}
	}
	return notes
}
