package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// Environment of the adversary run (docs/testing.md).
const (
	// adversarySeedEnv fixes the seed (random by default, always logged).
	adversarySeedEnv = "FRONTDESK_ADVERSARY_SEED"
	// adversaryWritesEnv is how many writes the adversary sends.
	adversaryWritesEnv = "FRONTDESK_ADVERSARY_WRITES"
	// adversaryJournalEnv, when set, is a file the run writes every write
	// of the adversary to (sent, outcome, body).
	adversaryJournalEnv = "FRONTDESK_ADVERSARY_JOURNAL"
	// adversaryRoundsEnv is the least number of honest rounds (default 2):
	// with FRONTDESK_ADVERSARY_WRITES=0, the same honest traffic without
	// the adversary, for comparison.
	adversaryRoundsEnv = "FRONTDESK_ADVERSARY_ROUNDS"
	// adversaryShortWrites is the run in make test.
	adversaryShortWrites = 1000
)

// A participant with two pods of one ServiceAccount (real pod-bound
// tokens, the shipped roles and policies installed) sends thousands of
// random writes to a lock's Lease (adversary_writes_test.go) while honest
// participants use the lock: a holder that holds and releases, waiters
// that Acquire (the next holders), a TryAcquire poller. Checked throughout
// and at the end:
//
//	(a) no honest live grant ends early (lost before its holder releases),
//	    and every honest release lands;
//	(b) no token is granted twice: every grant on the Lease's history has a
//	    token above the last, and the honest grants' tokens rise;
//	(c) the honest waiter at the head of the queue when the holder releases
//	    holds within a lease and a second; the adversary queues only
//	    behind a waiter registered before it;
//	(d) the queue keeps no entry nobody can read or remove: once the run
//	    ends every place is a well-formed place (lease.Queue sees it), and
//	    once the adversary's pods are gone the queue of the free lock
//	    empties;
//	(e) the manager's reconcile errors do not rise (passes that lost a
//	    write race on the Lease are counted apart), and it reports no
//	    InvalidGrant;
//
// and every honest Acquire and TryAcquire ends with a grant or ErrHeld.
// Two more surfaces take a share of the adversary's writes (issue 36): a
// pod creator's pods that run holding the lock (adversary_pods_test.go:
// (p1) a pod whose ServiceAccount may not use the lock is never queued or
// granted, and is warned; (p2) no pod is marked but for a grant of its
// own; (c) counts each pod queued ahead of the head for podDelay), and
// fenced objects (adversary_fenced_test.go: (f) no fenced object's token
// is malformed, goes down, is below the lock's or above the Lease's, and
// every honest holder's write with its token lands).
// Each failure names the seed; FRONTDESK_ADVERSARY_SEED replays its draws.
func TestAdversaryCannotMakeALockUnusable(t *testing.T) {
	seed, writes, rounds := adversarySettings(t)
	const leaseSeconds = 3
	// The validating guard alone (config/default): config/mutating would
	// rewrite the principal of grants the guard is to refuse.
	ns := guardedLockIn(t, guardAloneNamespace(t), "adv", leaseSeconds)
	g := NewWithT(t)
	// Admitted pods that do not start are deleted after 2 s (issue 36's
	// pod surface): each pod queued ahead of an honest waiter costs it at
	// most podDelay.
	lk := getLock(g, ns, "adv")
	lk.Spec.PodStartTimeoutSeconds = adversaryPodStart
	g.Expect(k8sClient.Update(context.Background(), lk)).To(Succeed())
	run := &adversaryRun{t: t, ns: ns, name: "adv", seed: seed, lease: leaseSeconds * time.Second, minRounds: rounds,
		rng: rand.New(rand.NewPCG(seed, math.MaxUint64))}
	for _, name := range []string{"alice", "bob", "carol", "dave"} {
		run.honest = append(run.honest, &honestParticipant{name: name, p: newPodParticipant(t, ns, name, name+"-0")})
	}
	poller := &honestParticipant{name: "erin", p: newParticipant(t, ns, "erin", "")} // impersonated, no pod
	for _, h := range append(run.honest, poller) {
		h.p.cfg.UserAgent = "honest-" + h.name // the field manager its writes record
	}
	adv := &adversary{ns: ns, name: "adv", seed: seed, pods: newAdversaryPods(t, ns, "mallory", 2), themes: leaseThemes(),
		kinds: writeKinds(), stats: newWriteStats(), journal: &journal{}}
	for _, h := range append(run.honest, poller) {
		adv.honest = append(adv.honest, h.p.principal)
		if h.p.pod != nil {
			adv.victims = append(adv.victims, locksv1alpha1.PodIdentity(h.p.pod.Name, string(h.p.pod.UID), ""))
		}
	}
	// The adversary's pods consent to marks for the lock: holding it
	// under their own identity, bound to their own principal, marks them.
	for _, p := range adv.pods {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"},"annotations":{%q:"adv"}}}`, locksv1alpha1.ParticipantLabel,
			locksv1alpha1.MayHoldAnnotation)
		_, err := clientset.CoreV1().Pods(ns).Patch(context.Background(), p.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	// The other surfaces: a pod creator, fenced objects.
	rights := map[string]bool{"nobody": false, "default": false, "ghost": false}
	for _, sa := range []string{"nobody", "default"} {
		err := k8sClient.Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}})
		g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "creating ServiceAccount %s: %v", sa, err)
	}
	for _, sa := range []string{"mallory", "alice", "bob", "carol", "dave", "erin", "probe"} {
		rights[sa] = true
	}
	surfacesCtx, stopSurfaces := context.WithCancel(context.Background())
	defer stopSurfaces()
	adv.creator = newPodSurface(t, ns, "adv", rights, adversaryPodStart*time.Second)
	adv.creator.history = watchPods(surfacesCtx, t, ns, "adv")
	adv.fenced = newFencedSurface(t, ns, "adv", []string{"mallory", "alice", "bob", "carol", "dave"})
	adv.fenced.history = watchConfigMaps(surfacesCtx, t, ns)
	kubeletDone := make(chan struct{})
	go func() {
		defer close(kubeletDone)
		adv.creator.kubelet(surfacesCtx, t)
	}()
	run.adv = adv
	errorsBefore := metricValue(g, scrape(g), "controller_runtime_reconcile_errors_total", `controller="distributedlock"`)
	var reconcileErrors reconcileErrorLog
	defer managerLog.watch(reconcileErrors.note(ns))()
	history, err := harness.WatchLeaseHistory(context.Background(), clientset, ns, "adv")
	g.Expect(err).NotTo(HaveOccurred())
	defer history.Stop()
	statusCtx, stopStatus := context.WithCancel(context.Background())
	defer stopStatus()
	run.statuses = watchLockStatus(statusCtx, t, ns, "adv")
	t.Logf("adversary: seed %d, %d writes (%s=%d %s=%d to replay)", seed, writes, adversarySeedEnv, seed, adversaryWritesEnv, writes)

	// 1. The honest side and the adversary, until the adversary has sent
	//    its writes.
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	advDone := make(chan struct{})
	go func() {
		defer close(advDone)
		run.attack(ctx, writes)
	}()
	pollerDone := make(chan struct{})
	stopPoller := make(chan struct{})
	go func() {
		defer close(pollerDone)
		run.poll(ctx, poller, stopPoller)
	}()
	run.honestRounds(ctx, advDone)
	close(stopPoller)
	<-pollerDone
	<-advDone
	elapsed := time.Since(start)

	// 2. The end: the queue well formed, then empty once the adversary's
	//    pods (and the pod creator's) are gone; the history's tokens; the
	//    pods' marks and admissions; the fenced objects; the manager's
	//    errors.
	adv.creator.removeAll(t)
	run.checkQueueAtEnd(adv)
	stopSurfaces()
	<-kubeletDone
	history.Stop()
	run.versions, run.receivedAt = history.Versions(), history.ReceivedAt()
	run.checkTokens(run.versions)
	podVersions, cmVersions, statuses := adv.creator.history.all(), adv.fenced.history.all(), run.statuses.all()
	run.checkPods(adv.creator, podVersions, statuses)
	run.checkFenced(cmVersions, statuses)
	eventually(t, 10*time.Second, func(g Gomega) {
		after := metricValue(g, scrape(g), "controller_runtime_reconcile_errors_total", `controller="distributedlock"`)
		// A pass whose compare-and-swap of the Lease, or of a pod it
		// admits, loses to a write landed since its read (the adversary's,
		// the pod creator's, an honest client's) ends in "lost a write
		// race" and runs again from a fresh read: the manager's Lease
		// writes on a pod's behalf (admission, candidates) are Updates of
		// the Lease as read, and its admission of a pod (token annotation,
		// gate removal) is a write of the pod as read. Counted and shown,
		// not a violation; every other error is.
		races := reconcileErrors.matching(func(msg string) bool {
			return strings.Contains(msg, "lost a write race") &&
				(strings.Contains(msg, "on leases.coordination.k8s.io") || strings.Contains(msg, `on pods \"`) || strings.Contains(msg, `on pods "`))
		})
		run.leaseRaces = races
		if after > errorsBefore+float64(races) {
			run.violatef("e", "the manager's reconcile errors rose from %v to %v during the run (%d of them write races on the Lease or a pod); its log:\n%s",
				errorsBefore, after, races, reconcileErrors.summary())
		}
		var events eventsv1.EventList
		g.Expect(k8sClient.List(context.Background(), &events, client.InNamespace(ns))).To(Succeed())
		for _, ev := range events.Items {
			if ev.Reason == "InvalidGrant" {
				run.violateAtf(ev.EventTime.Time, "", "e", "the manager recorded InvalidGrant (a grant whose token is not above the record): %s", ev.Note)
			}
		}
	})

	t.Logf("adversary: seed %d, %d writes in %s (%.0f/s); %d honest rounds, liveness checked in %d (slowest hand-off %s), %d honest grants",
		seed, writes, elapsed.Round(time.Second), float64(writes)/elapsed.Seconds(), run.rounds, run.livenessChecks,
		run.slowest.Round(time.Millisecond), len(run.grants))
	t.Logf("the manager's passes that lost a write race on the Lease or a pod (retried from a fresh read): %d", run.leaseRaces)
	t.Logf("liveness checked behind the pod creator's pods in %d rounds (slowest %s; bound a lease and a second, and %s a pod)",
		run.behindPods, run.slowestBehindPods.Round(time.Millisecond), run.podDelay())
	reasons := map[string]int{}
	for _, r := range eventReasons(g, ns, "adv") {
		reasons[r]++
	}
	t.Logf("the lock's events: %v", reasons)
	t.Logf("writes by surface:\n%s", adv.stats.table(0, "surface"))
	for _, surface := range []string{"lease", "pods", "fenced"} {
		t.Logf("%s writes by kind:\n%s", surface, adv.stats.tableOf(1, "kind", surface))
	}
	t.Logf("writes by theme:\n%s", adv.stats.table(2, "theme"))
	t.Logf("outcomes:\n%s", adv.stats.outcomes())
	t.Logf("the pod creator's pods:\n%s", run.podReport(adv.creator, podVersions))
	t.Logf("fenced objects: %s", run.fencedReport(adv.fenced, cmVersions))
	if path := os.Getenv(adversaryJournalEnv); path != "" {
		if err := adv.journal.writeTo(path); err != nil {
			t.Errorf("writing the journal: %v", err)
		}
	}
	run.report()
}

