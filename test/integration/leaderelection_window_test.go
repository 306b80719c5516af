package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgole "k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// Election timings of the window tests: each of the leader's requests is
// bounded by half its RenewDeadline (NewForConfig), 1.25s; the candidate
// reads every 100ms, so it sees each new record at once.
const (
	windowLease         = 3 * time.Second
	windowRenewDeadline = 2500 * time.Millisecond
	windowRetryPeriod   = 300 * time.Millisecond
	candidateRetry      = 100 * time.Millisecond
)

// runElector runs a stock client-go LeaderElector on lk until the test
// ends.
func runElector(t *testing.T, lk resourcelock.Interface, retry time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	le, err := clientgole.NewLeaderElector(clientgole.LeaderElectionConfig{
		Lock: lk, LeaseDuration: windowLease, RenewDeadline: windowRenewDeadline, RetryPeriod: retry,
		Callbacks: clientgole.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// startTappedLeader runs a client-go elector through pkg/leaderelection
// whose requests go through tap, and waits for its Term.
func startTappedLeader(t *testing.T, ns, lease string, tap *harness.Tap) *leaderelection.Term {
	t.Helper()
	rc := restConfig()
	rc.ContentType = "application/json" // so the test can read the records it sends
	rc.WrapTransport = tap.Wrap
	lk, err := leaderelection.NewForConfig(rc, leaderelection.Config{Namespace: ns, Name: lease, Identity: "leader",
		RenewDeadline: windowRenewDeadline})
	if err != nil {
		t.Fatal(err)
	}
	runElector(t, lk, windowRetryPeriod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	term, err := lk.WaitForTerm(ctx)
	if err != nil {
		t.Fatalf("the leader did not lead: %v", err)
	}
	return term
}

// takeover is what the leader's Term was when a stock client-go candidate
// sent the write that takes the Lease over.
type takeover struct {
	sent       time.Time
	termLive   bool
	validUntil time.Time
}

// watchedCandidate is a stock client-go candidate (resourcelock.LeaseLock)
// that records, as it sends its first write (the takeover: a candidate
// writes only to take over), whether term was still live.
type watchedCandidate struct {
	tap  *harness.Tap
	once sync.Once
	seen chan takeover
}

func startWatchedCandidate(t *testing.T, ns, lease string, term *leaderelection.Term) *watchedCandidate {
	t.Helper()
	c := &watchedCandidate{tap: harness.NewTap(), seen: make(chan takeover, 1)}
	c.tap.Decide(func(r *harness.Request) harness.Action {
		if r.Method == http.MethodPut {
			c.once.Do(func() {
				c.seen <- takeover{sent: time.Now(), termLive: term.Context().Err() == nil, validUntil: term.ValidUntil()}
			})
		}
		return harness.Action{}
	})
	rc := restConfig()
	rc.WrapTransport = c.tap.Wrap
	lk := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: ns, Name: lease},
		Client: kubernetes.NewForConfigOrDie(rc).CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: "candidate"}}
	runElector(t, lk, candidateRetry)
	return c
}

// reads is how many times the candidate has read the Lease.
func (c *watchedCandidate) reads() int {
	return len(slices.DeleteFunc(c.tap.Requests(), func(r harness.Request) bool { return r.Method != http.MethodGet }))
}

// expectNoOverlap waits for the candidate's takeover and checks that the
// leader's Term had ended, and its ValidUntil passed, before it was sent.
func (c *watchedCandidate) expectNoOverlap(t *testing.T, cutAt time.Time) {
	t.Helper()
	select {
	case to := <-c.seen:
		t.Logf("takeover sent %s after the leader was cut off, %s after the leader's ValidUntil",
			to.sent.Sub(cutAt).Round(time.Millisecond), to.sent.Sub(to.validUntil).Round(time.Millisecond))
		if to.termLive {
			t.Errorf("the leader's Term was live when the candidate sent its takeover (ValidUntil %s after it)",
				to.validUntil.Sub(to.sent).Round(time.Millisecond))
		}
		if to.validUntil.After(to.sent) {
			t.Errorf("the leader's ValidUntil is %s after the candidate's takeover was sent", to.validUntil.Sub(to.sent).Round(time.Millisecond))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the candidate did not take over")
	}
}

// leaseRecord is the Lease a request carried.
func leaseRecord(t *testing.T, r harness.Request) *coordinationv1.Lease {
	t.Helper()
	var l coordinationv1.Lease
	if err := json.Unmarshal(r.Body, &l); err != nil {
		t.Fatalf("a Lease write the test cannot read (%v): %.200s", err, r.Body)
	}
	return &l
}

// A renewal is stored but its answer is lost; client-go resends the same
// record (its renewTime taken once per attempt), which succeeds; then the
// leader is cut off. A stock client-go candidate saw that record when the
// first write stored it, and does not restart its wait for the identical
// resend: the leader's Term must end before it takes over, so the window
// counts from the first write, not from the resend 1.25s (the lost
// answer's timeout) later.
func TestLeaderElectionTermEndsBeforeACandidateTakesOverAfterALostAnswer(t *testing.T) {
	ns := newNamespace(t)
	const lease = "window-lost"
	createReadyLock(t, testutil.MakeLock(lease, ns).LeaseDuration(int32(windowLease/time.Second)).Obj())
	tap := harness.NewTap()
	term := startTappedLeader(t, ns, lease, tap)
	cand := startWatchedCandidate(t, ns, lease, term)
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(cand.reads()).To(BeNumerically(">=", 3)) })

	// The next renewal: stored, answer lost. The resend: answered. Then
	// nothing more gets through.
	var puts atomic.Int32
	var cutAt atomic.Pointer[time.Time]
	tap.Decide(func(r *harness.Request) harness.Action {
		if cutAt.Load() != nil {
			return harness.Action{CutOff: true}
		}
		if r.Method != http.MethodPut {
			return harness.Action{}
		}
		switch puts.Add(1) {
		case 1:
			return harness.Action{LoseAnswer: true}
		default:
			now := time.Now()
			cutAt.Store(&now) // from the next request on
			return harness.Action{}
		}
	})
	cand.expectNoOverlap(t, waitForCut(t, &cutAt))

	writes := slices.DeleteFunc(tap.Requests(), func(r harness.Request) bool { return r.Method != http.MethodPut })
	lost := slices.IndexFunc(writes, func(r harness.Request) bool { return r.Status == 0 })
	if lost < 0 || lost+1 >= len(writes) || writes[lost+1].Status != http.StatusOK {
		t.Fatalf("expected a write whose answer was lost, then an answered resend; writes: %+v", writes)
	}
	first, resent := leaseRecord(t, writes[lost]), leaseRecord(t, writes[lost+1])
	if !first.Spec.RenewTime.Equal(resent.Spec.RenewTime) {
		t.Fatalf("client-go did not resend the same record: renewTime %s, then %s", first.Spec.RenewTime, resent.Spec.RenewTime)
	}
}

