//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// Bounds of the failover test, at the lock's 15 s lease.
const (
	failoverLease = 15 * time.Second
	// failoverFast bounds a failover that does not wait out the lease (a
	// proof, or a release), generously for CI.
	failoverFast = 5 * time.Second
	// failoverLeaseFloor: a failover by the lease comes no sooner than the
	// lease after the holder's last renewal, which was at most one renew
	// period (the electors' RetryPeriod, 2 s) before the kill; 1 s more of
	// margin.
	failoverLeaseFloor = failoverLease - 2*time.Second - time.Second
	// failoverLeaseCeiling bounds a failover by the lease.
	failoverLeaseCeiling = 2 * failoverLease
)

// failoverExpect is how a way of dying is expected to fail over.
type failoverExpect int

const (
	// byProof: at once (< failoverFast), the controller's HolderProvenDead.
	byProof failoverExpect = iota
	// byRelease: at once (< failoverFast), the holder released on its way
	// out; whether a proof also came is recorded, not asserted.
	byRelease
	// byLease: no sooner than failoverLeaseFloor, and never by a proof.
	byLease
)

// failoverWay is one way a holder dies, with the lock's spec.failover.
type failoverWay struct {
	name string
	// holders is the testdata file of the two holder pods; waiting matches
	// the log of the one that waits.
	holders string
	waiting *regexp.Regexp
	// flags are the elector's extra flags (ELECTOR_FLAGS).
	flags    string
	restart  corev1.RestartPolicy
	failover locksv1alpha1.Failover
	// kill ends (or freezes) the holder pod's process.
	kill   func(t *tc, pod string) (string, error)
	expect failoverExpect
	// after checks what became of the holder pod (nil: nothing).
	after func(t *tc, g Gomega, pod string)
}

// failoverResult is what one way measured: from the kill to the store's
// acceptance of the next holder's first fenced write.
type failoverResult struct {
	way      failoverWay
	took     time.Duration
	reasons  []string
	killedIn time.Duration
}

