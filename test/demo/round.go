package demo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

const (
	demoNamespace = "default"
	lockName      = "billing"
)

// Grant is one grant of the lock seen on the Lease.
type Grant struct {
	Token  int64
	Worker string
	// AtMS is when it was seen, in ms since the round started.
	AtMS int64
}

// RoundResult is what one run of the scenario produced.
type RoundResult struct {
	// Fenced tells whether the ledger checked fencing tokens.
	Fenced bool
	// Stats are counted from the ledger's database.
	Stats Stats
	// Grants are the lock's grants during the round, in order.
	Grants []Grant
	// TokenBefore is the lock's fencing token when the round started.
	TokenBefore int64
	// FrozenWorker was frozen holding FrozenToken.
	FrozenWorker string
	FrozenToken  int64
	// KubectlGet is `kubectl get dlock billing` at the end of the round.
	KubectlGet string
	// Duration of the round.
	Duration time.Duration
}

// round runs the scenario once.
type round struct {
	opts       Options
	fenced     bool
	cs         kubernetes.Interface
	kubeconfig string
	kubectl    string
	out        io.Writer
	start      time.Time

	mu     sync.Mutex
	grants []Grant
	outMu  sync.Mutex // serializes writes to out
}

func (r *round) run(ctx context.Context) (RoundResult, error) {
	r.start = time.Now()
	res := RoundResult{Fenced: r.fenced}
	dir, err := os.MkdirTemp("", "frontdesk-demo-ledger-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ledger, err := StartLedger(dir, r.opts.Customers, r.fenced, "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	defer ledger.Close()
	stopWatch, err := r.watchGrants(ctx)
	if err != nil {
		return res, err
	}
	defer stopWatch()

	workers := make([]*workerProc, 0, r.opts.Workers)
	defer func() {
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Go(func() { w.stop(5 * time.Second) })
		}
		wg.Wait()
	}()
	for i := range r.opts.Workers {
		w, err := startWorker(r.opts, fmt.Sprintf("worker-%02d", i+1), r.kubeconfig, ledger.URL)
		if err != nil {
			return res, err
		}
		workers = append(workers, w)
	}

	frozen, err := r.drive(ctx, ledger, workers)
	if err != nil {
		return res, err
	}
	if frozen != nil {
		res.FrozenWorker = frozen.name
		_, res.FrozenToken, _ = frozen.snapshot()
	}
	stopWatch() // grants made while the workers shut down are not part of the round
	if res.KubectlGet, err = r.kubectlGet(ctx); err != nil {
		return res, err
	}
	if res.Stats, err = ledger.Stats(ctx); err != nil {
		return res, err
	}
	r.mu.Lock()
	res.Grants = append([]Grant(nil), r.grants...)
	r.mu.Unlock()
	res.Duration = time.Since(r.start)
	return res, nil
}

// drive moves the scenario along: freeze the holder at PauseAt of the
// customers, thaw it once the lease has passed to another worker, and
// finish when the job is complete and the thawed worker has stopped
// charging. It prints progress as it goes.
func (r *round) drive(ctx context.Context, ledger *Ledger, workers []*workerProc) (*workerProc, error) {
	deadline := time.Now().Add(3*r.opts.JobDuration + 4*r.opts.LeaseDuration + time.Minute)
	pauseAfter := int(float64(r.opts.Customers) * r.opts.PauseAt)
	var frozen *workerProc
	var frozenToken int64
	thawed := false
	lastProgress := time.Time{}
	for {
		if time.Now().After(deadline) {
			return frozen, fmt.Errorf("the scenario did not finish by its deadline (%s)", time.Until(deadline))
		}
		holder, token := r.currentHolder()
		switch {
		case frozen == nil && token > 0:
			n, err := ledger.chargesWithToken(ctx, token)
			if err != nil {
				return nil, err
			}
			if n >= pauseAfter {
				if frozen = byName(workers, holder); frozen == nil {
					return nil, fmt.Errorf("holder %s is not one of the workers", holder)
				}
				if err := frozen.freeze(); err != nil {
					return nil, err
				}
				frozenToken = token
				r.sayf("%s frozen (SIGSTOP) holding token %d after %d charges: its lease will lapse", frozen.name, token, n)
			}
		case frozen != nil && !thawed && token > frozenToken:
			if err := frozen.thaw(); err != nil {
				return nil, err
			}
			thawed = true
			r.sayf("lease passed to %s with token %d; %s thawed (SIGCONT) and resumes where it was", lock.PodNameOf(holder), token, frozen.name)
		case thawed:
			stats, err := ledger.Stats(ctx)
			if err != nil {
				return nil, err
			}
			// The thawed worker is done only once it finished its batch or
			// was fenced; a lost grant alone does not stop it charging.
			state, _, _ := frozen.snapshot()
			if stats.Complete && (state == stateDone || state == stateFenced || state == stateWaiting) && allSettled(workers) {
				r.progress(ctx, ledger, workers)
				return frozen, nil
			}
		}
		if time.Since(lastProgress) >= r.opts.ProgressEvery {
			r.progress(ctx, ledger, workers)
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond): // the orchestrator's sampling interval
		}
	}
}