// waitForCut returns when the leader was cut off.
func waitForCut(t *testing.T, cutAt *atomic.Pointer[time.Time]) time.Time {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if at := cutAt.Load(); at != nil {
			return *at
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the leader was never cut off")
	return time.Time{}
}

// Renewals every 300ms: within one wall-clock second they carry renewTimes
// a stock client-go candidate cannot tell apart (its record's JSON shows
// them to the second), so it counts from the first of them. The leader is
// cut off after a renewal that came at least 550ms after the first one of
// its second: its Term must still end before the candidate takes over, so
// the window counts from the first renewal of that second, not the last.
func TestLeaderElectionTermEndsBeforeACandidateTakesOverAfterSameSecondRenewals(t *testing.T) {
	ns := newNamespace(t)
	const lease = "window-second"
	createReadyLock(t, testutil.MakeLock(lease, ns).LeaseDuration(int32(windowLease/time.Second)).Obj())
	tap := harness.NewTap()
	term := startTappedLeader(t, ns, lease, tap)
	cand := startWatchedCandidate(t, ns, lease, term)
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(cand.reads()).To(BeNumerically(">=", 3)) })

	var cutAt atomic.Pointer[time.Time]
	tap.Decide(func(r *harness.Request) harness.Action {
		if cutAt.Load() != nil {
			return harness.Action{CutOff: true}
		}
		if r.Method == http.MethodPut && lastRenewalLateInItsSecond(tap.Requests(), 550*time.Millisecond) {
			now := time.Now()
			cutAt.Store(&now)
			return harness.Action{CutOff: true}
		}
		return harness.Action{}
	})
	cand.expectNoOverlap(t, waitForCut(t, &cutAt))
}

