package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// newFlakyWritesClient is a lock client whose Lease writes (PUT, PATCH)
// fail before reaching the apiserver while *failing is set.
func newFlakyWritesClient(t *testing.T, ns, name, identity string, failing *atomic.Bool) *lock.Client {
	t.Helper()
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			write := req.Method == http.MethodPut || req.Method == http.MethodPatch
			if write && strings.Contains(req.URL.Path, "/leases") && failing.Load() {
				return nil, errors.New("the fault: the connection dropped")
			}
			return rt.RoundTrip(req)
		})
	}
	c, err := lock.New(cfg, lock.Config{Namespace: ns, Name: name, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A release that failed leaves the grant on the Lease; the same client's
// next acquire clears it (its own grant, ended) and takes the next token at
// once, instead of refusing it as another client's use of its identity
// until the controller ends it a lease later.
func TestClientClearsItsOwnGrantWhoseReleaseFailed(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	var failing atomic.Bool
	c := newFlakyWritesClient(t, ns, "billing", "worker", &failing)
	first, err := c.TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())

	failing.Store(true)
	g.Expect(first.Release(context.Background())).NotTo(Succeed(), "the fault did not reach the release")
	failing.Store(false)
	g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(Equal("worker"), "the failed release ended the grant")

	second, err := c.TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred(), "the client refused its own leftover grant")
	g.Expect(second.Token()).To(Equal(first.Token() + 1))
	g.Expect(second.Release(context.Background())).To(Succeed())
	g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(BeEmpty())
}

// An Acquire that gave up while its withdrawal from the queue failed leaves
// its place behind. The same client's next Acquire withdraws that place
// rather than refuse it as another client's, queues once, and gets the lock
// when the holder releases it; another client under its own identity is
// not disturbed.
func TestClientWithdrawsItsOwnPlaceLeftBehind(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	var failing atomic.Bool
	c := newFlakyWritesClient(t, ns, "billing", "worker", &failing)

	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := acquireInBackground(ctx, c)
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal([]string{"worker"})) })
	failing.Store(true)
	cancel()
	r := <-gaveUp
	g.Expect(r.err).To(MatchError(lock.ErrHeld))
	failing.Store(false)
	left := lease.Queue(getLease(g, ns, "billing"))
	g.Expect(left).To(HaveLen(1), "the fault did not keep the place behind")

	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	again := acquireInBackground(ctx, c)
	eventually(t, 10*time.Second, func(g Gomega) {
		q := lease.Queue(getLease(g, ns, "billing"))
		g.Expect(q).To(HaveLen(1))
		g.Expect(q[0].Identity).To(Equal("worker"))
		g.Expect(q[0].Ticket).NotTo(Equal(left[0].Ticket), "the place left behind is still queued")
	})
	g.Expect(holder.Release(context.Background())).To(Succeed())
	r = <-again
	g.Expect(r.err).NotTo(HaveOccurred(), "the client refused its own leftover place")
	g.Expect(r.grant.Token()).To(Equal(holder.Token() + 1))
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}
