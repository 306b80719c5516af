package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// size picks the short (CI) or long (make chaos) count.
func size(short, longCount int) int {
	if long {
		return longCount
	}
	return short
}

func TestHolderFrozenPastItsLease(t *testing.T) {
	runScenario(t, scenario{workers: 3, increments: size(6, 30), perGrant: 2, ttl: 2,
		inject: func(t *testing.T, r *runState) {
			for range size(1, 4) {
				var frozen int
				var token int64
				waitFor(t, time.Minute, "a holder", func() bool { frozen, token = r.holderWorker(); return frozen >= 0 })
				r.workers[frozen].Signal(syscall.SIGSTOP)
				waitFor(t, time.Minute, "a takeover", func() bool { _, tok := r.holderWorker(); return tok > token })
				r.workers[frozen].Signal(syscall.SIGCONT)
				t.Logf("froze %s holding token %d until the lock passed on", r.workers[frozen].Name, token)
			}
		}})
}

func TestManagerKilledStandbyTakesOver(t *testing.T) {
	runScenario(t, scenario{workers: 3, increments: size(6, 30), perGrant: 2, ttl: 2,
		inject: func(t *testing.T, r *runState) {
			for i := range size(2, 6) {
				time.Sleep(time.Second) // let the workers make progress between kills
				m := i % len(r.c.managers)
				r.c.managers[m].Kill()
				var err error
				if r.c.managers[m], err = r.c.startManager(m); err != nil {
					t.Fatal(err)
				}
				t.Logf("SIGKILLed and restarted manager-%d", m)
			}
		}})
}

