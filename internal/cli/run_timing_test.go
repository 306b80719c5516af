package cli

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// timingFor is the Timing kubectl dlock run's client uses for a lease.
func timingFor(t *testing.T, lease time.Duration) lock.Timing {
	t.Helper()
	c, err := lock.NewForClients(fake.NewClientset(), dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
		lock.Config{Namespace: "ns", Name: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	return c.TimingFor(lease)
}

// The numbers the --help text quotes, and what auto picks.
func TestMaxGraceFitsTheLease(t *testing.T) {
	for _, tc := range []struct {
		lease      time.Duration
		most, auto time.Duration
	}{
		{lease: time.Second, most: 320000001, auto: 320000001}, // a third of a second is 333,333,333ns
		{lease: 3 * time.Second, most: 1260 * time.Millisecond, auto: 1260 * time.Millisecond},
		{lease: 6 * time.Second, most: 2670 * time.Millisecond, auto: 2670 * time.Millisecond},
		{lease: 15 * time.Second, most: 6900 * time.Millisecond, auto: 6900 * time.Millisecond},
		{lease: 30 * time.Second, most: 13950 * time.Millisecond, auto: 10 * time.Second},
		{lease: time.Hour, most: 28*time.Minute + 11850*time.Millisecond, auto: 10 * time.Second},
	} {
		t.Run(tc.lease.String(), func(t *testing.T) {
			timing := timingFor(t, tc.lease)
			if got := maxGrace(timing); got != tc.most {
				t.Errorf("maxGrace = %s, want %s", got, tc.most)
			}
			if got, err := (graceValue{auto: true}).resolve(timing, "ns/billing"); err != nil || got != tc.auto {
				t.Errorf("auto = %s, %v; want %s", got, err, tc.auto)
			}
			// While renewals succeed, the SIGTERM deadline stays ahead:
			// just before a renewal started RenewInterval after the last
			// one completes (half a renew interval of latency for both),
			// the deadline has not come.
			last := time.Now()
			term, kill := deadlines(last.Add(timing.SafeWindow()), timing, tc.most)
			beforeNext := last.Add(timing.RenewInterval + timing.RenewInterval/2)
			if beforeNext.After(term) {
				t.Errorf("SIGTERM at %s after the last renewal, before the next (started %s after it) could complete",
					term.Sub(last), timing.RenewInterval)
			}
			if got := kill.Sub(term); got != tc.most {
				t.Errorf("SIGKILL %s after SIGTERM, want the grace %s", got, tc.most)
			}
			if end := last.Add(timing.SafeWindow()); !kill.Before(end) {
				t.Errorf("SIGKILL at %s, not before the safe window ends at %s", kill.Sub(last), end.Sub(last))
			}
		})
	}
}

func TestGraceThatDoesNotFitIsRefused(t *testing.T) {
	timing := timingFor(t, 3*time.Second)
	if got, err := (graceValue{d: 1260 * time.Millisecond}).resolve(timing, "ns/billing"); err != nil || got != 1260*time.Millisecond {
		t.Errorf("the largest grace that fits: %s, %v", got, err)
	}
	if got, err := (graceValue{}).resolve(timing, "ns/billing"); err != nil || got != 0 {
		t.Errorf("--grace 0: %s, %v", got, err)
	}
	_, err := (graceValue{d: 2 * time.Second}).resolve(timing, "ns/billing")
	if err == nil {
		t.Fatal("--grace 2s accepted for a 3s lease")
	}
	for _, want := range []string{"--grace 2s does not fit the lease of ns/billing (leaseDurationSeconds: 3)", "at most 1.26s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

func TestGraceFlag(t *testing.T) {
	var v graceValue
	for in, want := range map[string]string{"auto": "auto", "5s": "5s", "0": "0s", "1500ms": "1.5s"} {
		if err := v.Set(in); err != nil || v.String() != want {
			t.Errorf("Set(%q): %v, String() = %q, want %q", in, err, v.String(), want)
		}
	}
	for _, in := range []string{"-1s", "soon", ""} {
		if err := v.Set(in); err == nil {
			t.Errorf("Set(%q) accepted", in)
		}
	}
}