// adversarySettings reads the seed and the number of writes.
func adversarySettings(t *testing.T) (seed uint64, writes, rounds int) {
	t.Helper()
	seed = rand.Uint64() >> 1
	if s := os.Getenv(adversarySeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", adversarySeedEnv, s, err)
		}
	}
	writes = adversaryShortWrites
	if s := os.Getenv(adversaryWritesEnv); s != "" {
		var err error
		if writes, err = strconv.Atoi(s); err != nil || writes < 0 {
			t.Fatalf("%s=%q: a number of writes", adversaryWritesEnv, s)
		}
	}
	rounds = 2
	if s := os.Getenv(adversaryRoundsEnv); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			t.Fatalf("%s=%q: a positive number of rounds", adversaryRoundsEnv, s)
		}
	}
	return seed, writes, rounds
}

// honestParticipant is one honest workload: a pod of its own
// ServiceAccount, or an impersonated user.
type honestParticipant struct {
	name string
	p    participant
	n    int // Acquire calls so far: each has an identity of its own
}

// client is a lock client with a fresh identity.
func (h *honestParticipant) client(t *testing.T, ns, name string) *lock.Client {
	h.n++
	return h.p.lockClient(t, ns, name, fmt.Sprintf("%s-%d", h.name, h.n))
}