func TestLeaseDeletedAndEditedByHand(t *testing.T) {
	runScenario(t, scenario{workers: 3, increments: size(6, 30), perGrant: 2, ttl: 2,
		inject: func(t *testing.T, r *runState) {
			ctx := context.Background()
			leases := r.c.clientset.CoordinationV1().Leases(r.ns)
			waitFor(t, time.Minute, "a few grants", func() bool { _, tok := r.holderWorker(); return tok >= 2 })
			old, err := leases.Get(ctx, r.lock, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := leases.Delete(ctx, r.lock, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Minute, "the Lease recreated", func() bool {
				l, err := leases.Get(ctx, r.lock, metav1.GetOptions{})
				return err == nil && l.UID != old.UID
			})
			t.Logf("deleted the Lease at token %d; recreated", ptr.Deref(old.Spec.LeaseTransitions, 0))

			waitFor(t, time.Minute, "a grant on the new Lease", func() bool { i, _ := r.holderWorker(); return i >= 0 })
			waitFor(t, time.Minute, "a hand edit", func() bool {
				l, err := leases.Get(ctx, r.lock, metav1.GetOptions{})
				if err != nil || ptr.Deref(l.Spec.LeaseTransitions, 0) < 2 {
					return false
				}
				l.Spec.LeaseTransitions = new(ptr.Deref(l.Spec.LeaseTransitions, 0) - 2)
				l.Spec.HolderIdentity = new(handEditor)
				_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
				return err == nil
			})
			t.Log("wound the Lease's token back by 2 by hand")
		}})
}

// A holder cut off from the apiserver by a TCP proxy (black-holed, dropped
// with resets, or delayed past the lease) cannot renew; it must give the
// lock up (Lost, Context cancelled) before the lock is granted elsewhere.
func TestClientCutOffFromTheAPIServer(t *testing.T) {
	runScenario(t, scenario{workers: 3, increments: size(6, 20), perGrant: 2, hold: 1500 * time.Millisecond, ttl: 3,
		tune: proxiedWorker,
		inject: func(t *testing.T, r *runState) {
			modes := []faultMode{blackhole, drop, delay}
			for i := range size(len(modes), 2*len(modes)) {
				mode := modes[i%len(modes)]
				var cut int
				var token int64
				waitFor(t, time.Minute, "a holder", func() bool { cut, token = r.holderWorker(); return cut >= 0 })
				r.proxies[cut].Fail(mode)
				waitFor(t, time.Minute, "a takeover", func() bool { _, tok := r.holderWorker(); return tok > token })
				r.proxies[cut].Restore()
				checkGaveUpFirst(t, r, cut, token, mode.String(), false)
			}
		}})
}

// checkGaveUpFirst waits for the grant after token and checks that worker
// `cut`, which the Lease named as holder of token when it was cut off
// (how), gave it up before that grant was returned, or never learnt it
// had it (the fault swallowed the answer to its acquire). With mustLose,
// the grant must have ended by loss (ErrLost), not by the worker's own
// release.
func checkGaveUpFirst(t *testing.T, r *runState, cut int, token int64, how string, mustLose bool) {
	t.Helper()
	waitFor(t, 30*time.Second, "the next holder to report its grant", func() bool {
		return lossAndNextGrant(r, cut, token).grantedAt != 0
	})
	// The cut worker's lines come through a pipe, and a held-back answer
	// can still arrive (delay mode): give both time to show.
	poll(delayBy+time.Second, func() bool {
		ev := lossAndNextGrant(r, cut, token)
		return ev.acquiredAt != 0 && ev.lostAt != 0
	})
	ev := lossAndNextGrant(r, cut, token)
	name := r.workers[cut].Name
	switch {
	case ev.acquiredAt == 0:
		t.Logf("%s cut off (%s) as the Lease granted it token %d; the answer never reached it, so it never held it", name, how, token)
	case ev.lostAt == 0:
		t.Errorf("%s was cut off holding token %d and its grant never ended", name, token)
	case ev.lostAt >= ev.grantedAt:
		t.Errorf("%s gave token %d up %s after the next grant", name, token, time.Duration(ev.lostAt-ev.grantedAt))
	case mustLose && !strings.Contains(ev.cause, lock.ErrLost.Error()):
		t.Errorf("%s's grant of token %d ended by %q, not by noticing its loss", name, token, ev.cause)
	default:
		t.Logf("%s cut off (%s) holding token %d; gave it up %s before the next grant (%s)",
			name, how, token, time.Duration(ev.grantedAt-ev.lostAt).Round(time.Millisecond), ev.cause)
	}
}

// grantEnd is when a worker's grant of a token was returned to it and when
// it stopped believing it held it, and when the next grant (a higher token)
// was returned to any worker; wall-clock ns (one machine's clock), 0 if not
// seen.
type grantEnd struct {
	acquiredAt, lostAt, grantedAt int64
	// cause is why the grant ended, as the worker's Context said.
	cause string
}

// lossAndNextGrant reads the workers' lines for worker cut's grant of token.
func lossAndNextGrant(r *runState, cut int, token int64) grantEnd {
	var ev grantEnd
	for _, e := range parseEvents(cut, r.workers[cut].Output()) {
		switch {
		case e.kind == "acquire" && e.token == token:
			ev.acquiredAt = e.ret
		case e.kind == "end" && e.token == token:
			ev.lostAt, ev.cause = e.call, e.detail
		}
	}
	for i, w := range r.workers {
		for _, e := range parseEvents(i, w.Output()) {
			if e.kind == "acquire" && e.token > token && (ev.grantedAt == 0 || e.ret < ev.grantedAt) {
				ev.grantedAt = e.ret
			}
		}
	}
	return ev
}

// kube-apiserver SIGKILLed and restarted with the same flags (etcd keeps
// its data) while clients hold and renew: clients and controller recover
// without a restart of their own.
func TestAPIServerKilledAndRestarted(t *testing.T) {
	runScenario(t, scenario{workers: 3, increments: size(6, 30), perGrant: 2, hold: 300 * time.Millisecond, ttl: 5,
		inject: func(t *testing.T, r *runState) {
			for range size(1, 3) {
				waitFor(t, time.Minute, "a holder", func() bool { i, _ := r.holderWorker(); return i >= 0 })
				restartAPIServer(t, r.c)
			}
		}})
}

// runScenario runs the workers, injects the faults, and checks the safety
// properties.
func runScenario(t *testing.T, sc scenario) {
	c := sc.cluster
	if c == nil {
		c = suite
	}
	ns := newNamespace(t, c)
	lockName := "counter"
	history := createLockWithHistory(t, c, ns, lockName, sc.ttl)
	defer history.Stop()
	r := &runState{c: c, ns: ns, lock: lockName, ledger: newLedger(), history: history}
	defer r.ledger.srv.Close()
	sampler := sampleStatusTokens(c, ns, lockName)

	for i := range sc.workers {
		spec := workerSpec{kubeconfig: c.kubeconfigPath, increments: sc.increments, hold: sc.hold}
		if sc.tune != nil {
			sc.tune(t, r, i, &spec)
		}
		r.specs = append(r.specs, spec)
		w, err := harness.StartProcess(fmt.Sprintf("worker-%d", i), []string{os.Args[0],
			"--kubeconfig", spec.kubeconfig, "--namespace", ns, "--lock", lockName, "--url", r.ledger.srv.URL,
			"--increments", fmt.Sprint(spec.increments), "--per-grant", fmt.Sprint(sc.perGrant), "--hold", spec.hold.String()},
			[]string{workerEnv + "=1", "POD_NAME=" + fmt.Sprintf("worker-%d", i)}, os.Stderr)
		if err != nil {
			t.Fatal(err)
		}
		r.workers = append(r.workers, w)
		defer w.Kill()
	}

	sc.inject(t, r)
	for _, w := range r.workers {
		select {
		case <-w.Done:
		case <-time.After(3 * time.Minute):
			t.Fatalf("%s did not finish: %s", w.Name, strings.Join(w.Output(), "\n"))
		}
	}
	checkLedger(t, r)
	checkGrants(t, r)
	checkStatusConverges(t, c, ns, lockName)
	sampler.check(t)
}

// checkLedger: accepted writes never went back in token; every increment
// built on the one before it (none lost, none applied twice); the count is
// what the workers report.
func checkLedger(t *testing.T, r *runState) {
	value, writes, rejected := r.ledger.snapshot()
	want := 0
	for _, spec := range r.specs {
		want += spec.increments
	}
	total := 0
	for _, w := range r.workers {
		for _, ev := range parseEvents(0, w.Output()) {
			if ev.kind == "done" {
				total += ev.acceptedDone
			}
		}
	}
	if total != want || value != want {
		t.Errorf("ledger value %d, workers report %d accepted increments; want %d", value, total, want)
	}
	var last int64
	next := 0
	for i, w := range writes {
		if w.token < last {
			t.Errorf("write %d accepted with token %d after token %d", i, w.token, last)
		}
		last = max(last, w.token)
		if w.from < 0 {
			continue
		}
		if w.from != next {
			t.Errorf("write %d incremented from %d, but the value was %d: an increment was lost or applied twice", i, w.from, next)
		}
		next = w.from + 1
	}
	t.Logf("ledger: %d accepted writes, %d stale writes rejected, final value %d", len(writes), rejected, value)
}

// checkGrants: every grant the workers saw has its own token, grants on
// the Lease go strictly up, and the acquire history is linearizable as a
// sequencer of strictly increasing tokens (porcupine).
func checkGrants(t *testing.T, r *runState) {
	var ops []porcupine.Operation
	seen := map[int64]string{}
	for i, w := range r.workers {
		for _, ev := range parseEvents(i, w.Output()) {
			if ev.kind != "acquire" {
				continue
			}
			if other, dup := seen[ev.token]; dup {
				t.Errorf("token %d granted to both %s and %s", ev.token, other, w.Name)
			}
			seen[ev.token] = w.Name
			ops = append(ops, porcupine.Operation{ClientId: i, Input: "acquire", Call: ev.call, Output: ev.token, Return: ev.ret})
		}
	}
	var highest int32
	for i, g := range r.history.Grants() {
		if g.Holder == handEditor {
			continue // a fault, not a grant
		}
		if g.Token <= highest {
			t.Errorf("grant %d on the Lease (to %s) has token %d, not above %d granted before it", i, g.Holder, g.Token, highest)
		}
		highest = max(highest, g.Token)
	}
	if res := porcupine.CheckOperationsTimeout(sequencerModel, ops, 30*time.Second); res != porcupine.Ok {
		t.Errorf("the grant history is not linearizable as a sequencer of increasing tokens (%v)", res)
	}
	t.Logf("%d grants, all distinct, linearizable; the Lease history watch resumed %d times", len(ops), r.history.Resumes())
}

// sequencerModel: each acquire returns a token greater than every token
// returned by an acquire that finished before it started.
var sequencerModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		tok := output.(int64)
		return tok > state.(int64), tok
	},
	DescribeOperation: func(input, output any) string { return fmt.Sprintf("acquire -> %d", output) },
}