// allSettled reports whether no worker is in the middle of a job.
func allSettled(workers []*workerProc) bool {
	for _, w := range workers {
		if state, _, _ := w.snapshot(); state == stateCharging || state == stateHolding || state == "starting" {
			return false
		}
	}
	return true
}

func byName(workers []*workerProc, identity string) *workerProc {
	for _, w := range workers {
		if w.name == lock.PodNameOf(identity) {
			return w
		}
	}
	return nil
}

// progress prints one status line.
func (r *round) progress(ctx context.Context, ledger *Ledger, workers []*workerProc) {
	stats, err := ledger.Stats(ctx)
	if err != nil {
		return
	}
	holder, token := r.currentHolder()
	var states []string
	for _, w := range workers {
		state, tok, frozen := w.snapshot()
		if frozen {
			state = "FROZEN"
		} else if w.lostGrant() && state == stateCharging {
			state = "charging-without-lock"
		}
		if tok > 0 && state != stateWaiting {
			state = fmt.Sprintf("%s(t%d)", state, tok)
		}
		states = append(states, strings.TrimPrefix(w.name, "worker-")+":"+state)
	}
	charged := stats.Customers - stats.NeverCharged
	r.sayf("holder %s token %d | charged %d/%d (%d%%) dup %d rejected %d | %s",
		lock.PodNameOf(holder), token, charged, stats.Customers, 100*charged/max(stats.Customers, 1),
		stats.Duplicates, stats.Rejected, strings.Join(states, " "))
}

func (r *round) sayf(format string, args ...any) {
	mode := "off"
	if r.fenced {
		mode = "on"
	}
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.out, "[%6.1fs fencing %-3s] %s\n", time.Since(r.start).Seconds(), mode, fmt.Sprintf(format, args...))
}

// currentHolder is the newest grant's holder and token.
func (r *round) currentHolder() (string, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.grants) == 0 {
		return "", 0
	}
	g := r.grants[len(r.grants)-1]
	return g.Worker, g.Token
}

// watchGrants records every grant of the lock (a rise of leaseTransitions
// with a holder) from a watch of its Lease.
func (r *round) watchGrants(ctx context.Context) (func(), error) {
	leases := r.cs.CoordinationV1().Leases(demoNamespace)
	current, err := leases.Get(ctx, lockName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading lease %s: %w", lockName, err)
	}
	w, err := leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", lockName).String(),
		ResourceVersion: current.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("watching lease %s: %w", lockName, err)
	}
	last := int64(ptr.Deref(current.Spec.LeaseTransitions, 0))
	go func() {
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			token, holder := int64(ptr.Deref(l.Spec.LeaseTransitions, 0)), ptr.Deref(l.Spec.HolderIdentity, "")
			if token > last && holder != "" {
				r.mu.Lock()
				r.grants = append(r.grants, Grant{Token: token, Worker: holder, AtMS: time.Since(r.start).Milliseconds()})
				r.mu.Unlock()
				r.sayf("granted token %d to %s", token, lock.PodNameOf(holder))
			}
			last = max(last, token)
		}
	}()
	return w.Stop, nil
}

// kubectlGet runs `kubectl get dlock billing` with the built kubectl.
func (r *round) kubectlGet(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, r.kubectl, "--kubeconfig", r.kubeconfig, "get", "dlock", lockName, "-n", demoNamespace).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("kubectl get dlock %s: %w: %s", lockName, err, out)
	}
	return string(out), nil
}

// sortedTokens orders per-token stats by token.
func sortedTokens(ts []TokenStats) []TokenStats {
	out := append([]TokenStats(nil), ts...)
	slices.SortFunc(out, func(a, b TokenStats) int { return cmp.Compare(a.Token, b.Token) })
	return out
}