// honestGrant is a grant an honest participant holds.
type honestGrant struct {
	who      *honestParticipant
	identity string
	token    int64
	at       time.Time
	g        *lock.Grant
	released atomic.Bool
}

// waiter is an honest Acquire in flight.
type waiter struct {
	who      *honestParticipant
	identity string
	ticket   string
	// ahead are the tickets ahead of it when its place first showed.
	ahead  map[string]bool
	cancel context.CancelFunc
	done   <-chan acquireResult
}

// violation is one broken invariant.
type violation struct {
	invariant string
	at        time.Time
	msg       string
	// needle, when not "", names what to look for in the adversary's
	// writes and the Lease's history (a ticket).
	needle string
}

type adversaryRun struct {
	t      *testing.T
	ns     string
	name   string
	seed   uint64
	lease  time.Duration
	honest []*honestParticipant
	adv    *adversary
	rng    *rand.Rand // the honest side's choices (its own goroutine)
	// minRounds is the least number of honest rounds.
	minRounds int

	// statuses records the lock's status as the manager writes it.
	statuses *statusHistory
	// versions is the Lease's history, once the run is over, and when
	// each version was received.
	versions   []coordinationv1.Lease
	receivedAt []time.Time

	mu             sync.Mutex
	grants         []*honestGrant
	violations     []violation
	rounds         int
	livenessChecks int
	slowest        time.Duration
	// behindPods counts the liveness checks of a head behind pods of the
	// pod creator's; slowestBehindPods is the slowest of them.
	behindPods        int
	slowestBehindPods time.Duration
	// leaseRaces counts the manager's passes that lost a write race on the
	// Lease or on a pod it admits (reconcile errors that are no violation).
	leaseRaces int
}

