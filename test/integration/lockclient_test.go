package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

func newLockClient(t *testing.T, namespace, name, identity string, mutate ...func(*lock.Config)) *lock.Client {
	t.Helper()
	cfg := lock.Config{Namespace: namespace, Name: name, Identity: identity}
	for _, m := range mutate {
		m(&cfg)
	}
	c, err := lock.New(restConfig(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientAcquireReleaseAndHeldError(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	ctx := context.Background()
	g := NewWithT(t)
	a := newLockClient(t, ns, "billing", "a")
	b := newLockClient(t, ns, "billing", "b")

	ga, err := a.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ga.Token()).To(BeEquivalentTo(1))
	g.Expect(ga.Holder()).To(Equal("a"))

	_, err = b.TryAcquire(ctx)
	g.Expect(err).To(MatchError(lock.ErrHeld))
	var held *lock.HeldError
	g.Expect(errors.As(err, &held)).To(BeTrue())
	g.Expect(held.Holder).To(Equal("a"))
	g.Expect(held.Token).To(BeEquivalentTo(1))
	g.Expect(err.Error()).To(MatchRegexp(`lock dlock-test-\w+/billing is held by a \(fencing token 1\) until ~\S+ unless it renews`))

	// A release by someone who does not hold it changes nothing.
	before := getLease(g, ns, "billing")
	err = b.Release(ctx)
	g.Expect(err).To(MatchError(lock.ErrNotHolder))
	g.Expect(err.Error()).To(ContainSubstring("held by a, not b; nothing released"))
	after := getLease(g, ns, "billing")
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "a non-holder's release wrote to the Lease")

	g.Expect(ga.Release(ctx)).To(Succeed())
	g.Expect(context.Cause(ga.Context())).To(MatchError(lock.ErrReleased))
	g.Expect(ga.Err()).To(Succeed())

	gb, err := b.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gb.Token()).To(BeEquivalentTo(2))
	// The old grant's second release must not stomp on b, and says what
	// happened: it was released already, not lost.
	err = ga.Release(ctx)
	g.Expect(err).To(MatchError(lock.ErrNotHolder))
	g.Expect(err.Error()).To(ContainSubstring("released already"))
	g.Expect(err).NotTo(MatchError(lock.ErrLost))
	g.Expect(ptr.Deref(getLease(g, ns, "billing").Spec.HolderIdentity, "")).To(Equal("b"))
	g.Expect(gb.Release(ctx)).To(Succeed())
}

func TestClientErrorsOnMissingLock(t *testing.T) {
	ns := newNamespace(t)
	c := newLockClient(t, ns, "nope", "a")
	_, err := c.TryAcquire(context.Background())
	g := NewWithT(t)
	g.Expect(err).To(MatchError(lock.ErrLockNotFound))
	g.Expect(err.Error()).To(ContainSubstring("/nope (create it with kubectl apply)"))
}

func TestAcquireTimeoutIsATryLock(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	ga, err := newLockClient(t, ns, "billing", "a").Acquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = ga.Release(context.Background()) }()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = newLockClient(t, ns, "billing", "b").Acquire(ctx)
	g.Expect(err).To(MatchError(lock.ErrHeld))
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
	g.Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))
}

// An Acquire whose deadline ends a read of the Lease, after it has waited,
// reports the same as one whose deadline ends its wait: the lock is held
// and the caller gave up (ErrHeld and context.DeadlineExceeded), not a
// failed read, and leaves the queue. The fault: the waiter's watches are
// refused, so it reads the Lease afresh after a backoff, and that second
// read hangs until its ctx ends.
func TestAcquireCutShortMidReadGivesUpWaiting(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	ga, err := newLockClient(t, ns, "billing", "a").Acquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = ga.Release(context.Background()) }()

	var reads, hung atomic.Int32
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/leases") {
				return rt.RoundTrip(req)
			}
			if req.URL.Query().Get("watch") == "true" {
				return nil, errors.New("the fault: no watch")
			}
			if reads.Add(1) == 2 {
				hung.Add(1)
				<-req.Context().Done()
				return nil, req.Context().Err()
			}
			return rt.RoundTrip(req)
		})
	}
	b, err := lock.New(cfg, lock.Config{Namespace: ns, Name: "billing", Identity: "b"})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	_, err = b.Acquire(ctx)
	g.Expect(hung.Load()).To(BeNumerically("==", 1), "the deadline did not fall on a read")
	g.Expect(err).To(MatchError(lock.ErrHeld))
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
	g.Expect(err.Error()).To(ContainSubstring("gave up waiting"))
	g.Expect(err.Error()).To(ContainSubstring("it cut short"), "the deadline fell outside the read")
	l, err := clientset.CoordinationV1().Leases(ns).Get(context.Background(), "billing", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Queue(l)).To(BeEmpty(), "the waiter that gave up is still queued")
}

