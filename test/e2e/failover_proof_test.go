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
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// Bounds of the failover test, at the lock's 15 s lease.
const (
	failoverLease = 15 * time.Second
	// failoverFast bounds the end of a grant that does not wait out the
	// lease (a proof, or a release), generously for CI.
	failoverFast = 5 * time.Second
	// electorRetryPeriod is the electors' RetryPeriod (frontdesk-demo
	// elector: controller-runtime's default), the period of a leader's
	// renewals and of a candidate's attempts.
	electorRetryPeriod = 2 * time.Second
	// clientGoPickup is how long a client-go candidate may take to see the
	// Lease free: client-go retries every RetryPeriod plus a jitter of up
	// to 1.2 RetryPeriods (leaderelection.JitterFactor).
	clientGoPickup = electorRetryPeriod * 22 / 10
	// failoverLeaseFloor: a grant ends by the lease no sooner than the
	// lease after the holder's last renewal, which was at most one renew
	// period before the kill; 1 s more of margin.
	failoverLeaseFloor = failoverLease - electorRetryPeriod - time.Second
	// failoverLeaseCeiling bounds a failover by the lease.
	failoverLeaseCeiling = 2 * failoverLease
)

// failoverExpect is how a way of dying is expected to fail over.
type failoverExpect int

const (
	// byProof: the grant ends at once (< failoverFast), the controller's
	// HolderProvenDead.
	byProof failoverExpect = iota
	// byRelease: the grant ends at once (< failoverFast), released by the
	// holder on its way out.
	byRelease
	// byLease: the grant ends no sooner than failoverLeaseFloor, and never
	// by a proof.
	byLease
)

