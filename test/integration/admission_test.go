package integration

// Lock-admitted pods (annotation locks.frontdesk.dev/runs-holding and the
// scheduling gate locks.frontdesk.dev/admission). No kubelet or scheduler
// runs here: the tests bind pods and write their status as they would.

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// gatedPod creates a pod that runs holding lockName: the participant label,
// the runs-holding annotation, the admission gate and FENCING_TOKEN from
// the token annotation.
func gatedPod(t *testing.T, ns, name, lockName string) {
	t.Helper()
	letPodsUseLocks(t, ns, "default")
	pod := testutil.MakeGatedPod(name, ns, lockName)
	NewWithT(t).Expect(k8sClient.Create(context.Background(), pod)).To(Succeed())
}

// podsMayUseLocks remembers the ServiceAccounts letPodsUseLocks bound.
var podsMayUseLocks sync.Map

// letPodsUseLocks binds frontdesk-lock-user to ServiceAccount sa of ns (a
// pod runs holding a lock only if its ServiceAccount may use the lock), and
// waits until the binding is in effect.
func letPodsUseLocks(t *testing.T, ns, sa string) {
	t.Helper()
	if _, done := podsMayUseLocks.LoadOrStore(ns+"/"+sa, true); done {
		return
	}
	deployDefault(t)
	ctx := context.Background()
	g := NewWithT(t)
	err := k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa + "-lock-user", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "frontdesk-lock-user"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	})
	g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "binding frontdesk-lock-user to %s/%s: %v", ns, sa, err)
	as := restConfig()
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	eventually(t, 5*time.Second, func(g Gomega) {
		can, err := canI(ctx, as, ns, "update", "leases.coordination.k8s.io")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
}

// expectAdmitted waits until the pod's gate is gone and returns its token
// annotation, checking the annotation was there by then.
func expectAdmitted(t *testing.T, ns, name, lockName string, within time.Duration) int64 {
	t.Helper()
	var token int64
	eventually(t, within, func(g Gomega) {
		pod := getPod(g, ns, name)
		g.Expect(pod.Spec.SchedulingGates).To(BeEmpty(), "pod %s still gated", name)
		v, ok := pod.Annotations[locksv1alpha1.TokenAnnotationKey(lockName)]
		g.Expect(ok).To(BeTrue(), "pod %s ungated without its token annotation", name)
		var err error
		token, err = strconv.ParseInt(v, 10, 64)
		g.Expect(err).NotTo(HaveOccurred())
	})
	return token
}

// expectGated checks that the pod still carries the gate and no token.
func expectGated(g Gomega, ns, name, lockName string) {
	pod := getPod(g, ns, name)
	g.ExpectWithOffset(1, pod.Spec.SchedulingGates).To(ContainElement(corev1.PodSchedulingGate{Name: locksv1alpha1.AdmissionGate}), "pod %s", name)
	g.ExpectWithOffset(1, pod.Annotations).NotTo(HaveKey(locksv1alpha1.TokenAnnotationKey(lockName)), "pod %s", name)
}

// bindPod binds the pod to node, as the scheduler does, and reports it
// Running, as its kubelet would.
func bindPod(t *testing.T, ns, name, node string) {
	t.Helper()
	g := NewWithT(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	g.Expect(k8sClient.SubResource("binding").Create(context.Background(), pod, binding)).To(Succeed())
	setPhase(t, ns, name, corev1.PodRunning)
}

// setPhase writes the pod's phase as its kubelet would (field manager
// kubelet).
func setPhase(t *testing.T, ns, name string, phase corev1.PodPhase) {
	t.Helper()
	NewWithT(t).Eventually(func() error {
		fresh := &corev1.Pod{}
		if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, fresh); err != nil {
			return err
		}
		fresh.Status.Phase = phase
		if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			stopContainers(fresh)
		}
		return k8sClient.Status().Update(context.Background(), fresh, client.FieldOwner("kubelet"))
	}).Should(Succeed())
}

// stopContainers reports every container of p terminated, as its kubelet
// does once they stopped.
func stopContainers(p *corev1.Pod) {
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}},
		})
	}
}

