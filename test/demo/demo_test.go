package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const workerEnv = "FRONTDESK_DEMO_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		// Re-executed by the scenario as a worker process.
		os.Exit(WorkerMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// The billing scenario end to end in --fast mode: real worker processes, a
// real SIGSTOP, a real apiserver and manager. Without fencing the frozen
// holder double-charges; with fencing nobody is charged twice.
func TestBillingScenarioFast(t *testing.T) {
	opts := DefaultOptions().Fast()
	opts.KubeconfigPath = filepath.Join(t.TempDir(), "kubeconfig")
	opts.WorkerCommand = []string{os.Args[0]}
	opts.WorkerEnv = []string{workerEnv + "=1"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, opts, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if len(res.Rounds) != 2 || res.Rounds[0].Fenced || !res.Rounds[1].Fenced {
		t.Fatalf("rounds = %+v, want one without and one with fencing", res.Rounds)
	}

	unfenced, fenced := res.Rounds[0], res.Rounds[1]
	if unfenced.Stats.Duplicates <= 0 {
		t.Errorf("without fencing: %d duplicate charges, want > 0 (the frozen holder resumed and kept charging)", unfenced.Stats.Duplicates)
	}
	if unfenced.Stats.Rejected != 0 {
		t.Errorf("without fencing: %d writes rejected, want 0", unfenced.Stats.Rejected)
	}
	s := fenced.Stats
	if s.Duplicates != 0 || s.ChargedOnce != opts.Customers || s.NeverCharged != 0 || s.Charges != opts.Customers {
		t.Errorf("with fencing: %+v; want every one of %d customers charged exactly once", s, opts.Customers)
	}
	if s.Rejected <= 0 {
		t.Errorf("with fencing: %d stale writes rejected, want > 0", s.Rejected)
	}
	for _, r := range res.Rounds {
		if r.FrozenWorker == "" || len(r.Grants) < 2 {
			t.Errorf("round (fencing %v): frozen %q, grants %+v; want a frozen holder and a takeover", r.Fenced, r.FrozenWorker, r.Grants)
		}
		for i := 1; i < len(r.Grants); i++ {
			if r.Grants[i].Token <= r.Grants[i-1].Token {
				t.Errorf("grant tokens not increasing: %+v", r.Grants)
			}
		}
	}
	// Every rejected write carried the frozen holder's (older) token.
	for _, tok := range s.Tokens {
		if tok.Rejected > 0 && tok.Token != fenced.FrozenToken {
			t.Errorf("token %d had %d writes rejected; only the frozen holder's token %d should", tok.Token, tok.Rejected, fenced.FrozenToken)
		}
	}

	// Tokens taken between the rounds (workers of the first round taking
	// the lock on their way out) are said to be so.
	if last := unfenced.Grants[len(unfenced.Grants)-1].Token; fenced.TokenBefore > last {
		want := fmt.Sprintf("the lock's fencing token is %d: %s went to workers of the previous round", fenced.TokenBefore, tokenSpan(last+1, fenced.TokenBefore))
		if !strings.Contains(out.String(), want) {
			t.Errorf("output does not say where the tokens between the rounds went (%q):\n%s", want, out.String())
		}
	}

	// kubectl get dlock billing shows the final holder and token.
	last := fenced.Grants[len(fenced.Grants)-1]
	row := regexp.MustCompile(`(?m)^billing\s+(\S+)\s+(\d+)\s+True\s`).FindStringSubmatch(fenced.KubectlGet)
	if row == nil {
		t.Fatalf("kubectl get dlock billing:\n%s", fenced.KubectlGet)
	}
	if token, _ := strconv.ParseInt(row[2], 10, 64); row[1] != last.Worker || token != last.Token {
		t.Errorf("kubectl shows holder %s token %s, want %s token %d", row[1], row[2], last.Worker, last.Token)
	}
}

func TestOptionsValidate(t *testing.T) {
	base := DefaultOptions()
	base.WorkerCommand = []string{"worker"}
	cases := []struct {
		mutate func(*Options)
		want   string
	}{
		{func(o *Options) { o.Customers = 3 }, "--customers 3: need at least 10"},
		{func(o *Options) { o.Workers = 1 }, "--workers 1: need at least 2"},
		{func(o *Options) { o.LeaseDuration = 1500 * time.Millisecond }, "--ttl 1.5s: use whole seconds"},
		{func(o *Options) { o.PauseAt = 1 }, "--pause-at 1: use a fraction between 0 and 1"},
		{func(o *Options) { o.JobDuration = 0 }, "--job-duration 0s: must be positive"},
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for _, tc := range cases {
		o := base
		tc.mutate(&o)
		if err := o.Validate(); err == nil || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}

func TestCommas(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 50000: "50,000", 1234567: "1,234,567", -15000: "-15,000"} {
		if got := commas(n); got != want {
			t.Errorf("commas(%d) = %q, want %q", n, got, want)
		}
	}
}
