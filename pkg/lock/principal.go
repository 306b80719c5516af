package lock

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podUIDExtra is the user extra a ServiceAccount token bound to a pod
// carries: the pod's UID.
const podUIDExtra = "authentication.kubernetes.io/pod-uid"

// Principal is who a request comes from, as the lease-guard and
// lease-principal admission policies record it on a grant
// (locks.frontdesk.dev/holder-principal) and on a place in the queue
// (queued-by.locks.frontdesk.dev/<ticket>): "pod=<pod uid> user=<username>"
// for a token bound to a pod, else "user=<username>".
func Principal(user authenticationv1.UserInfo) string {
	if uids := user.Extra[podUIDExtra]; len(uids) > 0 {
		return "pod=" + uids[0] + " user=" + user.Username
	}
	return "user=" + user.Username
}

// selfPrincipal is this client's principal, asked of the apiserver once (a
// SelfSubjectReview, which every authenticated user may make) and then
// remembered.
func (c *Client) selfPrincipal(ctx context.Context) (string, error) {
	c.mu.Lock()
	known := c.principal
	c.mu.Unlock()
	if known != "" {
		return known, nil
	}
	review, err := c.reviews.Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking the apiserver who this client is: %w", err)
	}
	principal := Principal(review.Status.UserInfo)
	c.mu.Lock()
	c.principal = principal
	c.mu.Unlock()
	return principal, nil
}
