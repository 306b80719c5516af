package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// scrape fetches the manager's /metrics.
func scrape(g Gomega) string {
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	body, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	return string(body)
}

// metricValue is the value of the sample whose name and labels match.
func metricValue(g Gomega, text, name, labels string) float64 {
	sel := ""
	if labels != "" {
		sel = `\{` + labels + `\}`
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + sel + ` (\S+)$`)
	m := re.FindStringSubmatch(text)
	g.Expect(m).NotTo(BeNil(), "no sample %s{%s}", name, labels)
	v, err := strconv.ParseFloat(m[1], 64)
	g.Expect(err).NotTo(HaveOccurred())
	return v
}

func TestMetricsEndpointReportsLocks(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	ctx := context.Background()
	g := NewWithT(t)
	for _, holder := range []string{"a", "b", "c"} {
		_, err := harness.Grant(ctx, clientset, ns, "billing", holder)
		g.Expect(err).NotTo(HaveOccurred())
		eventually(t, 2*time.Second, func(g Gomega) {
			g.Expect(getLock(g, ns, "billing").Status.Holder).To(Equal(holder))
		})
	}
	lbl := fmt.Sprintf(`lock="billing",namespace="%s"`, ns)
	eventually(t, 3*time.Second, func(g Gomega) {
		text := scrape(g)
		g.Expect(metricValue(g, text, "frontdesk_lock_held", lbl)).To(Equal(1.0))
		g.Expect(metricValue(g, text, "frontdesk_lock_fencing_token", lbl)).To(Equal(3.0))
		g.Expect(metricValue(g, text, "frontdesk_lock_transitions_total", `kind="acquired",`+lbl)).To(Equal(1.0))
		g.Expect(metricValue(g, text, "frontdesk_lock_transitions_total", `kind="taken_over",`+lbl)).To(Equal(2.0))
		g.Expect(metricValue(g, text, "frontdesk_lock_hold_duration_seconds_count", fmt.Sprintf(`namespace="%s"`, ns))).To(Equal(2.0))
		g.Expect(metricValue(g, text, "frontdesk_status_lag_seconds_count", "")).To(BeNumerically(">", 0))
	})
	// c stops renewing: expired, not held, and the gap until the next grant is timed.
	eventually(t, 6*time.Second, func(g Gomega) {
		text := scrape(g)
		g.Expect(metricValue(g, text, "frontdesk_lock_held", lbl)).To(Equal(0.0))
		g.Expect(metricValue(g, text, "frontdesk_lock_transitions_total", `kind="expired",`+lbl)).To(Equal(1.0))
	})
	_, err := harness.Grant(ctx, clientset, ns, "billing", "d")
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 3*time.Second, func(g Gomega) {
		text := scrape(g)
		g.Expect(metricValue(g, text, "frontdesk_lock_time_to_acquire_seconds_count", fmt.Sprintf(`namespace="%s"`, ns))).To(Equal(1.0))
		g.Expect(metricValue(g, text, "frontdesk_lock_fencing_token", lbl)).To(Equal(4.0))
	})
}