// containersStoppedByKubelet writes the pod's status as its kubelet does
// when its containers stopped during a graceful deletion.
func containersStoppedByKubelet(t *testing.T, ns, name string) {
	t.Helper()
	NewWithT(t).Eventually(func() error {
		fresh := &corev1.Pod{}
		if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, fresh); err != nil {
			return err
		}
		stopContainers(fresh)
		return k8sClient.Status().Update(context.Background(), fresh, client.FieldOwner("kubelet"))
	}).Should(Succeed())
}

// createNode creates a node with its Ready condition, as a kubelet reports
// it; the node is deleted with the test.
func createNode(t *testing.T, name string, ready bool) {
	t.Helper()
	g := NewWithT(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	g.Expect(k8sClient.Create(context.Background(), node)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), node) })
	setNodeReady(t, name, ready)
}

func setNodeReady(t *testing.T, name string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	NewWithT(t).Eventually(func() error {
		node := &corev1.Node{}
		if err := k8sClient.Get(context.Background(), client.ObjectKey{Name: name}, node); err != nil {
			return err
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		return k8sClient.Status().Update(context.Background(), node)
	}).Should(Succeed())
}

// podEventReasons lists the reasons of the Events recorded on a pod.
func podEventReasons(g Gomega, ns, name string) []string {
	var list eventsv1.EventList
	g.Expect(k8sClient.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, ev := range list.Items {
		if ev.Regarding.Kind == "Pod" && ev.Regarding.Name == name {
			reasons = append(reasons, ev.Reason)
		}
	}
	return reasons
}

// Gated pods are admitted one at a time, oldest first, each with a higher
// token, the next at once when the previous one Succeeded; status shows the
// holder pod and the pods waiting. The controller renews the grant of a
// running pod past its lease duration (it does not lapse its own grant).
func TestGatedPodsAreAdmittedOneAtATimeInCreationOrder(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	node := "node-" + ns
	createNode(t, node, true)
	for _, name := range []string{"a", "b", "c"} {
		gatedPod(t, ns, name, "billing")
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has a resolution of a second
	}
	tokenA := expectAdmitted(t, ns, "a", "billing", 10*time.Second)
	eventually(t, 10*time.Second, func(g Gomega) {
		st := getLock(g, ns, "billing").Status
		g.Expect(st.HolderPod).To(Equal("a"))
		g.Expect(st.GatedPods).To(Equal(int32(2)))
		g.Expect(st.OldestGatedPod).To(Equal("b"))
		g.Expect(st.FencingToken).To(Equal(tokenA))
	})
	bindPod(t, ns, "a", node)
	g := NewWithT(t)
	renewedSince := time.Now()
	g.Consistently(func(g Gomega) {
		expectGated(g, ns, "b", "billing")
		expectGated(g, ns, "c", "billing")
		g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(HavePrefix("a_"))
	}).WithTimeout(5 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	g.Expect(getLease(g, ns, "billing").Spec.RenewTime.Time).To(BeTemporally(">", renewedSince), "the controller renews the admitted grant")

	setPhase(t, ns, "a", corev1.PodSucceeded)
	tokenB := expectAdmitted(t, ns, "b", "billing", 10*time.Second)
	g.Expect(tokenB).To(BeNumerically(">", tokenA))
	expectGated(g, ns, "c", "billing")
	setPhase(t, ns, "b", corev1.PodFailed)
	tokenC := expectAdmitted(t, ns, "c", "billing", 10*time.Second)
	g.Expect(tokenC).To(BeNumerically(">", tokenB))
	eventually(t, 10*time.Second, func(g Gomega) {
		st := getLock(g, ns, "billing").Status
		g.Expect(st.HolderPod).To(Equal("c"))
		g.Expect(st.GatedPods).To(BeZero())
		reasons := eventReasons(g, ns, "billing")
		g.Expect(countOf(reasons, "PodAdmitted")).To(Equal(3), "%v", reasons)
		g.Expect(countOf(reasons, "PodReleased")).To(Equal(2), "%v", reasons)
		g.Expect(podEventReasons(g, ns, "c")).To(ContainElement("PodAdmitted"))
		expectMarked(g, ns, "billing", "c", tokenC, "a", "b", "c")
	})
}

// startLockRun starts `kubectl dlock run billing` with a command that
// writes "<tag> $FENCING_TOKEN" to out, then waits until release exists.
func startLockRun(t *testing.T, ns, identity, out, release string) func() int {
	t.Helper()
	cmd := pluginCommand(t, ns, "run", "billing", "--identity", identity, "--wait", "60s", "--",
		"sh", "-c", `echo "$FENCING_TOKEN" > "$0.tmp" && mv "$0.tmp" "$0"; while [ ! -e "$1" ]; do sleep 0.05; done`, out, release)
	NewWithT(t).Expect(cmd.Start()).To(Succeed())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return func() int { return exitCode(t, cmd.Wait()) }
}

func readToken(g Gomega, path string) int64 {
	raw, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	token, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	g.Expect(err).NotTo(HaveOccurred())
	return token
}

// A gated pod waits behind a `kubectl dlock run` that holds the lock, and a
// `kubectl dlock run` that queued behind an admitted pod waits until the pod
// is finished: they exclude each other both ways, in one FIFO, and the
// tokens rise across both.
func TestGatedPodAndKubectlLockRunExcludeEachOther(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	dir := t.TempDir()
	first, firstDone := filepath.Join(dir, "first"), filepath.Join(dir, "first-done")
	waitFirst := startLockRun(t, ns, "cli-1", first, firstDone)
	var token1 int64
	eventually(t, 15*time.Second, func(g Gomega) { token1 = readToken(g, first) })

	gatedPod(t, ns, "job", "billing")
	g := NewWithT(t)
	g.Consistently(func(g Gomega) { expectGated(g, ns, "job", "billing") }).
		WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	g.Expect(os.WriteFile(firstDone, nil, 0o600)).To(Succeed())
	g.Expect(waitFirst()).To(Equal(0))
	tokenPod := expectAdmitted(t, ns, "job", "billing", 10*time.Second)
	g.Expect(tokenPod).To(BeNumerically(">", token1))

	second, secondDone := filepath.Join(dir, "second"), filepath.Join(dir, "second-done")
	g.Expect(os.WriteFile(secondDone, nil, 0o600)).To(Succeed())
	waitSecond := startLockRun(t, ns, "cli-2", second, secondDone)
	g.Consistently(func() bool { _, err := os.Stat(second); return os.IsNotExist(err) }).
		WithTimeout(3*time.Second).WithPolling(100*time.Millisecond).Should(BeTrue(), "kubectl dlock run ran while the pod held the lock")

	setPhase(t, ns, "job", corev1.PodSucceeded)
	g.Expect(waitSecond()).To(Equal(0))
	g.Expect(readToken(g, second)).To(BeNumerically(">", tokenPod))
}

// admittedRunningPod creates a lock with the given lease duration, a
// reporting node and a pod admitted, bound to it and running, with a
// second gated pod behind it; it returns the namespace, the node and the
// first pod's token.
func admittedRunningPod(t *testing.T, seconds int32) (ns, node string, token int64) {
	t.Helper()
	ns = newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(seconds).Obj())
	node = "node-" + ns
	createNode(t, node, true)
	gatedPod(t, ns, "first", "billing")
	token = expectAdmitted(t, ns, "first", "billing", 10*time.Second)
	bindPod(t, ns, "first", node)
	gatedPod(t, ns, "next", "billing")
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "billing").Status.GatedPods).To(Equal(int32(1))) })
	return ns, node, token
}