// Three clients contend for one lock. Each believes it holds the lock only
// between Acquire and Release; those intervals never overlap, grants get
// strictly increasing tokens, and the Lease's own history (watched) shows
// every grant as a new token.
func TestClientsContendExactlyOneHolder(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(5).Obj())
	history, err := harness.WatchLeaseHistory(context.Background(), clientset, ns, "billing")
	if err != nil {
		t.Fatal(err)
	}
	defer history.Stop()

	var holders atomic.Int32
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	const clients, rounds = 3, 8
	for i := range clients {
		c := newLockClient(t, ns, "billing", fmt.Sprintf("client-%d", i))
		wg.Go(func() {
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				g, err := c.Acquire(ctx)
				cancel()
				if err != nil {
					t.Errorf("%s: %v", c.Identity(), err)
					return
				}
				if n := holders.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				mu.Lock()
				tokens = append(tokens, g.Token())
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond) // work inside the critical section
				holders.Add(-1)
				if err := g.Release(context.Background()); err != nil {
					t.Errorf("%s release: %v", c.Identity(), err)
				}
			}
		})
	}
	wg.Wait()

	g := NewWithT(t)
	g.Expect(tokens).To(HaveLen(clients * rounds))
	for i := 1; i < len(tokens); i++ {
		g.Expect(tokens[i]).To(BeNumerically(">", tokens[i-1]), "grant %d", i)
	}
	eventually(t, 5*time.Second, func(g Gomega) {
		grants := history.Grants()
		g.Expect(grants).To(HaveLen(clients * rounds))
		for i := 1; i < len(grants); i++ {
			g.Expect(grants[i].Token).To(Equal(grants[i-1].Token+1), "the Lease history skipped or repeated a token")
		}
	})
}

// A holder that stops renewing loses its grant (Context cancelled) before
// another client can take the lock over; the new grant has a higher token.
func TestSilentHolderLosesBeforeTakeover(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	frozen := newLockClient(t, ns, "billing", "frozen", func(c *lock.Config) { c.RenewInterval = time.Hour })
	ga, err := frozen.Acquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())

	lostSeen := make(chan time.Time, 1)
	go func() { <-ga.Lost(); lostSeen <- time.Now() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gb, err := newLockClient(t, ns, "billing", "successor").Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	acquiredAt := time.Now()
	defer func() { _ = gb.Release(context.Background()) }()

	g.Expect(gb.Token()).To(BeNumerically(">", ga.Token()))
	g.Expect(ga.Lost()).To(BeClosed())
	g.Expect(ga.Context().Err()).To(HaveOccurred())
	g.Expect(context.Cause(ga.Context())).To(MatchError(lock.ErrLost))
	var lostAt time.Time
	g.Eventually(lostSeen).Should(Receive(&lostAt), "the old holder's Lost channel closed but nothing heard it")
	g.Expect(lostAt.Before(acquiredAt)).To(BeTrue(), "the old holder learned of its loss at %v, after the takeover at %v", lostAt, acquiredAt)
	t.Logf("old holder gave up %s before the takeover", acquiredAt.Sub(lostAt).Round(time.Millisecond))
	g.Expect(ga.Release(context.Background())).To(MatchError(lock.ErrNotHolder))
}

// A grant whose answer comes back after its safe window (the network held
// it back; the process paused right after sending) is not handed out: by
// then the lease may have lapsed for others. The grant, made on the server,
// is released when the caller gives up (nobody may use it), and the next
// holder gets a higher token.
func TestGrantAnsweredTooLateIsNotHeld(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	// The fault: every answer to a Lease update is held back past the 2 s lease.
	slow := newSlowLockClient(t, ns, "billing", "slow", 2100*time.Millisecond)

	gs, err := slow.TryAcquire(context.Background())
	g.Expect(gs).To(BeNil())
	g.Expect(err).To(MatchError(lock.ErrAnsweredTooLate))
	g.Expect(err).To(MatchError(lock.ErrHeld))
	lease, err := clientset.CoordinationV1().Leases(ns).Get(context.Background(), "billing", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(1), "the server did grant it")
	g.Expect(ptr.Deref(lease.Spec.HolderIdentity, "")).To(BeEmpty(), "a grant nobody may use is released when TryAcquire gives up")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gb, err := newLockClient(t, ns, "billing", "next").Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = gb.Release(context.Background()) }()
	g.Expect(gb.Token()).To(BeNumerically(">", ptr.Deref(lease.Spec.LeaseTransitions, 0)))
}

