package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

func createPod(t *testing.T, ns, name string, labels map[string]string, ready bool) *corev1.Pod {
	t.Helper()
	return createPodWith(t, ns, name, labels, nil, ready)
}

// createPodWith creates a pod with annotations too (such as the
// locks.frontdesk.dev/may-hold opt-in to holder marks).
func createPodWith(t *testing.T, ns, name string, labels, annotations map[string]string, ready bool) *corev1.Pod {
	t.Helper()
	g := NewWithT(t)
	pod := testutil.MakePod(name, ns, labels)
	pod.Annotations = annotations
	g.Expect(k8sClient.Create(context.Background(), pod)).To(Succeed())
	setReady(t, pod, ready)
	return pod
}

// mayHold is the annotation by which a pod consents to be marked as the
// holder of the named locks.
func mayHold(locks string) map[string]string {
	return map[string]string{locksv1alpha1.MayHoldAnnotation: locks}
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

// podIdentity is the identity the library builds for a pod from the
// downward API ($POD_NAME, $POD_UID).
func podIdentity(pod *corev1.Pod, suffix string) string {
	return locksv1alpha1.PodIdentity(pod.Name, string(pod.UID), suffix)
}

func TestHolderPodIsAnnotatedAndLabelled(t *testing.T) {
	ns := newNamespace(t)
	app0 := createPodWith(t, ns, "app-0", nil, mayHold("billing"), true)
	app1 := createPodWith(t, ns, "app-1", nil, mayHold("payments, billing"), true)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	ctx := context.Background()

	g0, err := podLockClient(t, app0, "billing", podIdentity(app0, "aaaa")).Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 3*time.Second, func(g Gomega) {
		expectMarked(g, ns, "billing", "app-0", g0.Token(), "app-0", "app-1")
		g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(Equal("app-0"))
	})

	g.Expect(g0.Release(ctx)).To(Succeed())
	g1, err := podLockClient(t, app1, "billing", podIdentity(app1, "bbbb"), func(c *lock.Config) { c.RenewInterval = time.Hour }).Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 3*time.Second, func(g Gomega) {
		expectMarked(g, ns, "billing", "app-1", g1.Token(), "app-0", "app-1")
	})

	// app-1 stops renewing: once its grant lapses (its client then
	// releases the Lease it no longer uses), no pod is marked.
	eventually(t, 6*time.Second, func(g Gomega) {
		g.Expect(heldReason(getLock(g, ns, "billing"))).To(BeElementOf(locksv1alpha1.ReasonExpired, locksv1alpha1.ReasonNotHeld))
		expectMarked(g, ns, "billing", "", 0, "app-0", "app-1")
		g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(BeEmpty())
	})
}

// A workload that may use locks cannot have a pod it does not run marked as
// a lock's holder (and so routed to by a Service selecting the holder
// label) by holding the lock under an identity that names the pod: the
// controller marks a pod only when the identity carries its UID and the pod
// itself consents (locks.frontdesk.dev/may-hold lists the lock). A UID is
// no secret: holder identities in status show them; here the intruder even
// uses the victim's real UID. An identity "victim_..." alone never marks
// pod victim.
func TestLockUserCannotHaveAPodItDoesNotRunMarked(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	victim := createPodWith(t, ns, "victim", map[string]string{"app": "payments"}, mayHold("payments"), true)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	user := lockUserConfig(t, ns, "intruder")

	// The lock user cannot read pods; it could still learn a UID from a
	// holder identity shown in some lock's status.
	can, err := canI(ctx, user, ns, "get", "pods")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(can).To(BeFalse(), "frontdesk-lock-user may read pods")

	for _, forged := range []string{"victim", "victim_1234", podIdentity(victim, "x")} {
		c, err := lock.New(user, lock.Config{Namespace: ns, Name: "billing", Identity: forged})
		g.Expect(err).NotTo(HaveOccurred())
		gr, err := c.TryAcquire(ctx)
		g.Expect(err).NotTo(HaveOccurred(), "identity %q", forged)
		eventually(t, 2*time.Second, func(g Gomega) {
			lk := getLock(g, ns, "billing")
			g.Expect(lk.Status.Holder).To(Equal(forged))
			g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonHeld))
		})
		// Give the controller time to (wrongly) mark; then check it did not.
		NewWithT(t).Consistently(func(g Gomega) {
			expectMarked(g, ns, "billing", "", 0, "victim")
			g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(BeEmpty())
		}).WithTimeout(time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		g.Expect(gr.Release(ctx)).To(Succeed())
	}

	// A pod that consents, held under its own identity, is marked.
	willing := createPodWith(t, ns, "willing", nil, mayHold("billing"), true)
	gr, err := podLockClient(t, willing, "billing", podIdentity(willing, "self")).TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 3*time.Second, func(g Gomega) { expectMarked(g, ns, "billing", "willing", gr.Token(), "willing", "victim") })
}

