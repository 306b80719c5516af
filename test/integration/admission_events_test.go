package integration

// The bookkeeping of each admission (its Events and the admission-wait
// histogram) is about the pod admitted, not another one.

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

// admittedNote is the note of a PodAdmitted Event: the pod, its token and
// how long it waited gated.
var admittedNote = regexp.MustCompile(`^admitted pod (\S*) with fencing token (\d+) after (\S+) gated$`)

// admittedEvents lists the PodAdmitted Events of namespace ns.
func admittedEvents(g Gomega, ns string) []eventsv1.Event {
	var list eventsv1.EventList
	g.Expect(k8sClient.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
	var out []eventsv1.Event
	for _, ev := range list.Items {
		if ev.Reason == "PodAdmitted" {
			out = append(out, ev)
		}
	}
	return out
}

// describeEvents is one line per Event: its object and its note.
func describeEvents(evs []eventsv1.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "\n  %s/%s: %q", ev.Regarding.Kind, ev.Regarding.Name, ev.Note)
	}
	return b.String()
}

// eventsAbout are the Events of evs regarding the object of kind and name
// whose note starts with prefix.
func eventsAbout(evs []eventsv1.Event, kind, name, prefix string) []eventsv1.Event {
	var out []eventsv1.Event
	for _, ev := range evs {
		if ev.Regarding.Kind == kind && ev.Regarding.Name == name && strings.HasPrefix(ev.Note, prefix) {
			out = append(out, ev)
		}
	}
	return out
}

// expectAdmissionEvents checks that the pod's admission was reported once
// on the pod (related: the lock) and once on the lock, each naming the pod
// and its token, and returns the wait they report, checked to lie between
// zero and maxWait.
func expectAdmissionEvents(g Gomega, ns, pod, lockName string, token int64, maxWait time.Duration) time.Duration {
	evs := admittedEvents(g, ns)
	onPod := eventsAbout(evs, "Pod", pod, "")
	g.Expect(onPod).To(HaveLen(1), "PodAdmitted events on pod %s; all of them:%s", pod, describeEvents(evs))
	ev := onPod[0]
	g.Expect(ev.Related).NotTo(BeNil())
	g.Expect(ev.Related.Kind).To(Equal("DistributedLock"))
	g.Expect(ev.Related.Name).To(Equal(lockName))
	m := admittedNote.FindStringSubmatch(ev.Note)
	g.Expect(m).NotTo(BeNil(), "note %q", ev.Note)
	g.Expect(m[1]).To(Equal(pod), "the event on pod %s names another pod: %q", pod, ev.Note)
	g.Expect(m[2]).To(Equal(strconv.FormatInt(token, 10)), "note %q, token annotation %d", ev.Note, token)
	wait, err := time.ParseDuration(m[3])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(wait).To(BeNumerically(">=", 0), "note %q", ev.Note)
	g.Expect(wait).To(BeNumerically("<=", maxWait), "note %q", ev.Note)
	onLock := eventsAbout(evs, "DistributedLock", lockName, "admitted pod "+pod+" ")
	g.Expect(onLock).To(HaveLen(1), "PodAdmitted events on the lock naming pod %s; all of them:%s", pod, describeEvents(evs))
	g.Expect(onLock[0].Note).To(Equal(ev.Note))
	return wait
}

// admissionWaits is the count and sum of the admission-wait histogram of
// namespace ns (zero before its first observation).
func admissionWaits(g Gomega, ns string) (count, sum float64) {
	const name = "frontdesk_pod_admission_wait_seconds"
	text := scrape(g)
	lbl := fmt.Sprintf(`namespace="%s"`, ns)
	if !strings.Contains(text, name+"_count{"+lbl+"}") {
		return 0, 0
	}
	return metricValue(g, text, name+"_count", lbl), metricValue(g, text, name+"_sum", lbl)
}

// Gated pods admitted in turn each get their own admission Events (on the
// pod, and on the lock), naming them with their token and a wait no longer
// than the test ran, and one observation each of the admission-wait
// histogram, the wait the Events report.
func TestEachAdmissionIsReportedForThePodAdmitted(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	node := "node-" + ns
	createNode(t, node, true)
	// creationTimestamp is in whole seconds: a wait from it may exceed the
	// time since start by up to one.
	start := time.Now().Truncate(time.Second)
	pods := []string{"a", "b", "c", "d"}
	for _, name := range pods {
		gatedPod(t, ns, name, "billing")
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has a resolution of a second
	}
	g := NewWithT(t)
	var lastToken int64
	var seen, sum float64
	for i, name := range pods {
		token := expectAdmitted(t, ns, name, "billing", 10*time.Second)
		g.Expect(token).To(BeNumerically(">", lastToken))
		var wait time.Duration
		eventually(t, 10*time.Second, func(g Gomega) {
			wait = expectAdmissionEvents(g, ns, name, "billing", token, time.Since(start))
		})
		eventually(t, 10*time.Second, func(g Gomega) {
			count, total := admissionWaits(g, ns)
			g.Expect(count).To(Equal(float64(i+1)), "observations after admitting pod %s", name)
			observed := total - sum
			g.Expect(observed).To(BeNumerically(">=", 0), "pod %s's observation", name)
			g.Expect(observed).To(BeNumerically("<=", time.Since(start).Seconds()), "pod %s's observation", name)
			g.Expect(observed).To(BeNumerically("~", wait.Seconds(), 0.002), "pod %s's observation, its event says %s", name, wait)
			seen, sum = count, total
		})
		t.Logf("pod %s admitted with token %d after %s gated", name, token, wait)
		lastToken = token
		bindPod(t, ns, name, node)
		setPhase(t, ns, name, corev1.PodSucceeded)
	}
	g.Consistently(func(g Gomega) {
		count, total := admissionWaits(g, ns)
		g.Expect(count).To(Equal(seen))
		g.Expect(total).To(Equal(sum))
	}).WithTimeout(time.Second).WithPolling(200*time.Millisecond).Should(Succeed(), "an admission was reported twice")
}