// violatef records a broken invariant.
func (run *adversaryRun) violatef(invariant, format string, args ...any) {
	run.violateAboutf("", invariant, format, args...)
}

// violateAboutf records a broken invariant about needle (a ticket).
func (run *adversaryRun) violateAboutf(needle, invariant, format string, args ...any) {
	run.violateAtf(time.Now(), needle, invariant, format, args...)
}

// violateAtf records a broken invariant seen at a moment past.
func (run *adversaryRun) violateAtf(at time.Time, needle, invariant, format string, args ...any) {
	run.mu.Lock()
	defer run.mu.Unlock()
	v := violation{invariant: invariant, at: at, msg: fmt.Sprintf(format, args...), needle: needle}
	run.violations = append(run.violations, v)
	run.t.Logf("VIOLATION (%s) at %s: %s", invariant, v.at.Format("15:04:05.000"), v.msg)
}

// report fails the test with each violation, the seed, and the
// adversary's accepted writes in the two lease durations before it.
func (run *adversaryRun) report() {
	run.mu.Lock()
	defer run.mu.Unlock()
	for i, v := range run.violations {
		if i == 20 {
			run.t.Errorf("... and %d more violations", len(run.violations)-i)
			break
		}
		var b strings.Builder
		if v.needle != "" {
			fmt.Fprintf(&b, "the adversary's accepted writes that name %s:\n", v.needle)
			mentioning := run.adv.journal.acceptedMentioning(v.needle)
			if len(mentioning) > 8 {
				fmt.Fprintf(&b, "  (%d more before)\n", len(mentioning)-8)
				mentioning = mentioning[len(mentioning)-8:]
			}
			for _, e := range mentioning {
				fmt.Fprintf(&b, "  %s\n", e)
			}
			fmt.Fprintf(&b, "the Lease's versions that changed what names %s:\n", v.needle)
			for _, line := range historyMentioning(run.versions, v.needle, run.adv.journal) {
				fmt.Fprintf(&b, "  %s\n", line)
			}
		} else {
			fmt.Fprintf(&b, "the Lease's versions in the %s before (received at; written by; what changed):\n", run.lease)
			for _, line := range run.versionsBetween(v.at.Add(-run.lease), v.at) {
				fmt.Fprintf(&b, "  %s\n", line)
			}
			fmt.Fprintf(&b, "the lock's status as the manager wrote it in the %s before:\n", run.lease)
			for _, line := range run.statuses.between(v.at.Add(-run.lease), v.at) {
				fmt.Fprintf(&b, "  %s\n", line)
			}
		}
		run.t.Errorf("seed %d: invariant (%s) broken at %s: %s\n%s", run.seed, v.invariant, v.at.Format("15:04:05.000"), v.msg, b.String())
	}
}