// Candidates mode revokes first and grants later: when the holder pod stops
// being eligible its marks go at once, and the next candidate is granted
// only once the old pod is gone or the hand-off delay (by default one lease
// duration) has passed since the revocation. Events say which ended the
// wait. The next pod is never granted in the same pass: the old one has
// no grant Context, and may still believe it leads.
func TestCandidatesModeRevokesThenHandsOff(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "c-0", web, true)
	createPod(t, ns, "c-1", web, true)
	c2 := createPod(t, ns, "c-2", web, true)
	createPod(t, ns, "other", map[string]string{"app": "db"}, true)
	present := []string{"c-0", "c-1", "c-2", "other"}

	const lease = 2 * time.Second
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(2).Candidates(web).Obj())
	holderIs := func(pod string, token int64) func(g Gomega) {
		return func(g Gomega) {
			lk := getLock(g, ns, "leader")
			g.Expect(lk.Status.HolderPod).To(Equal(pod))
			g.Expect(lk.Status.FencingToken).To(Equal(token))
			g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonHeld))
			expectMarked(g, ns, "leader", pod, token, present...)
		}
	}
	revokedFrom := func(pod string) func(g Gomega) {
		return func(g Gomega) {
			lk := getLock(g, ns, "leader")
			g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonRevoked))
			g.Expect(locksv1alpha1.PodNameOf(lk.Status.Holder)).To(Equal(pod))
			expectMarked(g, ns, "leader", "", 0, present...)
		}
	}
	// handOffGap is the time between the revocation and the next grant,
	// both written by the controller into the Lease.
	handOffGap := func(revokedAt time.Time) time.Duration {
		l := getLease(g, ns, "leader")
		return l.Spec.AcquireTime.Sub(revokedAt)
	}
	revocationTime := func() time.Time {
		l := getLease(g, ns, "leader")
		g.Expect(l.Annotations).To(HaveKey(locksv1alpha1.RevokedAnnotation))
		return l.Spec.RenewTime.Time
	}
	eventually(t, 3*time.Second, holderIs("c-0", 1)) // the oldest Ready candidate (same second: by name)

	// NotReady: revoked at once, handed off after the delay.
	setReady(t, c0, false)
	eventually(t, 3*time.Second, revokedFrom("c-0"))
	revokedAt := revocationTime()
	eventually(t, 6*time.Second, holderIs("c-1", 2))
	g.Expect(handOffGap(revokedAt)).To(BeNumerically(">=", lease), "handed off before the delay")
	eventually(t, 5*time.Second, func(g Gomega) { // events are recorded after the status write
		g.Expect(eventMessages(g, ns, "leader", controllers.EventHandedOff)).To(ContainElement(ContainSubstring("hand-off delay (2s) passed")))
	})

	// Terminating (a finalizer keeps it, as a kubelet grace period would):
	// not gone, so the delay still applies.
	c1 := getPod(g, ns, "c-1")
	c1.Finalizers = append(c1.Finalizers, "test.frontdesk.dev/linger")
	g.Expect(k8sClient.Update(ctx, c1)).To(Succeed())
	g.Expect(k8sClient.Delete(ctx, c1)).To(Succeed())
	eventually(t, 3*time.Second, revokedFrom("c-1"))
	revokedAt = revocationTime()
	eventually(t, 6*time.Second, holderIs("c-2", 3))
	g.Expect(handOffGap(revokedAt)).To(BeNumerically(">=", lease), "a terminating pod is not gone")
	c1 = getPod(g, ns, "c-1")
	c1.Finalizers = nil
	g.Expect(k8sClient.Update(ctx, c1)).To(Succeed())
	present = []string{"c-0", "c-2", "other"}

	// The holder pod deleted outright: gone, so the hand-off needs no delay.
	setReady(t, c0, true)
	deleted := time.Now()
	g.Expect(k8sClient.Delete(ctx, c2)).To(Succeed())
	present = []string{"c-0", "other"}
	eventually(t, 5*time.Second, holderIs("c-0", 4))
	g.Expect(getLease(g, ns, "leader").Spec.AcquireTime.Time.Sub(deleted)).To(BeNumerically("<", lease),
		"the hand-off waited out the delay although the pod was gone")
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(eventMessages(g, ns, "leader", controllers.EventHandedOff)).To(ContainElement(ContainSubstring("pod c-2 is gone")))
	})

	// The last candidate leaves: released after the delay, nobody marked.
	setReady(t, c0, false)
	eventually(t, 6*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.Holder).To(BeEmpty())
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(4))
		expectMarked(g, ns, "leader", "", 0, present...)
		g.Expect(eventReasons(g, ns, "leader")).To(ContainElements(controllers.EventRevoked, controllers.EventCandidateGone))
	})
}