// expectNextAdmittedAfter checks that the next pod is admitted, with a
// higher token, no sooner than min after from and within max of it.
func expectNextAdmittedAfter(t *testing.T, ns string, token int64, from time.Time, minWait, maxWait time.Duration) {
	t.Helper()
	g := NewWithT(t)
	if minWait > 0 {
		g.Consistently(func(g Gomega) { expectGated(g, ns, "next", "billing") }).
			WithTimeout(minWait - 200*time.Millisecond).WithPolling(100 * time.Millisecond).Should(Succeed())
	}
	next := expectAdmitted(t, ns, "next", "billing", maxWait)
	g.Expect(next).To(BeNumerically(">", token))
	t.Logf("next pod admitted %s after the end", time.Since(from).Round(time.Millisecond))
}

// The grant ends at once when the pod is proven finished: Failed, or gone
// after a graceful deletion, or deleted before it was bound.
func TestAdmittedGrantEndsAtOnceWhenThePodIsProvenFinished(t *testing.T) {
	t.Run("failed", func(t *testing.T) {
		ns, _, token := admittedRunningPod(t, 30)
		setPhase(t, ns, "first", corev1.PodFailed)
		expectNextAdmittedAfter(t, ns, token, time.Now(), 0, 10*time.Second)
	})
	t.Run("graceful deletion", func(t *testing.T) {
		ns, _, token := admittedRunningPod(t, 30)
		g := NewWithT(t)
		pod := getPod(g, ns, "first")
		g.Expect(k8sClient.Delete(context.Background(), pod, client.GracePeriodSeconds(30))).To(Succeed())
		g.Consistently(func(g Gomega) { expectGated(g, ns, "next", "billing") }).
			WithTimeout(2*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "admitted while the pod was still terminating")
		// The kubelet confirms its containers stopped: it reports them
		// terminated, then deletes the pod.
		containersStoppedByKubelet(t, ns, "first")
		g.Expect(k8sClient.Delete(context.Background(), pod, client.GracePeriodSeconds(0),
			client.Preconditions{UID: new(pod.UID)})).To(Succeed())
		expectNextAdmittedAfter(t, ns, token, time.Now(), 0, 10*time.Second)
	})
	t.Run("deleted before bound", func(t *testing.T) {
		ns := newNamespace(t)
		createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
		gatedPod(t, ns, "first", "billing")
		token := expectAdmitted(t, ns, "first", "billing", 10*time.Second)
		gatedPod(t, ns, "next", "billing")
		g := NewWithT(t)
		g.Expect(k8sClient.Delete(context.Background(), getPod(g, ns, "first"))).To(Succeed())
		expectNextAdmittedAfter(t, ns, token, time.Now(), 0, 10*time.Second)
	})
}

