//go:build e2e

package e2e

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/frontdesk-dev/frontdesk/test/demo"
)

// TestBillingScenario is the billing scenario as pods: 10 worker pods
// charge 5,000 customers under the "billing" lock; the holder's worker
// process is frozen with SIGSTOP inside its container at 70% of the run until
// the lock has passed to another pod, then thawed. Without fencing at the
// ledger its late writes are duplicate charges; with fencing there are none
// and its stale writes are rejected.
func TestBillingScenario(t *testing.T) {
	for _, round := range []struct {
		name   string
		fenced bool
	}{
		{"without fencing", false},
		{"with fencing", true},
	} {
		t.Run(round.name, func(t *testing.T) {
			st := runBilling(start(t, "billing"), round.fenced)
			if round.fenced {
				if st.Duplicates != 0 || st.ChargedOnce != st.Customers || st.NeverCharged != 0 {
					t.Errorf("with fencing: %d duplicate charges, %d of %d customers charged exactly once, %d never",
						st.Duplicates, st.ChargedOnce, st.Customers, st.NeverCharged)
				}
				if st.Rejected == 0 {
					t.Errorf("with fencing: the thawed worker's stale writes were not rejected (rejected = 0)")
				}
			} else {
				if st.Duplicates == 0 {
					t.Errorf("without fencing: no duplicate charges; the frozen holder's late writes did not land (ledger: %+v)", st)
				}
				if st.Rejected != 0 {
					t.Errorf("without fencing: %d writes rejected by an unfenced ledger", st.Rejected)
				}
			}
		})
	}
}

// runBilling deploys the scenario in the test's namespace, freezes the holder
// at 70% of the charges and thaws it once the lock has moved, and returns the
// ledger's counts once the job is complete and no more writes arrive.
func runBilling(t *tc, fenced bool) demo.Stats {
	g := NewWithT(t)
	t.stepf("ledger (fenced=%v) and 10 workers", fenced)
	t.applyFile("billing.yaml", "FENCED", strconv.FormatBool(fenced))
	t.waitRollout("ledger", 3*time.Minute)

	var frozenPod string
	var frozenToken int64
	g.Eventually(func(g Gomega) {
		pod, token := t.billingHolder()
		st := t.ledgerStats()
		g.Expect(pod).NotTo(BeEmpty(), "a holder pod")
		g.Expect(st.Customers).To(BeNumerically(">", 0))
		g.Expect(st.Charges).To(BeNumerically(">=", st.Customers*7/10), "70%% of the customers charged")
		if st.Complete {
			StopTrying("the job completed before the holder could be frozen").Now()
		}
		g.Expect(t.readyPods("app=worker")).To(BeNumerically(">=", 2), "another worker to take over")
		out, err := t.signalWorker(pod, "STOP")
		g.Expect(err).NotTo(HaveOccurred(), out)
		frozenPod, frozenToken = pod, token
		t.stepf("froze the worker in %s (token %d) after %d charges", pod, token, st.Charges)
	}).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())

	g.Eventually(func() int64 { _, token := t.billingHolder(); return token }).
		WithTimeout(2*time.Minute).WithPolling(time.Second).Should(BeNumerically(">", frozenToken), "the lock passes on")
	out, err := t.signalWorker(frozenPod, "CONT")
	g.Expect(err).NotTo(HaveOccurred(), out)
	t.stepf("lock passed on; thawed %s", frozenPod)

	g.Eventually(func() bool { return t.ledgerStats().Complete }).
		WithTimeout(5*time.Minute).WithPolling(time.Second).Should(BeTrue(), "the job completes")
	// Count once the thawed worker's late writes have landed: no new write
	// (charge or rejection) for 5 seconds.
	var st demo.Stats
	var last string
	stableSince := time.Now()
	g.Eventually(func() time.Duration {
		st = t.ledgerStats()
		if now := strconv.Itoa(st.Charges) + "/" + strconv.Itoa(st.Rejected); now != last {
			last, stableSince = now, time.Now()
		}
		return time.Since(stableSince)
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeNumerically(">=", 5*time.Second))
	t.stepf("ledger: %d customers, %d charges, %d duplicates, %d charged once, %d never, %d rejected",
		st.Customers, st.Charges, st.Duplicates, st.ChargedOnce, st.NeverCharged, st.Rejected)
	return st
}

// signalWorker sends a signal to the worker process in a worker pod (not
// to its shell, PID 1).
func (t *tc) signalWorker(pod, signal string) (string, error) {
	return t.exec(pod, "sh", "-c", "kill -"+signal+" $(pidof frontdesk-demo)")
}

// readyPods counts the Ready pods with the label selector.
func (t *tc) readyPods(selector string) int {
	pods, err := t.pods(selector)
	if err != nil {
		return 0
	}
	n := 0
	for i := range pods {
		if isReady(&pods[i]) {
			n++
		}
	}
	return n
}

// billingHolder is the lock's holder pod and fencing token, from its status.
func (t *tc) billingHolder() (string, int64) {
	l, err := t.lock("billing")
	if err != nil {
		return "", 0
	}
	return l.Status.HolderPod, l.Status.FencingToken
}

// ledgerStats reads the ledger's counts through its pod.
func (t *tc) ledgerStats() demo.Stats {
	var st demo.Stats
	out, err := t.kubectl("-n", t.ns, "exec", "deploy/ledger", "--", "wget", "-qO-", "http://127.0.0.1:8080/stats")
	if err == nil {
		_ = json.Unmarshal([]byte(out), &st)
	}
	return st
}