// spec.candidates.handOffDelaySeconds shortens the wait for users who
// accept the risk: 0 hands off in the pass after the revocation.
func TestCandidatesHandOffDelayIsConfigurable(t *testing.T) {
	ns := newNamespace(t)
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "c-0", web, true)
	createPod(t, ns, "c-1", web, true)
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(30).Candidates(web).HandOffDelay(0).Obj())
	eventually(t, 3*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("c-0"))
	})
	setReady(t, c0, false)
	eventually(t, 3*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.HolderPod).To(Equal("c-1"), "with no delay the hand-off does not wait the 30s lease")
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(2))
	})
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

// The manager watches only participant pods (locks.frontdesk.dev/participant
// =true): a pod the selector picks but that does not take part is neither
// elected in candidates mode nor marked, and a participant is.
func TestOnlyParticipantPodsAreCandidates(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	web := map[string]string{"app": "web"}
	outsider := testutil.MakePod("a-outsider", ns, web) // the oldest, first by name
	delete(outsider.Labels, locksv1alpha1.ParticipantLabel)
	g.Expect(k8sClient.Create(context.Background(), outsider)).To(Succeed())
	setReady(t, outsider, true)
	createPod(t, ns, "b-member", web, true)
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(2).Candidates(web).Obj())
	eventually(t, 3*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.HolderPod).To(Equal("b-member"))
		expectMarked(g, ns, "leader", "b-member", lk.Status.FencingToken, "a-outsider", "b-member")
	})
}

// tappedLeaseWrites are the successful Lease updates of the named Lease that went
// through tap, decoded, with the requests that carried them.
func tappedLeaseWrites(t *testing.T, tap *harness.Tap, ns, name string) ([]coordinationv1.Lease, []harness.Request) {
	t.Helper()
	var leases []coordinationv1.Lease
	var reqs []harness.Request
	for _, r := range tap.Requests() {
		if r.Method != http.MethodPut || r.Path != "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases/"+name || r.Status != http.StatusOK {
			continue
		}
		var l coordinationv1.Lease
		if err := json.Unmarshal(r.Body, &l); err != nil {
			t.Fatalf("a Lease write the test cannot read (%v): %.200s", err, r.Body)
		}
		leases, reqs = append(leases, l), append(reqs, r)
	}
	return leases, reqs
}

// The hand-off delay counts from the revocation's write, not from the start
// of the pass that made it. Here the apiserver is slow to take the removal
// of the old pod's marks (held back 1.5s), which the revocation waits for;
// the next pod is still granted only a full delay (2s) after the
// revocation was answered (counted from the start of the pass, the next
// grant would come 1.5s early).
func TestCandidatesHandOffDelayCountsFromTheRevocationWrite(t *testing.T) {
	tap := harness.NewTap()
	withManagerThrough(t, tap)
	ns := newNamespace(t)
	g := NewWithT(t)
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "c-0", web, true)
	c1 := createPod(t, ns, "c-1", web, true)
	const delay, slow = 2 * time.Second, 1500 * time.Millisecond
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(2).Candidates(web).Obj())
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("c-0")) })

	var held atomic.Bool
	tap.Decide(func(r *harness.Request) harness.Action {
		unmark := r.Method == http.MethodPatch && r.Path == "/api/v1/namespaces/"+ns+"/pods/c-0" && r.BodyContains("null")
		if unmark && held.CompareAndSwap(false, true) {
			return harness.Action{Delay: slow}
		}
		return harness.Action{}
	})
	setReady(t, c0, false)
	next := locksv1alpha1.PodIdentity(c1.Name, string(c1.UID), "")
	eventually(t, 10*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.Holder).To(Equal(next))
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(2))
	})
	g.Expect(held.Load()).To(BeTrue(), "the removal of c-0's marks was never held back")

	leases, reqs := tappedLeaseWrites(t, tap, ns, "leader")
	revoked := slices.IndexFunc(leases, func(l coordinationv1.Lease) bool {
		return l.Annotations[locksv1alpha1.RevokedAnnotation] != ""
	})
	granted := slices.IndexFunc(leases, func(l coordinationv1.Lease) bool { return ptr.Deref(l.Spec.HolderIdentity, "") == next })
	g.Expect(revoked).To(BeNumerically(">=", 0), "no revocation went through the tap")
	g.Expect(granted).To(BeNumerically(">", revoked), "no grant to c-1 after the revocation")
	// The revocation was stored before its answer came; the grant after it
	// was sent: this gap is at most the one between the two writes.
	gap := reqs[granted].Sent.Sub(reqs[revoked].Answered)
	g.Expect(gap).To(BeNumerically(">=", delay), "c-1 was granted %s after the revocation was answered", gap)
	unmarked := slices.IndexFunc(podPatches(tap, ns, "c-0"), func(r harness.Request) bool { return r.BodyContains("null") })
	t.Logf("revocation answered %s after the removal of the marks was sent; grant sent %s after the revocation was answered",
		reqs[revoked].Answered.Sub(podPatches(tap, ns, "c-0")[unmarked].Sent).Round(time.Millisecond), gap.Round(time.Millisecond))
}