// checkStatusConverges: the lock's status catches up with its Lease.
func checkStatusConverges(t *testing.T, c *cluster, ns, name string) {
	ctx := context.Background()
	waitFor(t, 30*time.Second, "status to converge to the Lease", func() bool {
		lk := &locksv1alpha1.DistributedLock{}
		lease, err := c.clientset.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || c.k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, lk) != nil {
			return false
		}
		return lk.Status.FencingToken == int64(ptr.Deref(lease.Spec.LeaseTransitions, 0)) &&
			lk.Status.Holder == ptr.Deref(lease.Spec.HolderIdentity, "")
	})
}

// statusSampler watches a lock's status token; it must never go down, also
// from one lock to the next of the same name.
type statusSampler struct {
	stop chan struct{}
	done chan []int64
}

func sampleStatusTokens(c *cluster, ns, name string) *statusSampler {
	s := &statusSampler{stop: make(chan struct{}), done: make(chan []int64, 1)}
	go func() {
		var tokens []int64
		for {
			select {
			case <-s.stop:
				s.done <- tokens
				return
			case <-time.After(50 * time.Millisecond): // sampling interval
			}
			// Across a lock deleted and created again too: a status not
			// yet written (no leaseName) is no sample.
			lk := &locksv1alpha1.DistributedLock{}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second) // the apiserver may be down
			if err := c.k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, lk); err == nil && lk.Status.LeaseName != "" {
				tokens = append(tokens, lk.Status.FencingToken)
			}
			cancel()
		}
	}()
	return s
}

