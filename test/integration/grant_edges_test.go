package integration

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// firstLeasePutNeverSent holds the first Lease PUT until its request is
// cancelled and then fails it without sending it: a grant that never
// landed, whose sender cannot know that.
type firstLeasePutNeverSent struct {
	next    http.RoundTripper
	mu      sync.Mutex
	seen    bool
	blocked chan struct{} // closed when the first PUT is being held
}

func (f *firstLeasePutNeverSent) RoundTrip(req *http.Request) (*http.Response, error) {
	if leaseWriteRequest(req) {
		f.mu.Lock()
		first := !f.seen
		f.seen = true
		f.mu.Unlock()
		if first {
			close(f.blocked)
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
	}
	return f.next.RoundTrip(req)
}

// A client whose grant got no answer before it gave up releases that grant
// if it landed (TryAcquire included), so the lock is not blocked for a
// lease nobody uses.
func TestGrantWithNoAnswerIsReleasedWhenItLanded(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	slow := &leaseWrites{holdFor: 3 * time.Second}
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { slow.next = rt; return slow }
	c, err := lock.New(cfg, lock.Config{Namespace: ns, Name: "billing", Identity: "impatient"})
	g := NewWithT(t)
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = c.TryAcquire(ctx)
	g.Expect(err).To(MatchError(lock.ErrHeld), "the grant's answer came after the caller gave up")
	g.Expect(slow.landed).NotTo(BeZero(), "the grant did not land: the test proves nothing")
	eventually(t, 10*time.Second, func(g Gomega) {
		l := getLease(g, ns, "billing")
		g.Expect(lease.Holder(l)).To(BeEmpty(), "a landed grant nobody took up is still held")
		g.Expect(lease.Token(l)).To(BeEquivalentTo(1))
	})
}

// Two processes share an identity. One's grant never lands, and it cannot
// know that; the other takes the lock with the very token the first one
// sent. When the first gives up, it must not release the second one's
// grant: holder and token match, the attempt's nonce does not.
func TestUncertainGrantNeverReleasesAnotherProcessWithTheSameIdentity(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	stuck := &firstLeasePutNeverSent{blocked: make(chan struct{})}
	cfg := restConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { stuck.next = rt; return stuck }
	first, err := lock.New(cfg, lock.Config{Namespace: ns, Name: "billing", Identity: "shared"})
	g := NewWithT(t)
	g.Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := first.TryAcquire(ctx); done <- err }()
	<-stuck.blocked // the first one's grant (token 1) is on its way, and will never land

	second, err := newLockClient(t, ns, "billing", "shared").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(second.Token()).To(BeEquivalentTo(1), "the same next token as the first one's grant")
	cancel()
	g.Expect(<-done).To(MatchError(lock.ErrHeld))

	// The first one's leaving is done when TryAcquire returns; the second
	// one's grant must stand, on the server and for itself.
	l := getLease(g, ns, "billing")
	g.Expect(lease.Holder(l)).To(Equal("shared"))
	g.Expect(lease.Token(l)).To(BeEquivalentTo(1))
	g.Consistently(second.Context().Done()).WithTimeout(time.Second).ShouldNot(BeClosed())
	g.Expect(second.Release(context.Background())).To(Succeed())
}