// A client whose every grant comes back just past its safe window (but
// within the lease) keeps waiting in Acquire without taking the lock back
// from under the others: it judges its own unusable grant's expiry from
// when the answer arrived, as they do from when they saw the write.
func TestAnsweredTooLateClientDoesNotStarveOthers(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	// Safe window of a 2 s lease: 2 s - (2%·2 s + 100 ms) = 1.86 s.
	slow := newSlowLockClient(t, ns, "billing", "slow", 1920*time.Millisecond)
	slowDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
		defer cancel()
		gs, err := slow.Acquire(ctx)
		if gs != nil {
			_ = gs.Release(context.Background())
			err = fmt.Errorf("the slow client was handed grant %d, which came back too late", gs.Token())
		}
		slowDone <- err
	}()
	g.Eventually(func() string {
		l, err := clientset.CoordinationV1().Leases(ns).Get(context.Background(), "billing", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return ptr.Deref(l.Spec.HolderIdentity, "")
	}, 10*time.Second, 20*time.Millisecond).Should(Equal("slow"))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gb, err := newLockClient(t, ns, "billing", "next").Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred(), "the slow client kept the lock from the others")
	g.Expect(gb.Release(context.Background())).To(Succeed())
	// Every grant the slow client got came back too late: it waited, on its
	// own unusable grants among others, until its deadline.
	err = <-slowDone
	g.Expect(err).To(MatchError(lock.ErrHeld))
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
}

// Release does not wait behind a renewal stuck on the network: the grant's
// Context ends at once, the stuck renewal is cancelled, and Release returns
// when its own ctx ends, long before the renewal's deadline (the lease is
// 10 s).
func TestReleaseDoesNotWaitForAStuckRenewal(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(10).Obj())
	g := NewWithT(t)
	var stuck atomic.Bool
	renewalStuck := make(chan struct{}, 1)
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if leaseWriteRequest(req) && stuck.Load() {
				select {
				case renewalStuck <- struct{}{}:
				default:
				}
				<-req.Context().Done() // the fault: the network never answers
				return nil, req.Context().Err()
			}
			return rt.RoundTrip(req)
		})
	}
	c, err := lock.New(cfg, lock.Config{Namespace: ns, Name: "billing", Identity: "holder", RenewInterval: 100 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	grant, err := c.Acquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	stuck.Store(true)
	g.Eventually(renewalStuck, 5*time.Second).Should(Receive())

	released := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		released <- grant.Release(ctx)
	}()
	g.Eventually(grant.Context().Done(), 2*time.Second).Should(BeClosed())
	g.Expect(context.Cause(grant.Context())).To(MatchError(lock.ErrReleased))
	var releaseErr error
	g.Eventually(released, 4*time.Second).Should(Receive(&releaseErr))
	g.Expect(releaseErr).To(MatchError(context.DeadlineExceeded), "the release itself is stuck on the network too")
}

// newSlowLockClient is a lock client whose Lease updates are answered
// `delay` after the apiserver answered them.
func newSlowLockClient(t *testing.T, namespace, name, identity string, delay time.Duration) *lock.Client {
	t.Helper()
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if leaseWriteRequest(req) {
				time.Sleep(delay) // the fault: the answer is held back
			}
			return resp, err
		})
	}
	c, err := lock.New(cfg, lock.Config{Namespace: namespace, Name: name, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// roundTripperFunc is an http.RoundTripper made of a function.
type roundTripperFunc func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// Deleting the Lease under a live holder: the holder's next renewal sees the
// Lease terminating and gives up; the controller keeps the Lease (finalizer)
// until it has seen that grant lapse, and only then recreates it for others.
func TestDeletedLeaseEndsLiveGrantBeforeAnyoneElseGetsIt(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	ga, err := newLockClient(t, ns, "billing", "victim").Acquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	var lostAt time.Time
	lostSeen := make(chan struct{})
	go func() { <-ga.Lost(); lostAt = time.Now(); close(lostSeen) }()

	g.Expect(clientset.CoordinationV1().Leases(ns).Delete(context.Background(), "billing", metav1.DeleteOptions{})).To(Succeed())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gb, err := newLockClient(t, ns, "billing", "next").Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	acquiredAt := time.Now()
	defer func() { _ = gb.Release(context.Background()) }()

	g.Eventually(lostSeen).Should(BeClosed())
	g.Expect(ga.Err()).To(MatchError(ContainSubstring("being deleted")))
	g.Expect(lostAt.Before(acquiredAt)).To(BeTrue(), "victim lost at %v, successor acquired at %v", lostAt, acquiredAt)
	g.Expect(gb.Token()).To(BeNumerically(">", ga.Token()))
	t.Logf("victim gave up %s before the successor's grant", acquiredAt.Sub(lostAt).Round(time.Millisecond))
}

// The client refuses a Lease the lock does not control: tokens there are not
// protected from going backwards.
func TestClientRefusesLeaseNotManagedByTheLock(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("first", ns).LeaseName("shared").Obj())
	g := NewWithT(t)
	g.Expect(k8sClient.Create(context.Background(), testutil.MakeLock("second", ns).LeaseName("shared").Obj())).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "second").Status.LeaseName).To(Equal("shared"))
	})
	_, err := newLockClient(t, ns, "second", "x").TryAcquire(context.Background())
	g.Expect(err).To(MatchError(lock.ErrLeaseUnavailable))
	g.Expect(err.Error()).To(ContainSubstring("is not (yet) managed by DistributedLock " + ns + "/second"))
	gf, err := newLockClient(t, ns, "first", "x").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gf.Release(context.Background())).To(Succeed())
}

