package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// leaseWrites sits between a lock client and the real apiserver and
// interferes with its Lease writes (PUTs) as a test tells it to: fail the
// next few outright, or hold the answers of the ones that reach the server.
type leaseWrites struct {
	next http.RoundTripper

	mu        sync.Mutex
	puts      int
	failNext  int           // fail this many of the next PUTs before sending them
	holdFor   time.Duration // deliver answers this late (the write has landed)
	failedPut []int         // which PUTs (1-based) were failed
	landed    time.Time     // when the last PUT that the server applied came back from it
}

func (w *leaseWrites) RoundTrip(req *http.Request) (*http.Response, error) {
	if !leaseWriteRequest(req) {
		return w.next.RoundTrip(req)
	}
	w.mu.Lock()
	w.puts++
	fail := w.failNext > 0
	if fail {
		w.failNext--
		w.failedPut = append(w.failedPut, w.puts)
	}
	hold := w.holdFor
	w.mu.Unlock()
	if fail {
		return nil, errors.New("injected: connection reset by peer")
	}
	resp, err := w.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusOK {
		w.set(func(w *leaseWrites) { w.landed = time.Now() })
	}
	if err == nil && hold > 0 {
		select {
		case <-time.After(hold):
		case <-req.Context().Done():
			resp.Body.Close()
			return nil, req.Context().Err()
		}
	}
	return resp, err
}

func (w *leaseWrites) set(f func(w *leaseWrites)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w)
}

func faultyClient(t *testing.T, namespace, name, identity string) (*lock.Client, *leaseWrites) {
	t.Helper()
	faults := &leaseWrites{}
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		faults.next = rt
		return faults
	}
	c, err := lock.New(cfg, lock.Config{Namespace: namespace, Name: name, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	return c, faults
}

// The first two renewal attempts fail. A failed renewal is retried with
// backoff within the safe window: were it tried again only at the next
// tick, failures at two ticks a third of a lease apart would leave no tick
// inside the window, and a healthy lock would be lost.
func TestTwoTransientRenewalErrorsDoNotLoseAHealthyLock(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	c, faults := faultyClient(t, ns, "billing", "steady")
	gr, err := c.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	faults.set(func(w *leaseWrites) { w.failNext = 2 })

	// Three lease durations: ample time to lose the grant if the retries
	// did not happen.
	NewWithT(t).Consistently(gr.Lost()).WithTimeout(9 * time.Second).ShouldNot(BeClosed())
	g.Expect(gr.Err()).NotTo(HaveOccurred())
	faults.set(func(w *leaseWrites) {
		g.Expect(w.failedPut).To(Equal([]int{2, 3}), "the first two renewals (PUT 1 was the grant) were failed")
	})
	l := getLease(g, ns, "billing")
	g.Expect(ptr.Deref(l.Spec.HolderIdentity, "")).To(Equal("steady"))
	g.Expect(gr.Release(ctx)).To(Succeed())
}

// A renewal that lands on the server but whose answer comes back after the
// grant's safe window: the client stops (its grant is lost locally) while
// the server still shows it as holder. It then releases that grant, so the
// next client need not wait out a lease nobody uses.
func TestGrantLostLocallyButHeldOnTheServerIsReleased(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(4).Obj())
	c, faults := faultyClient(t, ns, "billing", "slow-answers")
	gr, err := c.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	faults.set(func(w *leaseWrites) { w.holdFor = time.Minute })

	select {
	case <-gr.Lost():
	case <-time.After(6 * time.Second):
		t.Fatal("the grant was not lost although no renewal answer came back")
	}
	lostAt := time.Now()
	g.Expect(gr.Err()).To(MatchError(lock.ErrLost))
	var renewedOnServer time.Time
	faults.set(func(w *leaseWrites) { w.holdFor, renewedOnServer = 0, w.landed })

	next := newLockClient(t, ns, "billing", "next")
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ng, err := next.Acquire(actx)
	g.Expect(err).NotTo(HaveOccurred())
	grantedAt := time.Now()
	g.Expect(ng.Token()).To(Equal(gr.Token() + 1))
	// Without the release the next client waits a full lease from the last
	// renewal it saw land; with it, it gets the lock as soon as the
	// release lands, well before.
	g.Expect(grantedAt.Before(renewedOnServer.Add(4*time.Second))).To(BeTrue(),
		"the next grant came %s after the last renewal that landed: the lapsed grant was not released",
		grantedAt.Sub(renewedOnServer).Round(time.Millisecond))
	t.Logf("lost locally at +0, next grant at +%s", grantedAt.Sub(lostAt).Round(time.Millisecond))
	g.Expect(ng.Release(ctx)).To(Succeed())
}