// A pod replaced by one of the same name (as a StatefulSet replaces it)
// while the controller's cache still shows the old one is not marked in its
// place: the marks' patch carries the UID the controller checked, and the
// apiserver refuses it (a patch by name alone would give the new pod the
// holder label and a token that is not its own).
func TestMarksDoNotLandOnAReplacementPodOfTheSameName(t *testing.T) {
	tap := harness.NewTap()
	podWatch := harness.NewGate()
	tap.Decide(func(r *harness.Request) harness.Action {
		if r.Method == http.MethodGet && strings.HasSuffix(r.Path, "/pods") && strings.Contains(r.Query, "watch=true") {
			return harness.Action{Gate: podWatch}
		}
		return harness.Action{}
	})
	withManagerThrough(t, tap)
	t.Cleanup(podWatch.Open)
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	old := createPodWith(t, ns, "app-0", nil, mayHold("billing"), true)

	// Marked while it holds: the manager's cache has the pod.
	first, err := podLockClient(t, old, "billing", podIdentity(old, "a")).Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 5*time.Second, func(g Gomega) { expectMarked(g, ns, "billing", "app-0", first.Token(), "app-0") })
	g.Expect(first.Release(ctx)).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) { expectMarked(g, ns, "billing", "", 0, "app-0") })

	// The cache falls behind; the pod is replaced under the same name.
	podWatch.Shut()
	g.Expect(k8sClient.Delete(ctx, old)).To(Succeed())
	replacement := createPodWith(t, ns, "app-0", nil, mayHold("billing"), true)
	g.Expect(replacement.UID).NotTo(Equal(old.UID))
	patchesBefore := len(podPatches(tap, ns, "app-0"))

	// The old pod holds the lock again (its process outlived the pod, here
	// through impersonation: its own token stopped working with the pod):
	// the controller, reading the old pod from its cache, marks "app-0".
	ghost := restConfig()
	ghost.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":default",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		Extra:  map[string][]string{lease.PodUIDExtra: {string(old.UID)}}}
	ghostClient, err := lock.New(ghost, lock.Config{Namespace: ns, Name: "billing", Identity: podIdentity(old, "b"), RenewInterval: time.Hour})
	g.Expect(err).NotTo(HaveOccurred())
	second, err := ghostClient.Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(len(podPatches(tap, ns, "app-0"))).To(BeNumerically(">", patchesBefore), "the controller never tried to mark app-0")
	})
	g.Consistently(func(g Gomega) {
		expectMarked(g, ns, "billing", "", 0, "app-0")
	}).WithTimeout(time.Second).WithPolling(50*time.Millisecond).Should(Succeed(),
		"the replacement pod carries the marks of grant %d, held by its predecessor's identity", second.Token())
	for _, p := range podPatches(tap, ns, "app-0")[patchesBefore:] {
		g.Expect(p.Status).NotTo(Equal(http.StatusOK), "a mark patch was accepted: %s", p.Body)
	}
	podWatch.Open()
}

// podPatches are the patches of the named pod that went through tap.
func podPatches(tap *harness.Tap, ns, name string) []harness.Request {
	return slices.DeleteFunc(tap.Requests(), func(r harness.Request) bool {
		return r.Method != http.MethodPatch || r.Path != "/api/v1/namespaces/"+ns+"/pods/"+name
	})
}
