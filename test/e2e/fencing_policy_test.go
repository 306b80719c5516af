//go:build e2e

package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// TestFencingPolicyRefusesStaleWriter: a writer pod in the cluster (its own
// ServiceAccount, kubectl, through the kubernetes Service) is refused by the
// apiserver when it writes with a stale fencing token:
//   - config/fencing-policy: creating a fenced ConfigMap with a token older
//     than the lock's current one is denied, with the current token admitted;
//   - config/default's Lease policy: lowering the lock's Lease token, or
//     naming a new holder on it without a new token, is denied, though the
//     pod may update Leases (frontdesk-lock-user).
func TestFencingPolicyRefusesStaleWriter(t *testing.T) {
	c := start(t, "fencing")
	g := NewWithT(t)
	c.stepf("applying config/fencing-policy")
	c.kubectlOK("apply", "--server-side", "-k", "config/fencing-policy")
	// Its binding covers every namespace, and refuses ConfigMap writes in
	// one that has no lock (kube-root-ca.crt too, which pods mount): the
	// tests after this one get a cluster without it.
	t.Cleanup(func() { c.kubectlOK("delete", "--ignore-not-found", "-k", "config/fencing-policy") })
	c.applyFile("fencing.yaml")

	// Two grants, from this process with the client library: the first
	// holder's token is now stale.
	tokens := make([]int64, 2)
	for i, identity := range []string{"writer-a", "writer-b"} {
		lc, err := lock.New(c.restConfig, lock.Config{Namespace: c.ns, Name: "fenced", Identity: identity})
		g.Expect(err).NotTo(HaveOccurred())
		var grant *lock.Grant
		g.Eventually(func() error {
			var err error
			grant, err = lc.TryAcquire(c.ctx)
			return err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "%s acquires", identity)
		tokens[i] = grant.Token()
		g.Expect(lc.Release(c.ctx)).To(Succeed())
	}
	stale, current := tokens[0], tokens[1]
	g.Expect(current).To(BeNumerically(">", stale))
	c.stepf("tokens: stale %d, current %d", stale, current)
	g.Eventually(func() (int64, error) {
		l, err := c.lock("fenced")
		return l.Status.FencingToken, err
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(current), "the lock's status records the current token")

	// The policy takes effect once the apiserver has loaded it: wait for a
	// server-side dry run of the stale write to be refused.
	g.Eventually(func() error {
		_, err := c.cs.CoreV1().ConfigMaps(c.ns).Create(c.ctx, fencedConfigMap("probe", stale), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(MatchError(ContainSubstring("stale fencing token")))

	c.stepf("the writer pod writes with both tokens")
	c.applyFile("fencing-writer.yaml", "STALE_TOKEN", strconv.FormatInt(stale, 10), "CURRENT_TOKEN", strconv.FormatInt(current, 10))
	g.Eventually(func() (corev1.PodPhase, error) {
		p, err := c.cs.CoreV1().Pods(c.ns).Get(c.ctx, "writer", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return p.Status.Phase, nil
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Equal(corev1.PodSucceeded), "the writer pod completes")
	logs := c.kubectlOK("-n", c.ns, "logs", "writer")
	c.stepf("writer pod:\n%s", strings.TrimSpace(logs))
	g.Expect(logs).To(MatchRegexp(`stale write: refused: .*stale fencing token %d for DistributedLock fenced: its current fencing token is %d`, stale, current),
		"the apiserver refuses the stale writer, saying why")
	g.Expect(logs).To(ContainSubstring("current write: accepted"))

	_, err := c.cs.CoreV1().ConfigMaps(c.ns).Get(c.ctx, "stale", metav1.GetOptions{})
	g.Expect(err).To(HaveOccurred(), "no ConfigMap was written with the stale token")
	cm, err := c.cs.CoreV1().ConfigMaps(c.ns).Get(c.ctx, "current", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cm.Annotations).To(HaveKeyWithValue(locksv1alpha1.FencingTokenAnnotation, strconv.FormatInt(current, 10)))
	g.Expect(cm.Data).To(HaveKeyWithValue("writer", "writer"))

	g.Expect(logs).To(MatchRegexp(`lease token lowered: refused: .*may never decrease \(from %d to %d\)`, current, stale))
	g.Expect(logs).To(MatchRegexp(`lease holder without a new token: refused: .*DistributedLock fenced is free: take it by raising spec.leaseTransitions from %d to %d and naming a holder in the same write`, current, current+1))
	lease, err := c.cs.CoordinationV1().Leases(c.ns).Get(c.ctx, "fenced", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Spec.LeaseTransitions).To(HaveValue(BeEquivalentTo(current)), "the Lease keeps the current token")
	if lease.Spec.HolderIdentity != nil {
		g.Expect(*lease.Spec.HolderIdentity).NotTo(Equal("writer-stale"))
	}
}

func fencedConfigMap(name string, token int64) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{locksv1alpha1.FencedLabel: "true"},
		Annotations: map[string]string{
			locksv1alpha1.FencingLockAnnotation:  "fenced",
			locksv1alpha1.FencingTokenAnnotation: strconv.FormatInt(token, 10),
		},
	}}
}