// The library reports what it does, as client-go and controller-runtime
// users expect: a renewal failure is logged when it happens (not only when
// the lock is lost), through the logger in the context it was given;
// Prometheus metrics on the caller's registry count acquires, renewals,
// failures, losses and time held; OnLost is called with the reason; the
// grant's Context has the safe window as its deadline.
func TestClientReportsWhatItDoes(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	reg := prometheus.NewRegistry()
	metrics, err := lock.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	var mu sync.Mutex
	var logged []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, prefix+" "+args)
	}, funcr.Options{Verbosity: 1})

	faults := &leaseWrites{}
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		faults.next = rt
		return faults
	}
	c, err := lock.New(cfg, lock.Config{Namespace: ns, Name: "billing", Identity: "reporter", Metrics: metrics})
	g.Expect(err).NotTo(HaveOccurred())
	ctx := logr.NewContext(context.Background(), logger)
	start := time.Now()
	gr, err := c.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	deadline, ok := gr.Context().Deadline()
	g.Expect(ok).To(BeTrue(), "the grant's Context has no deadline")
	g.Expect(deadline).To(BeTemporally(">", start))
	g.Expect(deadline).To(BeTemporally("<=", start.Add(3*time.Second)), "the deadline is past the lease")
	g.Expect(deadline).To(Equal(gr.ValidUntil()))

	lostWith := make(chan error, 1)
	gr.OnLost(func(err error) { lostWith <- err })

	// One renewal fails: logged at once, counted, retried.
	faults.set(func(w *leaseWrites) { w.failNext = 1 })
	eventually(t, 5*time.Second, func(g Gomega) {
		mu.Lock()
		defer mu.Unlock()
		g.Expect(strings.Join(logged, "\n")).To(ContainSubstring("renewal failed; retrying within the safe window"))
	})
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(testutil.ToFloat64(reg, "frontdesk_client_renewals_total")).To(BeNumerically(">=", 1))
	})
	g.Expect(testutil.ToFloat64(reg, "frontdesk_client_renewal_failures_total")).To(BeEquivalentTo(1))
	g.Expect(gr.Lost()).NotTo(BeClosed(), "one failed renewal cost the lock")
	g.Expect(testutil.ToFloat64(reg, "frontdesk_client_holding")).To(BeEquivalentTo(1))

	// The lock is broken: the next renewal finds out; OnLost says why.
	_, err = newLockClient(t, ns, "billing", "admin").Break(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	select {
	case err := <-lostWith:
		g.Expect(err).To(MatchError(lock.ErrLost))
		g.Expect(err.Error()).To(ContainSubstring("is now held by nobody"))
	case <-time.After(5 * time.Second):
		t.Fatal("OnLost was not called")
	}
	g.Expect(testutil.ToFloat64(reg, "frontdesk_client_grants_lost_total")).To(BeEquivalentTo(1))
	g.Expect(testutil.ToFloat64(reg, "frontdesk_client_holding")).To(BeEquivalentTo(0))
	g.Expect(testutil.ToFloat64(reg, "frontdesk_client_held_seconds_count")).To(BeEquivalentTo(1))
	mu.Lock()
	defer mu.Unlock()
	g.Expect(strings.Join(logged, "\n")).To(ContainSubstring("lost the lock"))
	g.Expect(strings.Join(logged, "\n")).To(ContainSubstring("acquired the lock"))
}

// A lock client's renewals and releases are its most urgent requests: they
// never wait behind its own client-side rate limiter. Here the rest.Config
// carries one shared limiter of one request every two seconds, kept busy by
// the same client's reads of its lock; the grant of a 3 s lease is renewed
// on time through three lease durations, and released at once (behind the
// limiter a renewal would wait its turn, and a release under a crowd could
// fail with "client rate limiter Wait returned an error").
func TestRenewalsAndReleasesNeverWaitBehindTheClientsRateLimiter(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	cfg := restConfig()
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(0.5, 1)
	c, err := lock.New(cfg, lock.Config{Namespace: ns, Name: "billing", Identity: "holder"})
	g := NewWithT(t)
	g.Expect(err).NotTo(HaveOccurred())
	gr, err := c.TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithCancel(context.Background())
	var reads sync.WaitGroup
	reads.Go(func() {
		for ctx.Err() == nil {
			_, _ = c.GetLock(ctx) // each takes the limiter's one token
		}
	})
	defer func() { cancel(); reads.Wait() }()
	renewals := map[time.Time]bool{}
	deadline := time.Now().Add(9 * time.Second)
	for time.Now().Before(deadline) {
		g.Expect(gr.Err()).NotTo(HaveOccurred(), "the grant was lost behind the client's own rate limiter")
		renewals[getLease(g, ns, "billing").Spec.RenewTime.Time] = true
		time.Sleep(100 * time.Millisecond) // sampling the Lease, not the check
	}
	g.Expect(len(renewals)).To(BeNumerically(">=", 7), "renewals every second for 9 s")
	start := time.Now()
	g.Expect(gr.Release(context.Background())).To(Succeed())
	g.Expect(time.Since(start)).To(BeNumerically("<", time.Second), "the release waited behind the limiter")
}
