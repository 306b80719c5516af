//go:build e2e

package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

const webHolderLabel = "holder.locks.frontdesk.dev/web-leader"

// TestHolderDownwardAPIAndService: the holder pod reads its fencing token
// from a downward API file that the kubelet keeps up to date with the token
// annotation the controller writes, the other pod's file stays empty, and
// a Service selecting the holder label routes to the holder pod only;
// after the holder is deleted, the same holds for the next holder, with a
// higher token, in a pod that was already running (the file changed in
// place).
func TestHolderDownwardAPIAndService(t *testing.T) {
	c := start(t, "downward")
	g := NewWithT(t)
	c.applyFile("web.yaml")
	c.waitRollout("web", 3*time.Minute)

	first, firstToken := c.webHolder(g)
	c.stepf("holder %s, token %d", first, firstToken)
	c.expectHolderServed(g, first, firstToken)

	c.stepf("deleting the holder pod %s", first)
	deletedAt := time.Now()
	c.kubectlOK("-n", c.ns, "delete", "pod", first, "--wait=false")
	var second string
	var secondToken int64
	g.Eventually(func(g Gomega) {
		l, err := c.lock("web-leader")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.HolderPod).NotTo(Or(BeEmpty(), Equal(first)))
		g.Expect(l.Status.FencingToken).To(BeNumerically(">", firstToken))
		second, secondToken = l.Status.HolderPod, l.Status.FencingToken
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	c.stepf("new holder %s, token %d", second, secondToken)
	pod, err := c.cs.CoreV1().Pods(c.ns).Get(c.ctx, second, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	// The oldest Ready candidate is the pod that ran beside the first holder,
	// so its token file changes in place, with no restart.
	g.Expect(pod.CreationTimestamp.Time).To(BeTemporally("<", deletedAt), "the new holder was already running")
	g.Expect(pod.Status.ContainerStatuses[0].RestartCount).To(BeZero())
	c.expectHolderServed(g, second, secondToken)
}

// webHolder waits for web-leader to be held by a Ready pod that carries the
// holder marks, and returns it with its token.
func (t *tc) webHolder(g *WithT) (string, int64) {
	var holder string
	var token int64
	g.Eventually(func(g Gomega) {
		l, err := t.lock("web-leader")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.HolderPod).NotTo(BeEmpty())
		g.Expect(l.Status.FencingToken).To(BeNumerically(">", 0))
		pod, err := t.cs.CoreV1().Pods(t.ns).Get(t.ctx, l.Status.HolderPod, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(isReady(pod)).To(BeTrue(), "the holder pod is Ready")
		g.Expect(pod.Labels).To(HaveKeyWithValue(webHolderLabel, "true"))
		g.Expect(pod.Annotations).To(HaveKeyWithValue(locksv1alpha1.TokenAnnotationKey("web-leader"), strconv.FormatInt(l.Status.FencingToken, 10)))
		holder, token = l.Status.HolderPod, l.Status.FencingToken
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	return holder, token
}

// expectHolderServed checks, each within a deadline: the holder's downward
// API file shows its token, every other running web pod's file is empty, the
// Service's endpoints are the holder's address alone, and requests through
// the Service from a pod reach the holder only.
func (t *tc) expectHolderServed(g *WithT, holder string, token int64) {
	want := strconv.FormatInt(token, 10)
	// The kubelet rewrites downward API files on its sync period (up to
	// about a minute plus its cache's TTL).
	g.Eventually(func() string {
		out, _ := t.exec(holder, "cat", "/etc/frontdesk/token")
		return out
	}).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(Equal(want), "the holder's /etc/frontdesk/token")
	t.stepf("%s reads token %s from /etc/frontdesk/token", holder, want)

	pods, err := t.pods("app=web")
	g.Expect(err).NotTo(HaveOccurred())
	var client string
	for _, p := range pods {
		if p.Name == holder || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		client = p.Name
		g.Eventually(func() string {
			out, _ := t.exec(p.Name, "cat", "/etc/frontdesk/token")
			return out
		}).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(BeEmpty(), "%s is not the holder: its token file is empty", p.Name)
	}

	holderPod, err := t.cs.CoreV1().Pods(t.ns).Get(t.ctx, holder, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		slices, err := t.cs.DiscoveryV1().EndpointSlices(t.ns).List(t.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web-leader"})
		g.Expect(err).NotTo(HaveOccurred())
		var addrs []string
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					addrs = append(addrs, e.Addresses...)
				}
			}
		}
		g.Expect(addrs).To(ConsistOf(holderPod.Status.PodIP), "the Service's endpoints")
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	if client == "" {
		client = holder
	}
	// Ten requests through the Service (CoreDNS, kube-proxy) all reach the
	// holder, and it answers with its token. (busybox's wget crashes with
	// -T, hence timeout.)
	g.Eventually(func(g Gomega) {
		for range 10 {
			out, err := t.exec(client, "timeout", "5", "wget", "-q", "-O", "-", "http://web-leader/")
			g.Expect(err).NotTo(HaveOccurred(), out)
			g.Expect(strings.TrimSpace(out)).To(Equal(holder+" "+want), "answered through the Service")
		}
	}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	t.stepf("the Service routes to %s only", holder)
}
