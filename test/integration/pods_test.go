package integration

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	testutil "github.com/frontdesk-dev/frontdesk/test/util"
)

func createPod(t *testing.T, ns, name string, labels map[string]string, ready bool) *corev1.Pod {
	t.Helper()
	g := NewWithT(t)
	pod := testutil.MakePod(name, ns, labels)
	g.Expect(k8sClient.Create(context.Background(), pod)).To(Succeed())
	setReady(t, pod, ready)
	return pod
}

func setReady(t *testing.T, pod *corev1.Pod, ready bool) {
	t.Helper()
	g := NewWithT(t)
	g.Eventually(func() error {
		fresh := &corev1.Pod{}
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(pod), fresh); err != nil {
			return err
		}
		testutil.SetPodReady(fresh, ready)
		return k8sClient.Status().Update(context.Background(), fresh)
	}).Should(Succeed())
}

func getPod(g Gomega, ns, name string) *corev1.Pod {
	pod := &corev1.Pod{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pod)).To(Succeed())
	return pod
}

// expectMarked checks that exactly the named pod (or none, for "") carries
// the lock's holder label, and that it has the token annotation.
func expectMarked(g Gomega, ns, lockName, holder string, token int64, pods ...string) {
	labelKey := locksv1alpha1.HolderLabelKey(lockName)
	for _, name := range pods {
		pod := getPod(g, ns, name)
		if name == holder {
			g.Expect(pod.Labels).To(HaveKeyWithValue(labelKey, "true"), "pod %s", name)
			g.Expect(pod.Annotations).To(HaveKeyWithValue(locksv1alpha1.TokenAnnotationKey(lockName), itoa(token)), "pod %s", name)
			g.Expect(pod.Annotations).To(HaveKey(locksv1alpha1.AcquiredAnnotationKey(lockName)), "pod %s", name)
		} else {
			g.Expect(pod.Labels).NotTo(HaveKey(labelKey), "pod %s should not be marked", name)
			g.Expect(pod.Annotations).NotTo(HaveKey(locksv1alpha1.TokenAnnotationKey(lockName)), "pod %s", name)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestHolderPodIsAnnotatedAndLabelled(t *testing.T) {
	ns := newNamespace(t)
	createPod(t, ns, "app-0", nil, true)
	createPod(t, ns, "app-1", nil, true)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	ctx := context.Background()

	g0, err := newLockClient(t, ns, "billing", "app-0_aaaa").Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 3*time.Second, func(g Gomega) {
		expectMarked(g, ns, "billing", "app-0", g0.Token(), "app-0", "app-1")
		g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(Equal("app-0"))
	})

	g.Expect(g0.Release(ctx)).To(Succeed())
	g1, err := newLockClient(t, ns, "billing", "app-1_bbbb", func(c *lock.Config) { c.RenewInterval = time.Hour }).Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 3*time.Second, func(g Gomega) {
		expectMarked(g, ns, "billing", "app-1", g1.Token(), "app-0", "app-1")
	})

	// app-1 stops renewing: once the lease lapses, no pod is marked.
	eventually(t, 6*time.Second, func(g Gomega) {
		g.Expect(heldReason(getLock(g, ns, "billing"))).To(Equal(locksv1alpha1.ReasonExpired))
		expectMarked(g, ns, "billing", "", 0, "app-0", "app-1")
		g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(BeEmpty())
	})
}

func TestCandidatesModeHandsOffBetweenReadyPods(t *testing.T) {
	ns := newNamespace(t)
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "c-0", web, true)
	c1 := createPod(t, ns, "c-1", web, true)
	c2 := createPod(t, ns, "c-2", web, true)
	createPod(t, ns, "other", map[string]string{"app": "db"}, true)
	present := []string{"c-0", "c-1", "c-2", "other"}

	l := testutil.MakeLock("leader", ns).LeaseDuration(2).Obj()
	l.Spec.Candidates = &locksv1alpha1.CandidatesSpec{PodSelector: metav1.LabelSelector{MatchLabels: web}}
	createReadyLock(t, l)

	holderIs := func(pod string, token int64) func(g Gomega) {
		return func(g Gomega) {
			lk := getLock(g, ns, "leader")
			g.Expect(lk.Status.HolderPod).To(Equal(pod))
			g.Expect(lk.Status.FencingToken).To(Equal(token))
			g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonHeld))
			expectMarked(g, ns, "leader", pod, token, present...)
		}
	}
	eventually(t, 3*time.Second, holderIs("c-0", 1)) // the oldest Ready candidate (same second: by name)

	setReady(t, c0, false)
	eventually(t, 3*time.Second, holderIs("c-1", 2))

	g := NewWithT(t)
	g.Expect(k8sClient.Delete(context.Background(), c1)).To(Succeed())
	present = []string{"c-0", "c-2", "other"}
	eventually(t, 3*time.Second, holderIs("c-2", 3))

	// c-0 is Ready again, but the holder keeps the lock while it stays
	// Ready: the controller renews it past several lease durations.
	setReady(t, c0, true)
	NewWithT(t).Consistently(holderIs("c-2", 3)).WithTimeout(5 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	setReady(t, c2, false)
	eventually(t, 3*time.Second, holderIs("c-0", 4))

	setReady(t, c0, false)
	eventually(t, 3*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.Holder).To(BeEmpty())
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(4))
		expectMarked(g, ns, "leader", "", 0, "c-0", "c-2", "other")
		g.Expect(eventReasons(g, ns, "leader")).To(ContainElements(controllers.EventHandedOff, controllers.EventCandidateGone))
	})
	err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(c1), &corev1.Pod{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
}

// The shipped samples are accepted as they are, and the downward-API pod
// becomes the leader the Service selects.
func TestCandidateSamplesElectTheDownwardAPIPod(t *testing.T) {
	ns := newNamespace(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	samples := filepath.Join(root, "config", "samples")
	g := NewWithT(t)
	_, err = manifests.CreateFromFiles(context.Background(), k8sClient, ns,
		filepath.Join(samples, "locks_v1alpha1_candidates.yaml"),
		filepath.Join(samples, "leader_pod_downward_api.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	setReady(t, getPod(g, ns, "web-0"), true)

	eventually(t, 5*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "web-leader")
		g.Expect(lk.Status.HolderPod).To(Equal("web-0"))
		expectMarked(g, ns, "web-leader", "web-0", lk.Status.FencingToken, "web-0")
		svc := &corev1.Service{}
		g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-leader"}, svc)).To(Succeed())
		g.Expect(labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(getPod(g, ns, "web-0").Labels))).To(BeTrue(),
			"the Service selects the leader pod")
	})
}