// attack sends the adversary's writes from two workers (one request in
// flight each).
func (run *adversaryRun) attack(ctx context.Context, writes int) {
	var next atomic.Uint64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= uint64(writes) {
					return
				}
				run.adv.write(ctx, i)
			}
		})
	}
	wg.Wait()
}

// track follows an honest grant: lost before its release breaks (a).
func (run *adversaryRun) track(who *honestParticipant, identity string, g *lock.Grant) *honestGrant {
	hg := &honestGrant{who: who, identity: identity, token: g.Token(), at: time.Now(), g: g}
	run.mu.Lock()
	run.grants = append(run.grants, hg)
	run.mu.Unlock()
	if who.p.pod != nil {
		run.honestWrite(hg, "right after its grant")
	}
	g.OnLost(func(err error) {
		if !hg.released.Load() {
			run.violatef("a", "%s (%s, token %d) lost its live grant %s after it got it: %v", identity, who.p.principal, hg.token,
				time.Since(hg.at).Round(time.Millisecond), err)
		}
	})
	return hg
}

// release releases an honest grant; it must land.
func (run *adversaryRun) release(hg *honestGrant) {
	if err := hg.g.Context().Err(); err != nil {
		run.violatef("a", "%s (token %d) no longer held its grant when it came to release it: %v", hg.identity, hg.token, context.Cause(hg.g.Context()))
	}
	hg.released.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hg.g.Release(ctx); err != nil {
		run.violatef("a", "%s (token %d) could not release its grant: %v", hg.identity, hg.token, err)
	}
}

// startWaiter starts an honest Acquire of who.
func (run *adversaryRun) startWaiter(who *honestParticipant) *waiter {
	c := who.client(run.t, run.ns, run.name)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	return &waiter{who: who, identity: c.Identity(), cancel: cancel, done: acquireInBackground(ctx, c)}
}

