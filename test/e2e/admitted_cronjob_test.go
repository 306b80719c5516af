//go:build e2e

package e2e

import (
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/test/demo"
)

const (
	admittedLock  = "ledger"
	admittedLease = 10 * time.Second // leaseDurationSeconds of admitted-ledger.yaml
	// chargesPerJob at one a second makes a Job run longer than the
	// CronJob's one-minute schedule.
	chargesPerJob = 70
)

// TestAdmittedCronJobChargesOnceAtATime: a CronJob every minute
// (concurrencyPolicy Allow) whose pods run holding the lock "ledger" and
// charge a fenced ledger with $FENCING_TOKEN for longer than a minute, plus
// a Job created by hand from it as soon as the first is admitted: the Jobs
// run one at a time, in turn, each with a higher token. Then the node of the
// Job charging is frozen (`docker pause`): the Job waiting next is admitted
// only once the node has stopped reporting for the lease duration, with a
// higher token, and when the node is thawed the frozen pod's late charge is
// refused by the ledger, which stops it. The ledger counts no duplicate
// charge, and no two Jobs' accepted charges interleave.
func TestAdmittedCronJobChargesOnceAtATime(t *testing.T) {
	c := start(t, "cronjob")
	g := NewWithT(t)

	workers, leaderNode := c.workersAndManagerLeader(g)
	preferred := workers[0]
	if preferred == leaderNode {
		preferred = workers[1]
	}
	c.stepf("workers %v, manager leader on %s: the Jobs prefer %s", workers, leaderNode, preferred)

	pods := c.watchAdmittedPods(admittedLock)
	marks := c.watchHolderMarks(locksv1alpha1.HolderLabelKey(admittedLock))
	c.applyFile("admitted-ledger.yaml")
	c.waitRollout("ledger", 3*time.Minute)
	svc, err := c.cs.CoreV1().Services(c.ns).Get(c.ctx, "ledger", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	c.applyFile("admitted-cronjob.yaml", "LEDGER_URL", "http://"+svc.Spec.ClusterIP+":8080",
		"PREFERRED_NODE", preferred, "CHARGES", strconv.Itoa(chargesPerJob))
	c.stepf("CronJob charge-ledger every minute, %d charges a Job; ledger at %s", chargesPerJob, svc.Spec.ClusterIP)

	// 1. The schedule's first Job is admitted; a Job made by hand from the
	//    CronJob queues behind it, and the schedule's next one behind both.
	first := pods.waitAdmitted(g, 1, 3*time.Minute)[0]
	c.stepf("first Job %s admitted: pod %s, token %d", first.job, first.name, first.token)
	c.kubectlOK("-n", c.ns, "create", "job", "manual", "--from=cronjob/charge-ledger")
	c.stepf("created Job manual from the CronJob")
	admitted := pods.waitAdmitted(g, 3, 5*time.Minute)
	g.Expect(slices.ContainsFunc(admitted, func(p admittedPod) bool { return p.job == "manual" })).To(BeTrue(),
		"the manual Job is among the first three admitted: %v", admitted)
	for i := 1; i < len(admitted); i++ {
		prev, p := admitted[i-1], admitted[i]
		g.Expect(prev.phase).To(Equal(corev1.PodSucceeded), "%s succeeded", prev.name)
		g.Expect(p.created).To(BeTemporally("<", prev.finished), "%s was created while %s still ran, and waited", p.name, prev.name)
		g.Expect(p.ungated).To(BeTemporally(">=", prev.finished), "%s was admitted only after %s finished", p.name, prev.name)
		g.Expect(p.token).To(BeNumerically(">", prev.token))
		c.stepf("Job %s admitted: pod %s, token %d, %s after %s finished", p.job, p.name, p.token,
			p.ungated.Sub(prev.finished).Round(100*time.Millisecond), prev.name)
	}

	// 2. The third Job charging, the next one waiting gated: freeze the
	//    third Job's node.
	frozen := admitted[2]
	g.Eventually(func(g Gomega) {
		g.Expect(acceptedBy(c.ledgerStats(), frozen.name)).To(BeNumerically(">=", 3))
		g.Expect(pods.gatedCount()).To(BeNumerically(">=", 1), "a Job waits for the lock")
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(), "%s charging with a Job waiting behind it", frozen.name)
	frozen = pods.get(frozen.name)
	g.Expect(frozen.node).To(BeElementOf(workers), "the Job runs on a worker")
	if frozen.node == leaderNode {
		t.Fatalf("pod %s was scheduled on %s, beside the manager leader, despite its preference for %s: not freezing the manager",
			frozen.name, frozen.node, preferred)
	}
	c.stepf("docker pause %s (pod %s, token %d)", frozen.node, frozen.name, frozen.token)
	paused := time.Now()
	if out, err := exec.Command("docker", "pause", frozen.node).CombinedOutput(); err != nil {
		t.Fatalf("docker pause %s: %v: %s", frozen.node, err, out)
	}
	t.Cleanup(func() { c.thawNode(frozen.node) })

	// 3. The next Job is admitted once the node has stopped reporting for
	//    the lease duration, with a higher token, on the other worker.
	next := pods.waitAdmitted(g, 4, 4*time.Minute)[3]
	notReady := c.notReadySince(g, frozen.node)
	c.stepf("Job %s admitted: pod %s, token %d; %s after the pause, %s after %s went NotReady (%s after the pause)",
		next.job, next.name, next.token, next.ungated.Sub(paused).Round(100*time.Millisecond),
		next.ungated.Sub(notReady).Round(100*time.Millisecond), frozen.node, notReady.Sub(paused).Round(time.Second))
	g.Expect(next.ungated.Sub(paused)).To(BeNumerically(">=", admittedLease), "admitted no sooner than the lease duration after the pause")
	g.Expect(next.ungated.Sub(notReady)).To(BeNumerically(">=", admittedLease), "admitted no sooner than the lease duration after the node stopped reporting")
	g.Expect(next.token).To(BeNumerically(">", frozen.token))
	g.Eventually(c.podReleasedEvents).WithTimeout(30*time.Second).WithPolling(time.Second).Should(ContainElement(And(
		ContainSubstring("node "+frozen.node), ContainSubstring(frozen.name), ContainSubstring(fmt.Sprintf("fencing token %d", frozen.token)))),
		"the grant ended because the node stopped reporting")

	// 4. Once the next Job has charged, thaw the node: the frozen pod's
	//    late charge is refused, and the pod stops (exit 75).
	g.Eventually(func() int { return acceptedBy(c.ledgerStats(), next.name) }).
		WithTimeout(2*time.Minute).WithPolling(time.Second).Should(BeNumerically(">=", 1), "%s charges", next.name)
	next = pods.get(next.name)
	g.Expect(next.node).To(And(BeElementOf(workers), Not(Equal(frozen.node))), "%s runs on the other worker", next.name)
	c.stepf("%s charges on %s; docker unpause %s", next.name, next.node, frozen.node)
	if out, err := exec.Command("docker", "unpause", frozen.node).CombinedOutput(); err != nil {
		t.Fatalf("docker unpause %s: %v: %s", frozen.node, err, out)
	}
	thawed := time.Now()
	g.Eventually(func(g Gomega) {
		p := pods.get(frozen.name)
		g.Expect(p.phase).To(Equal(corev1.PodFailed), "%s stopped", frozen.name)
		g.Expect(p.exitCode).To(BeEquivalentTo(demo.ExitFenced), "%s stopped because its token was refused", frozen.name)
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	c.stepf("%s stopped %s after the unpause", frozen.name, time.Since(thawed).Round(time.Second))

	// 5. What the ledger recorded.
	c.kubectlOK("-n", c.ns, "patch", "cronjob", "charge-ledger", "--type=merge", "-p", `{"spec":{"suspend":true}}`)
	st := c.ledgerStats()
	g.Expect(st.Charges).To(BeNumerically(">", 0), "the ledger's stats")
	admitted = pods.admitted()
	for _, p := range admitted {
		c.stepf("  Job %-28s pod %-34s token %d  node %-22s created %s  admitted %s  finished %s (%s)", p.job, p.name, p.token, p.node,
			p.created.Format("15:04:05"), p.ungated.Format("15:04:05.0"), p.finished.Format("15:04:05.0"), p.phase)
	}
	c.stepf("ledger: %d charges, %d duplicates, %d rejected", st.Charges, st.Duplicates, st.Rejected)
	g.Expect(st.Duplicates).To(BeZero(), "duplicate charges")
	g.Expect(st.Rejected).To(BeNumerically(">=", 1))
	byWorker := map[string]demo.TokenStats{}
	for _, ts := range st.Tokens {
		c.stepf("  token %d  %s  accepted %d (%.1fs → %.1fs)  rejected %d", ts.Token, ts.Worker, ts.Accepted,
			float64(ts.FirstChargeMS)/1000, float64(ts.LastChargeMS)/1000, ts.Rejected)
		g.Expect(byWorker).NotTo(HaveKey(ts.Worker), "%s wrote with one token only", ts.Worker)
		byWorker[ts.Worker] = ts
		if ts.Rejected > 0 {
			g.Expect(ts.Worker).To(Equal(frozen.name), "only the frozen pod's charges are refused")
		}
	}
	g.Expect(byWorker[frozen.name].Rejected).To(BeNumerically(">=", 1), "the frozen pod's late charge was refused")
	var prev *demo.TokenStats
	for i, p := range admitted {
		ts, ok := byWorker[p.name]
		if !ok {
			g.Expect(i).To(Equal(len(admitted)-1), "every admitted pod but the last charged: %s did not", p.name)
			continue
		}
		g.Expect(ts.Token).To(Equal(p.token), "%s charged with its pod's token", p.name)
		if prev != nil {
			g.Expect(ts.Token).To(BeNumerically(">", prev.Token), "tokens rise in admission order")
			g.Expect(ts.FirstChargeMS).To(BeNumerically(">", prev.LastChargeMS),
				"%s's accepted charges begin after %s's end", p.name, prev.Worker)
		}
		prev = &ts
	}
	g.Expect(len(byWorker)).To(BeNumerically(">=", 4))
	// Not asserted (an admitted pod's holder label is a mark, not its
	// grant): whether two pods carried it at once.
	c.stepf("pods labelled holder at once: %d times %v", len(marks()), marks())
}

// admittedPod is what the pod watch saw of a pod that runs holding a lock.
type admittedPod struct {
	name, job, node string
	token           int64
	phase           corev1.PodPhase
	exitCode        int32
	// created is the pod's creation; ungated and finished are when the
	// watch first saw it without its admission gate and Succeeded or
	// Failed.
	created, ungated, finished time.Time
}

// admittedPods follows, through one watch, the pods of the test's
// namespace that run holding a lock.
type admittedPods struct {
	mu    sync.Mutex
	pods  map[string]*admittedPod
	order []string // admission order
	gated map[string]bool
	done  chan struct{}
}

// watchAdmittedPods watches the pods that run holding lock.
func (t *tc) watchAdmittedPods(lock string) *admittedPods {
	t.Helper()
	w, err := t.cs.CoreV1().Pods(t.ns).Watch(t.ctx, metav1.ListOptions{LabelSelector: locksv1alpha1.ParticipantLabel + "=true"})
	if err != nil {
		t.Fatalf("watching pods: %v", err)
	}
	a := &admittedPods{pods: map[string]*admittedPod{}, gated: map[string]bool{}, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.Annotations[locksv1alpha1.RunsHoldingAnnotation] != lock {
				continue
			}
			a.saw(p, ev.Type, time.Now())
		}
	}()
	t.Cleanup(func() { w.Stop(); <-a.done })
	return a
}

func (a *admittedPods) saw(p *corev1.Pod, ev watch.EventType, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.pods[p.Name]
	if r == nil {
		r = &admittedPod{name: p.Name, job: p.Labels["batch.kubernetes.io/job-name"], created: p.CreationTimestamp.Time}
		a.pods[p.Name] = r
	}
	isGated := slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == locksv1alpha1.AdmissionGate })
	a.gated[p.Name] = isGated && ev != watch.Deleted && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
	if !isGated && r.ungated.IsZero() {
		r.ungated = now
		r.token, _ = strconv.ParseInt(p.Annotations[locksv1alpha1.TokenAnnotationKey(lockOf(p))], 10, 64)
		a.order = append(a.order, p.Name)
	}
	r.node, r.phase = p.Spec.NodeName, p.Status.Phase
	if (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) && r.finished.IsZero() {
		r.finished = now
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Terminated != nil {
			r.exitCode = cs.State.Terminated.ExitCode
		}
	}
}

func lockOf(p *corev1.Pod) string { return p.Annotations[locksv1alpha1.RunsHoldingAnnotation] }

// admitted lists the pods ungated so far, in the order the watch saw them
// ungated.
func (a *admittedPods) admitted() []admittedPod {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]admittedPod, 0, len(a.order))
	for _, n := range a.order {
		out = append(out, *a.pods[n])
	}
	return out
}