// A release hands the lock on with the lock's lease duration as the manager
// last wrote it on the Lease; the waiter taking it up judges its window by
// that duration, as every other observer does, not by the longer one it
// read from the lock before leaseDurationSeconds was lowered.
func TestHandedOffGrantIsJudgedByTheDurationWritten(t *testing.T) {
	ns := newNamespace(t)
	lk := createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(60).Obj())
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	g := NewWithT(t)
	g.Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A short renew interval: the waiter takes the hand-off up without
	// renewing first.
	done := acquireInBackground(ctx, newLockClient(t, ns, "billing", "waiter", func(c *lock.Config) { c.RenewInterval = time.Second }))
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal([]string{"waiter"})) })
	patch := client.MergeFrom(lk.DeepCopy())
	lk.Spec.LeaseDurationSeconds = 4
	g.Expect(k8sClient.Patch(context.Background(), lk, patch)).To(Succeed())
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.LeaseDurationAnnotation]).To(Equal("4"))
	})
	g.Expect(holder.Release(context.Background())).To(Succeed())
	released := time.Now()
	handed := getLease(g, ns, "billing")
	g.Expect(lease.Holder(handed)).To(Equal("waiter"))
	g.Expect(lease.RecordOf(handed).DurationSeconds).To(BeEquivalentTo(4), "the hand-off carries the lock's duration")

	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.grant.Token()).To(Equal(lease.Token(handed)))
	g.Expect(r.validUntil).To(BeTemporally("<=", released.Add(4*time.Second)),
		"the waiter trusts a window longer than the one the others judge the hand-off by")
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}

// A holder follows its Lease while it holds it: a break (or a takeover)
// ends its grant as soon as the watch brings it, not at the next renewal a
// third of the lease later.
func TestHolderLearnsOfABreakBeforeItsNextRenewal(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(60).Obj())
	g := NewWithT(t)
	gr, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	time.Sleep(200 * time.Millisecond) // let the grant's watch open; not a check
	_, err = newLockClient(t, ns, "billing", "admin").Break(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(gr.Lost()).WithTimeout(10*time.Second).Should(BeClosed(),
		"the next renewal is 20 s away: the watch should have ended the grant")
	g.Expect(gr.Err()).To(MatchError(lock.ErrLost))
}

// A waiter that has waited at the head of the queue for longer than a lease
// duration cannot vouch for a hand-off's window with its registration, so
// it reads the Lease while it waits: a hand-off newer than that read was
// written after it was sent. It then takes the hand-off up without writing
// first (the next write to the Lease is its scheduled renewal, after Acquire
// returned), and its window still ends no later than the safe window counted
// from the release.
func TestLongWaitingHeadTakesAHandOffUpWithoutRenewingFirst(t *testing.T) {
	ns := newNamespace(t)
	const duration = 6 * time.Second
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(6).Obj())
	g := NewWithT(t)
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitStart := time.Now()
	waiter := newLockClient(t, ns, "billing", "waiter")
	done := acquireInBackground(ctx, waiter)
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal([]string{"waiter"})) })
	time.Sleep(duration + time.Second) // the holder renews meanwhile; not a check
	g.Expect(holder.Err()).NotTo(HaveOccurred(), "the holder lost the lock while renewing")

	before := getLease(g, ns, "billing")
	w, err := clientset.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=billing", ResourceVersion: before.ResourceVersion})
	g.Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	g.Expect(holder.Release(context.Background())).To(Succeed())
	released := time.Now()

	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	// The hand-off was committed before Release returned; others judge it
	// from when they saw it, by the lease duration.
	g.Expect(r.validUntil).To(BeTemporally("<=", released.Add(waiter.TimingFor(duration).SafeWindow())),
		"the window outlasts the safe window counted from the release")
	g.Expect(r.validUntil).To(BeTemporally(">", waitStart.Add(duration)), "the window counts from before the wait")

	// The writes from the hand-off on (a renewal by the holder may come
	// before it).
	var writes []*coordinationv1.Lease
	for len(writes) < 2 {
		select {
		case ev := <-w.ResultChan():
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && ev.Type == watch.Modified && (len(writes) > 0 || lease.Holder(l) == "waiter") {
				writes = append(writes, l)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("saw %d writes to the Lease after the release, want the hand-off and a renewal", len(writes))
		}
	}
	g.Expect(lease.Token(writes[0])).To(Equal(r.grant.Token()), "the release hands the lock on")
	g.Expect(lease.Token(writes[1])).To(Equal(r.grant.Token()))
	g.Expect(writes[1].Spec.RenewTime.Time).To(BeTemporally(">", r.at),
		"the waiter renewed before it took the hand-off up, so it could not vouch for the window")
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}