// TestFailoverOnProof: at the default 15 s lease, a holder dies in each of
// these ways, and the time from the kill to the next holder's first fenced
// write is measured, each way once with spec.failover Proof (the default)
// and, where proof is what would end it, once with Lease (today's figure on
// the same cluster):
//   - `kubectl delete pod` of a `kubectl dlock run` holder: it releases on
//     the SIGTERM it forwards, at once either way;
//   - kill -9 of a single-container operator (pkg/leaderelection) in a pod
//     with restartPolicy Never: the pod goes Failed with its container
//     terminated, the proof;
//   - an OOM kill of a stock client-go elector (resourcelock.LeaseLock),
//     restartPolicy Never: the same proof;
//   - kill -9 of the operator with restartPolicy Always: the container
//     restarts in a Running pod, which is not proof: the lease;
//   - SIGSTOP of the operator: a frozen holder is failed over by the lease
//     only, never by a proof.
//
// The next holder (the other pod, waiting) writes to a fenced store with
// its fencing token as soon as it holds the lock, and the store records
// when it accepted that write: the failover ends there. Both clocks are the
// host's (kind's nodes are containers), and the kill's time is taken just
// before the test sends it, so each figure is an upper bound.
func TestFailoverOnProof(t *testing.T) {
	var results []failoverResult
	for _, w := range failoverWays() {
		t.Run(w.name, func(t *testing.T) {
			results = append(results, runFailover(start(t, "failover"), w))
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "failover at a %s lease, from the kill to the next holder's first fenced write:\n", failoverLease)
	for _, r := range results {
		fmt.Fprintf(&b, "  %-76s failover %-5s %8s  (kill sent in %s; lock events %s)\n",
			r.way.name, r.way.failover, r.took.Round(time.Millisecond), r.killedIn.Round(time.Millisecond), strings.Join(r.reasons, ","))
	}
	t.Log(b.String())
}

// failoverWays are the ways of dying TestFailoverOnProof measures.
func failoverWays() []failoverWay {
	dlock := regexp.MustCompile(`waiting up to`)
	elector := regexp.MustCompile(`the leader is `)
	deletePod := func(t *tc, pod string) (string, error) {
		return t.kubectl("-n", t.ns, "delete", "pod", pod, "--wait=false")
	}
	signal := func(sig string) func(t *tc, pod string) (string, error) {
		return func(t *tc, pod string) (string, error) {
			return t.exec(pod, "sh", "-c", "kill -"+sig+" $(pidof frontdesk-demo)")
		}
	}
	never, always := corev1.RestartPolicyNever, corev1.RestartPolicyAlways
	proof, lease := locksv1alpha1.FailoverProof, locksv1alpha1.FailoverLease
	ways := []failoverWay{
		{name: "kubectl delete pod of a kubectl dlock run holder", holders: "failover-dlock-run.yaml", waiting: dlock,
			restart: never, failover: proof, kill: deletePod, expect: byRelease},
		{name: "kubectl delete pod of a kubectl dlock run holder", holders: "failover-dlock-run.yaml", waiting: dlock,
			restart: never, failover: lease, kill: deletePod, expect: byRelease},
		{name: "kill -9 of a pkg/leaderelection operator, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector,
			restart: never, failover: proof, kill: signal("9"), expect: byProof, after: podFailed("")},
		{name: "kill -9 of a pkg/leaderelection operator, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector,
			restart: never, failover: lease, kill: signal("9"), expect: byLease, after: podFailed("")},
		{name: "OOM kill of a stock client-go elector, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector,
			flags: "--stock", restart: never, failover: proof, kill: signal("USR1"), expect: byProof, after: podFailed("OOMKilled")},
		{name: "OOM kill of a stock client-go elector, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector,
			flags: "--stock", restart: never, failover: lease, kill: signal("USR1"), expect: byLease, after: podFailed("OOMKilled")},
		{name: "kill -9 of a pkg/leaderelection operator, restartPolicy Always (a restart)", holders: "failover-elector.yaml", waiting: elector,
			restart: always, failover: proof, kill: signal("9"), expect: byLease, after: podRestarted},
		{name: "SIGSTOP of a pkg/leaderelection operator (frozen)", holders: "failover-elector.yaml", waiting: elector,
			restart: never, failover: proof, kill: signal("STOP"), expect: byLease, after: podRunning},
	}
	return ways
}

// runFailover deploys the lock, the store and two holder pods, kills the
// one that writes first once the other waits, and measures the failover.
func runFailover(t *tc, w failoverWay) failoverResult {
	g := NewWithT(t)
	t.stepf("%s, spec.failover %s", w.name, w.failover)
	t.applyFile("failover.yaml", "FAILOVER", string(w.failover))
	t.waitRollout("store", 3*time.Minute)
	for _, pod := range []string{"holder-a", "holder-b"} {
		t.applyFile(w.holders, "HOLDER", pod, "RESTART_POLICY", string(w.restart), "ELECTOR_FLAGS", w.flags)
	}
	var first storeWrite
	g.Eventually(func(g Gomega) {
		writes := t.storeWrites()
		g.Expect(writes).NotTo(BeEmpty(), "a holder's write")
		first = writes[0]
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	holder, waiter := first.Writer, map[string]string{"holder-a": "holder-b", "holder-b": "holder-a"}[first.Writer]
	g.Expect(waiter).NotTo(BeEmpty(), "the first write names a holder pod: %+v", first)
	g.Eventually(func() (string, error) { return t.kubectl("-n", t.ns, "logs", waiter) }).
		WithTimeout(2*time.Minute).WithPolling(time.Second).Should(MatchRegexp(w.waiting.String()), "%s waits for the lock", waiter)
	t.stepf("%s holds the lock with fencing token %d; %s waits", holder, first.Token, waiter)

	killed := time.Now()
	out, err := w.kill(t, holder)
	sent := time.Since(killed)
	g.Expect(err).NotTo(HaveOccurred(), "killing %s: %s", holder, out)
	var next storeWrite
	g.Eventually(func(g Gomega) {
		writes := t.storeWrites()
		i := slices.IndexFunc(writes, func(wr storeWrite) bool { return wr.Token > first.Token })
		g.Expect(i).NotTo(Equal(-1), "a write with a fencing token above %d", first.Token)
		next = writes[i]
	}).WithTimeout(failoverLeaseCeiling + time.Minute).WithPolling(time.Second).Should(Succeed())
	took := next.At.Sub(killed)
	t.stepf("%s wrote with fencing token %d, %s after the kill (sent in %s)", next.Writer, next.Token, took.Round(time.Millisecond), sent.Round(time.Millisecond))

	reasons := t.checkFailover(g, w, took)
	if w.after != nil {
		w.after(t, g, holder)
	}
	return failoverResult{way: w, took: took, reasons: reasons, killedIn: sent}
}

// checkFailover asserts the failover's time and, from the lock's events,
// whether a proof ended the grant; it returns the events' reasons.
func (t *tc) checkFailover(g Gomega, w failoverWay, took time.Duration) []string {
	var reasons []string
	switch w.expect {
	case byProof:
		g.Expect(took).To(BeNumerically("<", failoverFast), "failed over on proof, not by the lease")
		g.Eventually(func() []string { reasons = t.lockEventReasons("leader"); return reasons }).
			WithTimeout(time.Minute).WithPolling(time.Second).Should(ContainElement("HolderProvenDead"))
	case byRelease:
		g.Expect(took).To(BeNumerically("<", failoverFast), "the holder released on its way out")
		reasons = t.lockEventReasons("leader")
	case byLease:
		g.Expect(took).To(BeNumerically(">=", failoverLeaseFloor), "failed over by the lease, not before it")
		g.Expect(took).To(BeNumerically("<", failoverLeaseCeiling))
		reasons = t.lockEventReasons("leader")
		g.Expect(reasons).NotTo(ContainElement("HolderProvenDead"), "never ended by a proof")
	}
	return reasons
}

// storeWrite is a write the fenced store accepted (frontdesk-demo store).
type storeWrite struct {
	At     time.Time `json:"at"`
	Writer string    `json:"writer"`
	Token  int64     `json:"token"`
}

// storeWrites reads every write the test's fenced store accepted, in order.
func (t *tc) storeWrites() []storeWrite {
	var writes []storeWrite
	out, err := t.kubectl("-n", t.ns, "exec", "deploy/store", "--", "wget", "-qO-", "http://127.0.0.1:8080/writes")
	if err == nil {
		_ = json.Unmarshal([]byte(out), &writes)
	}
	return writes
}

// lockEventReasons lists the reasons of the events on a DistributedLock of
// the test's namespace, oldest first.
func (t *tc) lockEventReasons(name string) []string {
	events, err := t.cs.CoreV1().Events(t.ns).List(t.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	items := slices.DeleteFunc(events.Items, func(e corev1.Event) bool { return e.InvolvedObject.Kind != "DistributedLock" })
	slices.SortFunc(items, func(a, b corev1.Event) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	reasons := make([]string, 0, len(items))
	for _, e := range items {
		reasons = append(reasons, e.Reason)
	}
	return reasons
}

// podFailed checks that the killed pod went Failed with its container
// terminated (for reason, when not empty): the proof the design names.
func podFailed(reason string) func(t *tc, g Gomega, pod string) {
	return func(t *tc, g Gomega, pod string) {
		g.Eventually(func(g Gomega) {
			p, err := t.cs.CoreV1().Pods(t.ns).Get(t.ctx, pod, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Status.Phase).To(Equal(corev1.PodFailed))
			g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
			term := p.Status.ContainerStatuses[0].State.Terminated
			g.Expect(term).NotTo(BeNil(), "the container is terminated")
			if reason != "" {
				g.Expect(term.Reason).To(Equal(reason))
			}
			t.stepf("%s: %s, container terminated: %s, exit code %d", pod, p.Status.Phase, term.Reason, term.ExitCode)
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	}
}

// podRestarted checks that the killed pod's container was restarted in a
// Running pod: not a proof.
func podRestarted(t *tc, g Gomega, pod string) {
	p, err := t.cs.CoreV1().Pods(t.ns).Get(t.ctx, pod, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
	g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
	g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeNumerically(">=", 1), "the container restarted")
	t.stepf("%s: %s, container restarted %d time(s)", pod, p.Status.Phase, p.Status.ContainerStatuses[0].RestartCount)
}

// podRunning checks that the frozen pod is still Running, its container
// running; then thaws it.
func podRunning(t *tc, g Gomega, pod string) {
	p, err := t.cs.CoreV1().Pods(t.ns).Get(t.ctx, pod, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
	g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
	g.Expect(p.Status.ContainerStatuses[0].State.Running).NotTo(BeNil(), "the frozen container still runs")
	out, err := t.exec(pod, "sh", "-c", "kill -CONT $(pidof frontdesk-demo)")
	g.Expect(err).NotTo(HaveOccurred(), out)
	t.stepf("%s: still %s while frozen; thawed", pod, p.Status.Phase)
}