// Two processes sharing one identity still exclude each other.
func TestSameIdentityDoesNotShareTheLock(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	first, err := newLockClient(t, ns, "billing", "shared-id").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = first.Release(context.Background()) }()
	_, err = newLockClient(t, ns, "billing", "shared-id").TryAcquire(context.Background())
	g.Expect(err).To(MatchError(lock.ErrIdentityInUse))
	g.Expect(err).NotTo(MatchError(lock.ErrHeld), "Acquire does not wait it out: the identity is the mistake")
	g.Expect(err.Error()).To(ContainSubstring(`holds it (fencing token 1) under identity "shared-id"`))
}

func TestBreakFencesTheHolder(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	ga, err := newLockClient(t, ns, "billing", "victim").Acquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())

	res, err := newLockClient(t, ns, "billing", "admin").Break(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.PreviousHolder).To(Equal("victim"))
	g.Expect(res.Token).To(Equal(ga.Token() + 1))

	g.Eventually(ga.Lost()).WithTimeout(3 * time.Second).Should(BeClosed())
	g.Expect(ga.Err()).To(MatchError(ContainSubstring("is now held by nobody")))
	gc, err := newLockClient(t, ns, "billing", "next").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gc.Token()).To(Equal(res.Token + 1))

	guard := fencing.NewMemoryGuard()
	noop := func(context.Context) error { return nil }
	g.Expect(ga.FencingKey()).To(Equal(gc.FencingKey()), "two grants of one lock")
	g.Expect(guard.Fence(context.Background(), gc.FencingKey(), gc.Token(), noop)).To(Succeed())
	g.Expect(guard.Fence(context.Background(), ga.FencingKey(), ga.Token(), noop)).To(MatchError(fencing.ErrStaleToken))
	g.Expect(gc.Release(context.Background())).To(Succeed())
}

// A real holder process frozen with SIGSTOP past its lease: another client
// takes over with a higher token and writes; the frozen process, resumed,
// has its writes rejected by the Guard and sees Lost().
func TestFrozenProcessIsFencedAfterResume(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)

	guard := fencing.NewMemoryGuard()
	var mu sync.Mutex
	var accepted []int64
	srv := httptest.NewServer(fencing.Middleware(guard, fencing.FixedLock(fencing.LockKey(ns, "billing")), http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			var tok int64
			_, _ = fmt.Sscan(r.Header.Get(fencing.TokenHeader), &tok)
			accepted = append(accepted, tok)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
		})))
	defer srv.Close()

	frozen := startWorker(t, ns, "billing", "frozen-worker", srv.URL)
	eventually(t, 20*time.Second, func(g Gomega) {
		g.Expect(len(frozen.LinesWith("write ok"))).To(BeNumerically(">=", 3), strings.Join(frozen.Output(), "\n"))
	})
	frozen.Signal(syscall.SIGSTOP)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	successor, err := newLockClient(t, ns, "billing", "successor").Acquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = successor.Release(context.Background()) }()
	g.Expect(guard.Fence(ctx, successor.FencingKey(), successor.Token(), func(context.Context) error { return nil })).To(Succeed())

	frozen.Signal(syscall.SIGCONT)
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(frozen.LinesWith("write rejected 409")).NotTo(BeEmpty(), strings.Join(frozen.Output(), "\n"))
		g.Expect(frozen.LinesWith("lost:")).NotTo(BeEmpty(), strings.Join(frozen.Output(), "\n"))
	})
	rejected := frozen.LinesWith("write rejected")[0]
	g.Expect(rejected).To(ContainSubstring(fmt.Sprintf(`"currentToken":%d`, successor.Token())))
	g.Expect(frozen.LinesWith("lost:")[0]).To(ContainSubstring("lock lease lost"))

	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(accepted); i++ {
		g.Expect(accepted[i]).To(BeNumerically(">=", accepted[i-1]), "the resource accepted token %d after %d", accepted[i], accepted[i-1])
	}
	t.Logf("frozen worker: %s", strings.Join(frozen.LinesWith("acquired"), ","))
}