// A force deletion confirms nothing, and a node that stops reporting may
// still run the pod: the grant is ended only a lease duration later.
func TestAdmittedGrantIsWaitedOutWithoutProof(t *testing.T) {
	const seconds = 4
	t.Run("force deletion", func(t *testing.T) {
		ns, _, token := admittedRunningPod(t, seconds)
		g := NewWithT(t)
		g.Expect(k8sClient.Delete(context.Background(), getPod(g, ns, "first"), client.GracePeriodSeconds(0))).To(Succeed())
		expectNextAdmittedAfter(t, ns, token, time.Now(), seconds*time.Second, 15*time.Second)
	})
	t.Run("node not ready", func(t *testing.T) {
		ns, node, token := admittedRunningPod(t, seconds)
		setNodeReady(t, node, false)
		expectNextAdmittedAfter(t, ns, token, time.Now(), seconds*time.Second, 15*time.Second)
	})
}

// Bad input: a pod naming a missing lock stays gated with a warning and is
// admitted once the lock exists; the annotation without the gate is
// warned about and never admitted; the gate without the annotation is
// warned about; a lock deleted while pods wait leaves them gated, warned.
func TestAdmissionBadInput(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	gatedPod(t, ns, "early", "billing")
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(podEventReasons(g, ns, "early")).To(ContainElement("LockMissing"))
	})
	expectGated(g, ns, "early", "billing")

	ungated := testutil.MakeGatedPod("ungated", ns, "billing")
	ungated.Spec.SchedulingGates = nil
	g.Expect(k8sClient.Create(context.Background(), ungated)).To(Succeed())
	unnamed := testutil.MakeGatedPod("unnamed", ns, "billing")
	delete(unnamed.Annotations, locksv1alpha1.RunsHoldingAnnotation)
	g.Expect(k8sClient.Create(context.Background(), unnamed)).To(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(podEventReasons(g, ns, "ungated")).To(ContainElement("NotGated"))
		g.Expect(podEventReasons(g, ns, "unnamed")).To(ContainElement("NoLockNamed"))
	})

	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	expectAdmitted(t, ns, "early", "billing", 10*time.Second)
	g.Expect(getPod(g, ns, "ungated").Annotations).NotTo(HaveKey(locksv1alpha1.TokenAnnotationKey("billing")))
	g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(Equal("early"))

	gatedPod(t, ns, "orphan", "billing")
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, "billing").Status.GatedPods).To(Equal(int32(1))) })
	g.Expect(k8sClient.Delete(context.Background(), getLock(g, ns, "billing"))).To(Succeed())
	eventually(t, 60*time.Second, func(g Gomega) {
		g.Expect(podEventReasons(g, ns, "orphan")).To(ContainElement("LockMissing"))
	})
	expectGated(g, ns, "orphan", "billing")
	expectGated(g, ns, "unnamed", "billing")
}

