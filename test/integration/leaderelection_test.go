package integration

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clientgole "k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/controllers"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
)

// tokenIn parses the number that follows prefix in line.
func tokenIn(t *testing.T, line, prefix string) int64 {
	t.Helper()
	f := strings.Fields(strings.TrimPrefix(line, prefix))
	if len(f) == 0 {
		t.Fatalf("no token in %q", line)
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		t.Fatalf("token in %q: %v", line, err)
	}
	return n
}

// Two real controller-runtime managers, in processes of their own, elect a
// leader through pkg/leaderelection on a Lease that a DistributedLock
// adopted while the first one held it (an operator that already ran: its
// earlier version, on client-go's own LeaseLock, created the Lease). Each
// leader writes a fenced ConfigMap with its token. The leader is frozen
// with SIGSTOP past its lease; the other takes over with a higher token,
// which the lock's status and the Lease confirm; thawed, the old leader's
// writes are refused by the apiserver, and it exits.
func TestLeaderElectionFencesAFrozenControllerRuntimeLeader(t *testing.T) {
	installFencingPolicy(t)
	ns := guardedNamespace(t) // client-go's election must pass the Lease guard too
	ctx := context.Background()
	g := NewWithT(t)
	const lease, cmName = "payments-operator", "ledger"

	// The operator ran before anyone declared a lock: its earlier version
	// created the election Lease (client-go starts it at token 0) and
	// released it on upgrade. pkg/leaderelection never creates it.
	electWithLeaseLockAndRelease(t, ns, lease, "op-v1")
	a := startLeaderWorker(t, ns, lease, "op-a", cmName)
	tokenA := tokenIn(t, a.waitFor(t, "leading token ", 20*time.Second), "leading token ")
	created := getLease(g, ns, lease)
	g.Expect(ptr.Deref(created.Spec.HolderIdentity, "")).To(Equal("op-a"))
	g.Expect(int64(ptr.Deref(created.Spec.LeaseTransitions, -1))).To(Equal(tokenA), "the Term's token is the Lease's leaseTransitions")

	// Declare the lock over the held Lease; the fenced object.
	createReadyLock(t, testutil.MakeLock(lease, ns).LeaseDuration(int32(workerLeaseDuration/time.Second)).
		LeaseAdoption(locksv1alpha1.LeaseAdoptionWhileHeld).Obj())
	eventually(t, 5*time.Second, func(g Gomega) {
		lk := getLock(g, ns, lease)
		g.Expect(lk.Status.Holder).To(Equal("op-a"))
		g.Expect(lk.Status.FencingToken).To(Equal(tokenA))
		g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonHeld))
		g.Expect(eventReasons(g, ns, lease)).To(ContainElement(controllers.EventLeaseAdopted))
	})
	ledger := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cmName, Namespace: ns}}
	g.Expect(k8sClient.Create(ctx, ledger)).To(Succeed())
	history := recordWrites(t, ns, ledger)
	a.waitFor(t, "write ok token "+strconv.FormatInt(tokenA, 10), 20*time.Second) // the policy loads asynchronously

	b := startLeaderWorker(t, ns, lease, "op-b", cmName)
	b.waitFor(t, "manager starting", 10*time.Second)
	g.Consistently(func() []string { return linesWith(b.since(0), "leading") }).
		WithTimeout(time.Second).WithPolling(50*time.Millisecond).Should(BeEmpty(), "b leads while a renews")

	// Freeze the leader past its lease.
	g.Expect(syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP)).To(Succeed())
	frozenAt := time.Now()
	tokenB := tokenIn(t, b.waitFor(t, "leading token ", 15*time.Second), "leading token ")
	takeover := time.Since(frozenAt)
	g.Expect(tokenB).To(BeNumerically(">", tokenA))
	eventually(t, 5*time.Second, func(g Gomega) {
		l := getLease(g, ns, lease)
		g.Expect(ptr.Deref(l.Spec.HolderIdentity, "")).To(Equal("op-b"))
		g.Expect(int64(ptr.Deref(l.Spec.LeaseTransitions, -1))).To(Equal(tokenB))
		lk := getLock(g, ns, lease)
		g.Expect(lk.Status.Holder).To(Equal("op-b"))
		g.Expect(lk.Status.FencingToken).To(Equal(tokenB))
		g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonHeld))
		// No lease guard is installed here: either the controller ended
		// the frozen leader's grant and op-b acquired the free lock, or
		// op-b, a stock client-go elector, took it over on its own
		// judgement of expiry first (the guard refuses that: see
		// TestStockClientGoElectorsOfTwoServiceAccountsTakeTurns).
		g.Expect(eventReasons(g, ns, lease)).To(Or(ContainElement(controllers.EventTakenOver),
			ContainElements(controllers.EventExpired, controllers.EventAcquired)))
	})
	b.waitFor(t, "write ok token "+strconv.FormatInt(tokenB, 10), 10*time.Second)

	// Thaw it: it writes with its old token before it notices, and exits.
	seenBeforeThaw := a.count()
	thawedAt := time.Now()
	g.Expect(syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT)).To(Succeed())
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the old leader did not exit after it lost the election")
	}
	exited := time.Since(thawedAt)
	late := a.since(seenBeforeThaw)
	refused := linesWith(late, "write refused token "+strconv.FormatInt(tokenA, 10))
	g.Expect(refused).NotTo(BeEmpty(), "the old leader made no write after its thaw:\n%s", strings.Join(late, "\n"))
	for _, l := range refused {
		g.Expect(l).To(ContainSubstring("stale fencing token " + strconv.FormatInt(tokenA, 10)))
	}
	// What the apiserver stored, in order: once the new leader's token is
	// in, every later version is the new leader's. A write the old leader
	// reports as ok after the thaw was stored before that (it was in flight
	// when it froze).
	versions := history.get()
	first := slices.IndexFunc(versions, func(v ledgerWrite) bool { return v.token == strconv.FormatInt(tokenB, 10) })
	g.Expect(first).To(BeNumerically(">=", 0))
	for _, v := range versions[first:] {
		g.Expect(v.writer).To(Equal("op-b"), "a write of the old leader landed after the takeover: %+v", versions)
	}
	for _, l := range linesWith(late, "write ok") {
		seq := strings.Fields(l)[5]
		g.Expect(slices.Index(versions[:first], ledgerWrite{"op-a", strconv.FormatInt(tokenA, 10), seq})).
			To(BeNumerically(">=", 0), "%q after the thaw: not a write stored before the takeover", l)
	}
	g.Expect(linesWith(late, "manager stopped: leader election lost")).To(HaveLen(1))
	atExit := linesWith(late, "term at exit: ")
	g.Expect(atExit).To(HaveLen(1))
	g.Expect(atExit[0]).To(ContainSubstring(leaderelection.ErrLost.Error()), "the old leader's Term ended")

	// How long each believed it still led after the thaw: the Term, and
	// client-go (controller-runtime stops when client-go does).
	termEnded := a.firstAt(seenBeforeThaw, "term ended: ")
	managerStopped := a.firstAt(seenBeforeThaw, "manager stopped: ")

	final := &corev1.ConfigMap{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: cmName}, final)).To(Succeed())
	g.Expect(final.Data["writer"]).To(Equal("op-b"))
	g.Expect(final.Annotations[locksv1alpha1.FencingTokenAnnotation]).To(Equal(strconv.FormatInt(tokenB, 10)))
	t.Logf("takeover %s after SIGSTOP (lease %s, renew deadline %s, retry %s); tokens %d -> %d; "+
		"old leader after SIGCONT: Term ended in %s, client-go stopped leading in %s, %d write(s) refused, exited in %s",
		takeover.Round(time.Millisecond), workerLeaseDuration, workerRenewDeadline, workerRetryPeriod, tokenA, tokenB,
		termEnded.Sub(thawedAt).Round(time.Millisecond), managerStopped.Sub(thawedAt).Round(time.Millisecond),
		len(refused), exited.Round(time.Millisecond))
}