func (a *admittedPods) get(name string) admittedPod {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.pods[name]; p != nil {
		return *p
	}
	return admittedPod{}
}

// gatedCount is how many pods wait for admission.
func (a *admittedPods) gatedCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, g := range a.gated {
		if g {
			n++
		}
	}
	return n
}

// waitAdmitted waits until n pods have been admitted and returns them in
// admission order. Each of them but the last has finished by then: it
// fails the test if the watch ends early.
func (a *admittedPods) waitAdmitted(g Gomega, n int, timeout time.Duration) []admittedPod {
	var out []admittedPod
	g.Eventually(func(g Gomega) {
		select {
		case <-a.done:
			StopTrying("the pod watch ended early").Now()
		default:
		}
		out = a.admitted()
		g.Expect(len(out)).To(BeNumerically(">=", n), "pods admitted")
	}).WithTimeout(timeout).WithPolling(200*time.Millisecond).Should(Succeed(), "%d pods admitted", n)
	return out
}

// acceptedBy counts the ledger's accepted charges of a worker.
func acceptedBy(st demo.Stats, worker string) int {
	n := 0
	for _, ts := range st.Tokens {
		if ts.Worker == worker {
			n += ts.Accepted
		}
	}
	return n
}

// workersAndManagerLeader returns the worker nodes (sorted) and the node of
// the manager pod that leads.
func (t *tc) workersAndManagerLeader(g Gomega) ([]string, string) {
	nodes, err := t.cs.CoreV1().Nodes().List(t.ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	var workers []string
	for _, n := range nodes.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
			workers = append(workers, n.Name)
		}
	}
	slices.Sort(workers)
	g.Expect(workers).To(HaveLen(2))
	var node string
	g.Eventually(func(g Gomega) {
		l, err := t.cs.CoordinationV1().Leases(managerNS).Get(t.ctx, "frontdesk-controller-leader", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Spec.HolderIdentity).NotTo(BeNil())
		pod, err := t.cs.CoreV1().Pods(managerNS).Get(t.ctx, strings.SplitN(*l.Spec.HolderIdentity, "_", 2)[0], metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		node = pod.Spec.NodeName
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "the manager leader")
	return workers, node
}

// notReadySince is when the node's Ready condition last left True (it must
// not be True now).
func (t *tc) notReadySince(g Gomega, node string) time.Time {
	n, err := t.cs.CoreV1().Nodes().Get(t.ctx, node, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			g.Expect(c.Status).NotTo(Equal(corev1.ConditionTrue), "node %s is not Ready", node)
			return c.LastTransitionTime.Time
		}
	}
	g.Expect(false).To(BeTrue(), "node %s has no Ready condition", node)
	return time.Time{}
}