func (s *statusSampler) check(t *testing.T) {
	close(s.stop)
	tokens := <-s.done
	if len(tokens) < 3 {
		t.Errorf("only %d status samples", len(tokens))
	}
	if !slices.IsSorted(tokens) {
		t.Errorf("status.fencingToken went down: %v", tokens)
	}
}

// handEditor is the holder a scenario writes into the Lease by hand.
const handEditor = "someone-by-hand"

// proxiedWorker gives worker i a kubeconfig through a proxy of its own, in
// front of the cluster's apiserver, which the scenario can fail.
func proxiedWorker(t *testing.T, r *runState, i int, w *workerSpec) {
	t.Helper()
	p, path := proxiedKubeconfig(t, r.c.kubeconfigPath, fmt.Sprintf("worker-%d", i))
	r.proxies = append(r.proxies, p)
	t.Cleanup(p.Close)
	w.kubeconfig = path
}

// proxiedKubeconfig writes a copy of the kubeconfig whose server is a new
// proxy in front of the given targets (default: the kubeconfig's server).
func proxiedKubeconfig(t *testing.T, kubeconfig, name string, targets ...string) (*proxy, string) {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(kc.Clusters) != 1 {
		t.Fatalf("%s names %d clusters; the proxy stands in front of exactly one", kubeconfig, len(kc.Clusters))
	}
	var p *proxy
	for _, c := range kc.Clusters {
		if len(targets) == 0 {
			targets = []string{strings.TrimPrefix(c.Server, "https://")}
		}
		if p, err = newProxy(targets...); err != nil {
			t.Fatal(err)
		}
		c.Server = "https://" + p.Addr()
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-"+name)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return p, path
}