// electWithLeaseLockAndRelease leads once with client-go's own LeaseLock,
// which creates the Lease when there is none, and releases it.
func electWithLeaseLockAndRelease(t *testing.T, ns, lease, identity string) {
	t.Helper()
	lk := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: ns, Name: lease},
		Client: clientset.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: identity}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	le, err := clientgole.NewLeaderElector(clientgole.LeaderElectionConfig{
		Lock: lk, LeaseDuration: workerLeaseDuration, RenewDeadline: workerRenewDeadline, RetryPeriod: workerRetryPeriod,
		ReleaseOnCancel: true,
		Callbacks:       clientgole.LeaderCallbacks{OnStartedLeading: func(context.Context) { cancel() }, OnStoppedLeading: func() {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the earlier version did not lead and release")
	}
	if l := getLease(NewWithT(t), ns, lease); ptr.Deref(l.Spec.HolderIdentity, "x") != "" {
		t.Fatalf("the earlier version did not release the Lease: holder %q", ptr.Deref(l.Spec.HolderIdentity, ""))
	}
}

// ledgerWrite is one stored version of the fenced ConfigMap.
type ledgerWrite struct{ writer, token, seq string }

// writeHistory is every version of an object the apiserver stored, in
// order, from a watch.
type writeHistory struct {
	mu       sync.Mutex
	versions []ledgerWrite
}

func (h *writeHistory) get() []ledgerWrite {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.versions)
}

// recordWrites watches cm from the version just created until the test ends.
func recordWrites(t *testing.T, ns string, cm *corev1.ConfigMap) *writeHistory {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := clientset.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + cm.Name, ResourceVersion: cm.ResourceVersion})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h := &writeHistory{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if c, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type == watch.Modified {
				h.mu.Lock()
				h.versions = append(h.versions, ledgerWrite{c.Data["writer"], c.Data["token"], c.Data["seq"]})
				h.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return h
}

// elector runs a stock client-go LeaderElector through pkg/leaderelection
// until stopped.
type elector struct {
	lock *leaderelection.Lock
	stop context.CancelFunc
	done chan struct{}
}

func startElector(t *testing.T, ns, lease, identity string, releaseOnCancel bool) *elector {
	t.Helper()
	lk, err := leaderelection.New(clientset.CoordinationV1(), leaderelection.Config{Namespace: ns, Name: lease, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	le, err := clientgole.NewLeaderElector(clientgole.LeaderElectionConfig{
		// Longer than the operator processes' timings: a release that
		// times out on a loaded machine would make a lapse of it.
		Lock: resourcelock.Interface(lk), LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 300 * time.Millisecond,
		ReleaseOnCancel: releaseOnCancel,
		Callbacks:       clientgole.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e := &elector{lock: lk, stop: cancel, done: make(chan struct{})}
	go func() { le.Run(ctx); close(e.done) }()
	t.Cleanup(func() { cancel(); <-e.done })
	return e
}

// term waits until the elector leads.
func (e *elector) term(t *testing.T, timeout time.Duration) *leaderelection.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	term, err := e.lock.WaitForTerm(ctx)
	if err != nil {
		t.Fatalf("%s did not lead within %s: %v", e.lock.Identity(), timeout, err)
	}
	return term
}

// halt stops the elector and waits until client-go's Run returned.
func (e *elector) halt(t *testing.T) {
	t.Helper()
	e.stop()
	select {
	case <-e.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the elector did not stop")
	}
}

// A lock over a client-go election Lease reads right: holder and token as
// each leader's Term reports them (checked against the Lease too), Held
// while renewed, client-go's own release (holder cleared, duration 1s) as
// Released, a leader that stops without releasing as Expired, and the
// next leader as Acquired or TakenOver.
func TestLeaderElectionStatusOfClientGoLeaders(t *testing.T) {
	ns := guardedNamespace(t)
	g := NewWithT(t)
	const lease = "scheduler"
	createReadyLock(t, testutil.MakeLock(lease, ns).LeaseDuration(3).Obj()) // declared first: the controller creates the Lease
	floor := getLease(g, ns, lease)

	expectHeldBy := func(identity string, term *leaderelection.Term) {
		t.Helper()
		l := getLease(g, ns, lease)
		g.Expect(ptr.Deref(l.Spec.HolderIdentity, "")).To(Equal(identity))
		g.Expect(int64(ptr.Deref(l.Spec.LeaseTransitions, -1))).To(Equal(term.Token()), "the Term's token is the Lease's")
		eventually(t, 3*time.Second, func(g Gomega) {
			lk := getLock(g, ns, lease)
			g.Expect(lk.Status.Holder).To(Equal(identity))
			g.Expect(lk.Status.FencingToken).To(Equal(term.Token()))
			g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonHeld))
		})
	}

	x := startElector(t, ns, lease, "sched-x", true)
	termX := x.term(t, 5*time.Second)
	g.Expect(termX.Token()).To(Equal(int64(ptr.Deref(floor.Spec.LeaseTransitions, 0)) + 1))
	expectHeldBy("sched-x", termX)

	// client-go releases on cancel: holder cleared, lease duration 1s.
	x.halt(t)
	g.Expect(errors.Is(context.Cause(termX.Context()), leaderelection.ErrReleased)).To(BeTrue(), "%v", context.Cause(termX.Context()))
	eventually(t, 3*time.Second, func(g Gomega) {
		lk := getLock(g, ns, lease)
		g.Expect(lk.Status.Holder).To(BeEmpty())
		g.Expect(lk.Status.FencingToken).To(Equal(termX.Token()), "a release keeps the token")
		g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonNotHeld))
		g.Expect(eventMessages(g, ns, lease, controllers.EventReleased)).To(ContainElement(ContainSubstring("sched-x released the lock")))
	})

	// The next leader needs no wait after a release; it stops without
	// releasing, and the controller sees its lease lapse.
	y := startElector(t, ns, lease, "sched-y", false)
	termY := y.term(t, 5*time.Second)
	g.Expect(termY.Token()).To(Equal(termX.Token() + 1))
	expectHeldBy("sched-y", termY)
	y.halt(t)
	g.Expect(errors.Is(context.Cause(termY.Context()), leaderelection.ErrLost)).To(BeTrue(), "%v", context.Cause(termY.Context()))
	eventually(t, 8*time.Second, func(g Gomega) {
		lk := getLock(g, ns, lease)
		g.Expect(lk.Status.Holder).To(BeEmpty(), "the controller ends a lapsed grant")
		g.Expect(heldReason(lk)).To(Equal(locksv1alpha1.ReasonExpired))
		g.Expect(eventMessages(g, ns, lease, controllers.EventExpired)).To(ContainElement(ContainSubstring("sched-y stopped renewing")))
	})

	z := startElector(t, ns, lease, "sched-z", true)
	termZ := z.term(t, 10*time.Second)
	g.Expect(termZ.Token()).To(Equal(termY.Token() + 1))
	expectHeldBy("sched-z", termZ)
	eventually(t, 3*time.Second, func(g Gomega) {
		g.Expect(eventMessages(g, ns, lease, controllers.EventAcquired)).To(ContainElement(ContainSubstring("sched-z acquired the lock")))
		g.Expect(countOf(eventReasons(g, ns, lease), controllers.EventAcquired)).To(Equal(3), "x, y and z each acquired a free lock")
	})
	z.halt(t)
	eventually(t, 3*time.Second, func(g Gomega) {
		lk := getLock(g, ns, lease)
		g.Expect(meta.IsStatusConditionFalse(lk.Status.Conditions, locksv1alpha1.ConditionHeld)).To(BeTrue())
		g.Expect(lk.Status.FencingToken).To(Equal(termZ.Token()))
	})
}