// podReleasedEvents are the messages of the lock's PodReleased events.
func (t *tc) podReleasedEvents() []string {
	evs, err := t.cs.CoreV1().Events(t.ns).List(t.ctx, metav1.ListOptions{FieldSelector: "reason=PodReleased"})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Message)
	}
	return out
}

// thawNode unpauses a node paused by the test and waits until it reports
// Ready without the unreachable taint and the manager is rolled out again,
// so that the tests after it find the cluster whole.
func (t *tc) thawNode(node string) {
	if out, err := exec.Command("docker", "unpause", node).CombinedOutput(); err != nil && !strings.Contains(string(out), "is not paused") {
		t.Logf("docker unpause %s: %v: %s", node, err, out)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		n, err := t.cs.CoreV1().Nodes().Get(t.ctx, node, metav1.GetOptions{})
		if err == nil && nodeReporting(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("node %s still not Ready 3m after docker unpause", node)
			return
		}
		time.Sleep(time.Second)
	}
	if out, err := t.kubectl("-n", managerNS, "rollout", "status", "deployment/"+managerName, "--timeout=2m"); err != nil {
		t.Errorf("the manager after node %s came back: %v\n%s", node, err, out)
	}
}

// nodeReporting: Ready and not tainted unreachable.
func nodeReporting(n *corev1.Node) bool {
	for _, taint := range n.Spec.Taints {
		if taint.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