// failoverWay is one way a holder dies, with the lock's spec.failover.
type failoverWay struct {
	// name says how the holder dies (no "/": it names a subtest).
	name string
	// holders is the testdata file of the two holder pods; waiting matches
	// the log of the one that waits.
	holders string
	waiting *regexp.Regexp
	// pickup is how long the waiting kind of holder may take to see the
	// lock free, on top of failoverFast: clientGoPickup for the electors;
	// none for kubectl dlock run, whose wait is a watch.
	pickup time.Duration
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

// failoverResult is what one way measured from the kill: to the end of the
// grant (the Lease's first write naming another holder, or none, as the
// test's watch saw it), and to the store's acceptance of the next holder's
// first fenced write.
type failoverResult struct {
	way      failoverWay
	grantEnd time.Duration
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
// before the test sends it, so each figure is an upper bound. The test
// also times the end of the grant (its watch of the Lease): that is what
// frontdesk decides, and what failoverFast bounds; a client-go candidate
// then sees the Lease free at its next attempt, up to 2.2 RetryPeriods
// (4.4 s) later, which the bound of the next write adds for the electors.
func TestFailoverOnProof(t *testing.T) {
	var results []failoverResult
	for _, w := range failoverWays() {
		t.Run(w.name+", failover "+string(w.failover), func(t *testing.T) {
			results = append(results, runFailover(start(t, "failover"), w))
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "failover at a %s lease, from the kill to the end of the grant, and to the next holder's first fenced write:\n", failoverLease)
	for _, r := range results {
		fmt.Fprintf(&b, "  %-80s failover %-5s grant ended %8s, next write %8s  (kill sent in %s; lock events %s)\n",
			r.way.name, r.way.failover, r.grantEnd.Round(time.Millisecond), r.took.Round(time.Millisecond),
			r.killedIn.Round(time.Millisecond), strings.Join(r.reasons, ","))
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
		{name: "kill -9 of an operator on pkg-leaderelection, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector, pickup: clientGoPickup,
			restart: never, failover: proof, kill: signal("9"), expect: byProof, after: podFailed("")},
		{name: "kill -9 of an operator on pkg-leaderelection, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector, pickup: clientGoPickup,
			restart: never, failover: lease, kill: signal("9"), expect: byLease, after: podFailed("")},
		{name: "OOM kill of a stock client-go elector, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector, pickup: clientGoPickup,
			flags: "--stock", restart: never, failover: proof, kill: signal("USR1"), expect: byProof, after: podFailed("OOMKilled")},
		{name: "OOM kill of a stock client-go elector, restartPolicy Never", holders: "failover-elector.yaml", waiting: elector, pickup: clientGoPickup,
			flags: "--stock", restart: never, failover: lease, kill: signal("USR1"), expect: byLease, after: podFailed("OOMKilled")},
		{name: "kill -9 of an operator on pkg-leaderelection, restartPolicy Always (a restart)", holders: "failover-elector.yaml", waiting: elector, pickup: clientGoPickup,
			restart: always, failover: proof, kill: signal("9"), expect: byLease, after: podRestarted},
		{name: "SIGSTOP of an operator on pkg-leaderelection (frozen)", holders: "failover-elector.yaml", waiting: elector, pickup: clientGoPickup,
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
	first := t.holding(g, w)
	grantEnded := t.watchGrantEnd("leader")

	killed := time.Now()
	out, err := w.kill(t, first.Writer)
	r := failoverResult{way: w, killedIn: time.Since(killed)}
	g.Expect(err).NotTo(HaveOccurred(), "killing %s: %s", first.Writer, out)
	var next storeWrite
	g.Eventually(func(g Gomega) {
		writes := t.storeWrites()
		i := slices.IndexFunc(writes, func(wr storeWrite) bool { return wr.Token > first.Token })
		g.Expect(i).NotTo(Equal(-1), "a write with a fencing token above %d", first.Token)
		next = writes[i]
	}).WithTimeout(failoverLeaseCeiling + time.Minute).WithPolling(time.Second).Should(Succeed())
	r.took = next.At.Sub(killed)
	r.grantEnd = grantEnded(g).Sub(killed)
	t.stepf("grant ended %s after the kill (sent in %s); %s wrote with fencing token %d %s after the kill",
		r.grantEnd.Round(time.Millisecond), r.killedIn.Round(time.Millisecond), next.Writer, next.Token, r.took.Round(time.Millisecond))

	r.reasons = t.checkFailover(g, w, r)
	if w.after != nil {
		w.after(t, g, first.Writer)
	}
	return r
}

// holding waits for the first write to the store, whose writer holds the
// lock, and for the other pod to wait for the lock; it returns that write.
func (t *tc) holding(g Gomega, w failoverWay) storeWrite {
	var first storeWrite
	g.Eventually(func(g Gomega) {
		writes := t.storeWrites()
		g.Expect(writes).NotTo(BeEmpty(), "a holder's write")
		first = writes[0]
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	waiter := map[string]string{"holder-a": "holder-b", "holder-b": "holder-a"}[first.Writer]
	g.Expect(waiter).NotTo(BeEmpty(), "the first write names a holder pod: %+v", first)
	g.Eventually(func() (string, error) { return t.kubectl("-n", t.ns, "logs", waiter) }).
		WithTimeout(2*time.Minute).WithPolling(time.Second).Should(MatchRegexp(w.waiting.String()), "%s waits for the lock", waiter)
	t.stepf("%s holds the lock with fencing token %d; %s waits", first.Writer, first.Token, waiter)
	return first
}

// watchGrantEnd watches a Lease of the test's namespace from now on and
// returns a function that waits for the first write naming another holder
// than the current one (or none: the controller ended the grant, or the
// holder released it) and returns when the watch showed it.
func (t *tc) watchGrantEnd(name string) func(g Gomega) time.Time {
	t.Helper()
	leases := t.cs.CoordinationV1().Leases(t.ns)
	l, err := leases.Get(t.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading Lease %s: %v", name, err)
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	w, err := leases.Watch(t.ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatalf("watching Lease %s: %v", name, err)
	}
	t.Cleanup(w.Stop)
	ended := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			if nl, ok := ev.Object.(*coordinationv1.Lease); ok && ptr.Deref(nl.Spec.HolderIdentity, "") != holder {
				ended <- time.Now()
				return
			}
		}
	}()
	return func(g Gomega) time.Time {
		select {
		case at := <-ended:
			return at
		case <-time.After(failoverLeaseCeiling + time.Minute):
			g.Expect(false).To(BeTrue(), "Lease %s still names %s", name, holder)
			return time.Time{}
		}
	}
}

// checkFailover asserts when the grant ended and when the next holder
// wrote and, from the lock's events, whether a proof ended the grant; it
// returns the events' reasons.
func (t *tc) checkFailover(g Gomega, w failoverWay, r failoverResult) []string {
	var reasons []string
	switch w.expect {
	case byProof, byRelease:
		g.Expect(r.grantEnd).To(BeNumerically("<", failoverFast), "the grant ended at once, not by the lease")
		g.Expect(r.took).To(BeNumerically("<", failoverFast+w.pickup), "the next holder wrote at once (its pickup: %s)", w.pickup)
		if w.expect == byRelease {
			return t.lockEventReasons("leader")
		}
		g.Eventually(func() []string { reasons = t.lockEventReasons("leader"); return reasons }).
			WithTimeout(time.Minute).WithPolling(time.Second).Should(ContainElement("HolderProvenDead"))
	case byLease:
		g.Expect(r.grantEnd).To(BeNumerically(">=", failoverLeaseFloor), "the grant ended by the lease, not before it")
		g.Expect(r.took).To(BeNumerically("<", failoverLeaseCeiling))
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