// The shipped CronJob sample is accepted as it is, and a pod made from its
// template (no CronJob or Job controller runs here) is admitted with its
// token.
func TestAdmittedCronJobSampleTemplateIsAdmitted(t *testing.T) {
	ns := newNamespace(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	g := NewWithT(t)
	deployDefault(t) // the sample binds ClusterRole frontdesk-lock-user
	_, err = manifests.CreateFromFiles(context.Background(), k8sClient, ns,
		filepath.Join(root, "config", "samples", "locks_v1alpha1_admitted_cronjob.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	letPodsUseLocks(t, ns, "ledger-job") // the sample's binding, in effect
	cj := &batchv1.CronJob{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "charge-ledger"}, cj)).To(Succeed())
	tmpl := cj.Spec.JobTemplate.Spec.Template
	pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	pod.Name, pod.Namespace = "charge-ledger-1", ns
	g.Expect(k8sClient.Create(context.Background(), pod)).To(Succeed())
	token := expectAdmitted(t, ns, pod.Name, "ledger", 10*time.Second)
	g.Expect(token).To(BeNumerically(">", 0))
}

// The shipped MutatingAdmissionPolicy (config/admission-gate) gates a pod
// created with the runs-holding annotation and without the gate, so it is
// admitted like any gated pod.
func TestAdmissionGatePolicyGatesAnnotatedPods(t *testing.T) {
	ns := newNamespace(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	g := NewWithT(t)
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(root, "config", "admission-gate", "policy.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	policy := &admissionregistrationv1.MutatingAdmissionPolicy{}
	g.Expect(yaml.UnmarshalStrict(raw, policy)).To(Succeed())
	policy.SetName("admission-gate-" + ns) // bound to this namespace only
	g.Expect(k8sClient.Create(ctx, policy)).To(Succeed())
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.GetName()},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: policy.GetName(),
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}},
	}
	g.Expect(k8sClient.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() {
		_ = k8sClient.Delete(ctx, binding)
		_ = k8sClient.Delete(ctx, policy)
	})
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	// The apiserver enforces a new policy some moments later: dry-run
	// creations until it gates one.
	eventually(t, 15*time.Second, func(g Gomega) {
		probe := testutil.MakeGatedPod("probe", ns, "billing")
		probe.Spec.SchedulingGates = nil
		g.Expect(k8sClient.Create(ctx, probe, client.DryRunAll)).To(Succeed())
		g.Expect(gated(probe)).To(BeTrue(), "the policy did not gate the pod yet")
	})
	letPodsUseLocks(t, ns, "default")
	pod := testutil.MakeGatedPod("job", ns, "billing")
	pod.Spec.SchedulingGates = nil
	g.Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	g.Expect(gated(pod)).To(BeTrue())
	expectAdmitted(t, ns, "job", "billing", 10*time.Second)
}

func gated(p *corev1.Pod) bool {
	for _, gate := range p.Spec.SchedulingGates {
		if gate.Name == locksv1alpha1.AdmissionGate {
			return true
		}
	}
	return false
}