// lastRenewalLateInItsSecond reports whether the last answered write
// carried a renewTime in the same second as an answered write sent at
// least late earlier.
func lastRenewalLateInItsSecond(reqs []harness.Request, late time.Duration) bool {
	ok := slices.DeleteFunc(reqs, func(r harness.Request) bool { return r.Method != http.MethodPut || r.Status != http.StatusOK })
	if len(ok) < 2 {
		return false
	}
	last := ok[len(ok)-1]
	second, known := renewSecondOf(last)
	return known && slices.ContainsFunc(ok[:len(ok)-1], func(r harness.Request) bool {
		s, known := renewSecondOf(r)
		return known && s == second && last.Sent.Sub(r.Sent) >= late
	})
}

// renewSecondOf is the wall-clock second of the renewTime a Lease write
// carried.
func renewSecondOf(r harness.Request) (int64, bool) {
	var l coordinationv1.Lease
	if err := json.Unmarshal(r.Body, &l); err != nil || l.Spec.RenewTime == nil {
		return 0, false
	}
	return l.Spec.RenewTime.Unix(), true
}

// An operator process restarted while its election Lease is gone (deleted:
// the controller has recorded the token and released its finalizer, and
// not yet recreated it) waits instead of creating the Lease; once the
// controller recreates it from the lock's token floor, the process leads
// with the next token. A Lease it created would start at token 0, below
// the lock's recorded token, so every fenced write of its leader would be
// refused.
func TestLeaderElectionRestartedProcessWaitsForTheControllerToRecreateTheLease(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	const lease = "restarted-op"
	createReadyLock(t, testutil.MakeLock(lease, ns).LeaseDuration(3).Obj())
	a := startElector(t, ns, lease, "op-a", false)
	termA := a.term(t, 5*time.Second)
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, lease).Status.FencingToken).To(Equal(termA.Token())) })
	a.halt(t) // the process ends

	// The gap between the finalizer's release and the recreation, held open
	// by stopping the manager: the test releases the finalizer as the
	// controller does once the token is recorded.
	withManagerStopped(t)
	g.Expect(k8sClient.Delete(ctx, getLease(g, ns, lease))).To(Succeed())
	deleting := getLease(g, ns, lease)
	g.Expect(deleting.DeletionTimestamp).NotTo(BeNil(), "the token finalizer should hold the Lease")
	deleting.Finalizers = nil
	g.Expect(k8sClient.Update(ctx, deleting)).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		_, err := clientset.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	})

	b := startElector(t, ns, lease, "op-b", true) // the restarted process
	g.Consistently(func(g Gomega) {
		_, err := clientset.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the restarted process created the Lease")
		g.Expect(b.lock.Term()).To(BeNil())
	}).WithTimeout(2 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	err := b.lock.Create(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "op-b", LeaseDurationSeconds: 3})
	g.Expect(errors.Is(err, leaderelection.ErrNoLease)).To(BeTrue(), "Create: %v", err)

	g.Expect(startManager()).To(Succeed())
	defer func() { g.Expect(stopRunningManager()).To(Succeed()) }() // withManagerStopped starts it again
	termB := b.term(t, 10*time.Second)
	g.Expect(termB.Token()).To(BeNumerically(">", termA.Token()))
	g.Expect(int64(ptr.Deref(getLease(g, ns, lease).Spec.LeaseTransitions, -1))).To(Equal(termB.Token()))
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(getLock(g, ns, lease).Status.FencingToken).To(Equal(termB.Token())) })
}