// queued waits until w's place shows in the queue and notes what is
// ahead of it. It returns false if w's Acquire ended first (its result is
// then in *r).
func (run *adversaryRun) queued(w *waiter, r *acquireResult) bool {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case res := <-w.done:
			*r = res
			return false
		default:
		}
		l, err := clientset.CoordinationV1().Leases(run.ns).Get(context.Background(), run.name, metav1.GetOptions{})
		if err == nil {
			q := lease.Queue(l)
			for i, p := range q {
				if p.Identity == w.identity && p.Principal == w.who.p.principal {
					w.ticket, w.ahead = p.Ticket, map[string]bool{}
					for _, o := range q[:i] {
						w.ahead[o.Ticket] = true
					}
					return true
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	run.violatef("c", "%s (%s) did not show in the queue within 20 s of its Acquire", w.identity, w.who.p.principal)
	*r = <-w.done
	return false
}

// granted takes the result of an honest Acquire: a grant (tracked), or
// nil and a violation.
func (run *adversaryRun) granted(w *waiter, r acquireResult) *honestGrant {
	if r.err != nil {
		run.violatef("c", "the Acquire of %s (%s) failed: %v", w.identity, w.who.p.principal, r.err)
		return nil
	}
	return run.track(w.who, w.identity, r.grant)
}

// idle lists the honest participants with no Acquire or grant.
func (run *adversaryRun) idle(busy ...*honestParticipant) []*honestParticipant {
	var out []*honestParticipant
	for _, h := range run.honest {
		free := true
		for _, b := range busy {
			free = free && b != h
		}
		if free {
			out = append(out, h)
		}
	}
	return out
}

// honestRounds runs rounds of the honest side until the adversary is done
// (and two rounds at least). A round is a hand-off (mostly): waiters
// register while the adversary holds back (it withdraws its places), the
// adversary then writes at will while the holder holds, the holder
// releases, and the head of the queue must hold within a lease and a
// second. Or a free spell: the waiters give up, the holder releases (the
// lock falls free, or to the adversary's places), and the next holder
// Acquires behind whatever is queued.
func (run *adversaryRun) honestRounds(ctx context.Context, advDone <-chan struct{}) {
	first := run.startWaiter(run.honest[0])
	holder := run.granted(first, <-first.done)
	if holder == nil {
		run.t.Errorf("seed %d: the first honest Acquire failed", run.seed)
		return
	}
	var queue []*waiter
	defer func() {
		for _, w := range queue {
			run.giveUp(w)
		}
		if holder != nil {
			run.release(holder)
		}
	}()
	for round := 0; ; round++ {
		select {
		case <-advDone:
			if round >= run.minRounds {
				return
			}
		default:
		}
		run.mu.Lock()
		run.rounds++
		run.mu.Unlock()
		busy := []*honestParticipant{holder.who}
		for _, w := range queue {
			busy = append(busy, w.who)
		}

		if round > 0 && run.rng.IntN(4) == 0 {
			// A free spell.
			for _, w := range queue {
				run.giveUp(w)
			}
			queue = nil
			run.hold(ctx, holder)
			run.release(holder)
			// The lock falls free (or to the adversary's places): the next
			// holder comes a while later, so the adversary gets to take it.
			time.Sleep(time.Duration(run.rng.Float64() * float64(run.lease)))
			idle := run.idle(holder.who)
			w := run.startWaiter(idle[run.rng.IntN(len(idle))])
			if holder = run.granted(w, <-w.done); holder == nil {
				return
			}
			continue
		}

		// 1. Register waiters while the adversary holds back.
		want := 1 + run.rng.IntN(2)
		run.adv.yield.Store(true)
		run.awaitNoAdversaryPlaces()
		for len(queue) < want {
			idle := run.idle(busy...)
			w := run.startWaiter(idle[run.rng.IntN(len(idle))])
			busy = append(busy, w.who)
			var r acquireResult
			if run.queued(w, &r) {
				queue = append(queue, w)
				continue
			}
			// It took the lock at once: the holder's grant is gone.
			run.violatef("a", "%s got the lock (%v) while %s (token %d) held it", w.identity, r.err, holder.identity, holder.token)
			if got := run.granted(w, r); got != nil {
				run.release(got)
			}
		}
		run.adv.yield.Store(false)

		// 2. Hold while the adversary writes; then release, and the head
		//    holds within a lease and a second, and podDelay more for
		//    each pod of the pod creator's queued ahead of it.
		run.hold(ctx, holder)
		head := queue[0]
		applies, podsAhead := run.headBeforeRelease(head)
		bound := run.lease + time.Second + time.Duration(podsAhead)*run.podDelay()
		releasedAt := time.Now()
		run.release(holder)
		var r acquireResult
		select {
		case r = <-head.done:
		case <-time.After(90 * time.Second):
			run.violatef("c", "%s (at the head: %v) did not get the lock within 90 s of the release", head.identity, applies)
			r = <-head.done
		}
		took := r.at.Sub(releasedAt)
		if applies && r.err == nil {
			run.mu.Lock()
			run.livenessChecks++
			run.slowest = max(run.slowest, took)
			if podsAhead > 0 {
				run.behindPods++
				run.slowestBehindPods = max(run.slowestBehindPods, took)
			}
			run.mu.Unlock()
			if took > bound {
				run.violatef("c", "%s, at the head of the queue (behind %d of the pod creator's pods) when %s released, held %s after the release (bound %s)",
					head.identity, podsAhead, holder.identity, took.Round(time.Millisecond), bound)
			}
		}
		queue = queue[1:]
		if holder = run.granted(head, r); holder == nil {
			return
		}
	}
}

// hold waits a random 0.3 to 1.5 lease durations, writing the fenced
// ledger with hg's token halfway.
func (run *adversaryRun) hold(ctx context.Context, hg *honestGrant) {
	d := time.Duration((0.3 + 1.2*run.rng.Float64()) * float64(run.lease))
	for i, part := range []time.Duration{d / 2, d - d/2} {
		if i == 1 {
			run.honestWrite(hg, "while it holds")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(part):
		}
	}
}

// podDelay is how long a pod of the pod creator's queued ahead of an
// honest waiter keeps it waiting at most: the lock's start timeout (an
// admitted pod that never starts is deleted then, and its grant ends at
// once; one that runs, runs half of it at most here), and a lease
// duration more when it went without a confirmed stop (a force deletion
// of a bound pod: its grant is waited out), and a second for the passes.
func (run *adversaryRun) podDelay() time.Duration {
	return adversaryPodStart*time.Second + run.lease + time.Second
}

// giveUp ends an honest waiter's Acquire; its place must go with it.
func (run *adversaryRun) giveUp(w *waiter) {
	w.cancel()
	r := <-w.done
	if r.err == nil {
		// It got the lock as it gave up: a grant like any other.
		run.release(run.track(w.who, w.identity, r.grant))
		return
	}
	if !errors.Is(r.err, context.Canceled) && !errors.Is(r.err, context.DeadlineExceeded) {
		run.violatef("c", "the Acquire of %s (%s) failed: %v", w.identity, w.who.p.principal, r.err)
	}
	if w.ticket == "" {
		return
	}
	if l, err := clientset.CoordinationV1().Leases(run.ns).Get(context.Background(), run.name, metav1.GetOptions{}); err == nil {
		if _, ok := l.Annotations[lease.EntryKey(w.ticket)]; ok {
			run.violatef("d", "%s gave up, and its place %s is still in the queue", w.identity, w.ticket)
		}
	}
}

// awaitNoAdversaryPlaces waits (5 s at most) until the adversary, asked
// to yield, has withdrawn its places.
func (run *adversaryRun) awaitNoAdversaryPlaces() {
	deadline := time.Now().Add(5 * time.Second)
	var left []string
	for time.Now().Before(deadline) {
		l, err := clientset.CoordinationV1().Leases(run.ns).Get(context.Background(), run.name, metav1.GetOptions{})
		if err == nil {
			left = left[:0]
			for _, p := range run.adv.principals() {
				left = append(left, ownPlaces(l, p)...)
			}
			if len(left) == 0 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	run.t.Logf("the adversary did not withdraw its places %v within 5 s (it may be unable to); its last withdrawals:", left)
	for _, e := range run.adv.journal.last("place-withdraw", 5) {
		run.t.Logf("  %s\n    %s", e, e.err)
	}
}

// headBeforeRelease reports whether the liveness bound applies to head
// just before the release (it is at the head of the queue, or behind
// places of the pod creator's pods only) and how many pods are ahead of
// it, and records a violation for every place of the adversary, or of
// the pod creator's pods, ahead of it that was not there when head
// registered.
func (run *adversaryRun) headBeforeRelease(head *waiter) (bool, int) {
	l, err := clientset.CoordinationV1().Leases(run.ns).Get(context.Background(), run.name, metav1.GetOptions{})
	if err != nil {
		return false, 0
	}
	q := lease.Queue(l)
	pods, others, found := 0, 0, false
	for _, p := range q {
		if p.Ticket == head.ticket {
			found = true
			break
		}
		creators := run.adv.creator != nil && run.adv.creator.ownsTicket(p.Ticket)
		if creators {
			pods++
		} else {
			others++
		}
		if (creators || run.adv.podOf(p.Principal) >= 0) && !head.ahead[p.Ticket] {
			run.violateAboutf(p.Ticket, "c", "the adversary's place %s (%q, by %s) was registered after %s's (%s, %q) and is ahead of it",
				p.Ticket, l.Annotations[lease.EntryKey(p.Ticket)], p.Principal, head.identity, head.ticket,
				l.Annotations[lease.EntryKey(head.ticket)])
		}
	}
	return found && others == 0, pods
}

// poll is a caller outside the queue: TryAcquire now and then, holding
// briefly what it gets. It ends with stop.
func (run *adversaryRun) poll(ctx context.Context, who *honestParticipant, stop <-chan struct{}) {
	r := rand.New(rand.NewPCG(run.seed, math.MaxUint64-1))
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(300+r.IntN(400)) * time.Millisecond):
		}
		c := who.client(run.t, run.ns, run.name)
		g, err := c.TryAcquire(ctx)
		switch {
		case err == nil:
			hg := run.track(who, c.Identity(), g)
			time.Sleep(time.Duration(200+r.IntN(600)) * time.Millisecond)
			run.release(hg)
		case errors.Is(err, lock.ErrHeld), ctx.Err() != nil:
		default:
			run.violatef("c", "TryAcquire of %s (%s) failed: %v", c.Identity(), who.p.principal, err)
		}
	}
}
