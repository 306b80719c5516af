package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// queueOf is the identities queued on the lock's Lease, head first.
func queueOf(g Gomega, ns, name string) []string {
	queue := lease.Queue(getLease(g, ns, name))
	ids := make([]string, 0, len(queue))
	for _, w := range queue {
		ids = append(ids, w.Identity)
	}
	return ids
}

// acquireInBackground starts c.Acquire and returns the channel its result
// arrives on.
func acquireInBackground(ctx context.Context, c *lock.Client) <-chan acquireResult {
	done := make(chan acquireResult, 1)
	go func() {
		g, err := c.Acquire(ctx)
		r := acquireResult{grant: g, err: err, at: time.Now()}
		if g != nil {
			r.validUntil = g.ValidUntil()
		}
		done <- r
	}()
	return done
}

type acquireResult struct {
	grant *lock.Grant
	err   error
	at    time.Time
	// validUntil is the grant's safe window as it was handed out.
	validUntil time.Time
}

// editLease writes edit's version of the Lease (a read, then a
// compare-and-swap, retried on conflicts for up to 5 s) and returns what
// was written. An edit that returns a StopTrying error fails at once.
func editLease(g Gomega, ns, name string, edit func(*coordinationv1.Lease) (*coordinationv1.Lease, error)) *coordinationv1.Lease {
	var written *coordinationv1.Lease
	g.Eventually(func() error {
		l, err := clientset.CoordinationV1().Leases(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edited, err := edit(l)
		if err != nil {
			return err
		}
		written, err = clientset.CoordinationV1().Leases(ns).Update(context.Background(), edited, metav1.UpdateOptions{})
		return err
	}).WithTimeout(5 * time.Second).Should(Succeed())
	return written
}

// queueGhost puts a waiter in the Lease's queue that will never take its
// turn, as a waiter SIGKILLed right after it registered leaves behind: the
// registration a client sends.
func queueGhost(t *testing.T, ns, name, identity string) {
	t.Helper()
	g := NewWithT(t)
	l := getLease(g, ns, name)
	patch, _, err := lease.Registration(l, lease.Waiter{Identity: identity, Ticket: "ghost-" + identity, Principal: "user=ghost"})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = clientset.CoordinationV1().Leases(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())
}

// grantSilently writes a grant to holder that nobody will renew, as a
// holder that goes silent right after its grant leaves behind.
func grantSilently(g Gomega, ns, name, holder string, duration time.Duration) *coordinationv1.Lease {
	return editLease(g, ns, name, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		return lease.Grant(l, holder, "user=test", duration, time.Now())
	})
}

// Waiters get the lock in the order they queued, each from a release that
// hands it on in the same write (the Lease names the releaser; status says
// HandedOff), with consecutive tokens; a waiter with a higher priority
// goes before them all.
func TestWaitersAreGrantedInQueueOrder(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(10).Obj())
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var mu sync.Mutex
	var order []string
	var tokens []int64
	var wg sync.WaitGroup
	waitInLine := func(identity string, priority int32, want []string) {
		c := newLockClient(t, ns, "billing", identity, func(cfg *lock.Config) { cfg.Priority = priority })
		done := acquireInBackground(ctx, c)
		eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal(want)) })
		wg.Go(func() {
			r := <-done
			if r.err != nil {
				t.Errorf("%s: %v", identity, r.err)
				return
			}
			mu.Lock()
			order = append(order, identity)
			tokens = append(tokens, r.grant.Token())
			mu.Unlock()
			if err := r.grant.Release(context.Background()); err != nil {
				t.Errorf("%s release: %v", identity, err)
			}
		})
	}
	waitInLine("first", 0, []string{"first"})
	waitInLine("second", 0, []string{"first", "second"})
	waitInLine("third", 0, []string{"first", "second", "third"})
	waitInLine("urgent", 10, []string{"urgent", "first", "second", "third"})

	history, err := harness.WatchLeaseHistory(context.Background(), clientset, ns, "billing")
	if err != nil {
		t.Fatal(err)
	}
	defer history.Stop()
	if err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	g := NewWithT(t)
	g.Expect(order).To(Equal([]string{"urgent", "first", "second", "third"}))
	for i, tok := range tokens {
		g.Expect(tok).To(Equal(holder.Token()+int64(i)+1), "grant %d (%s)", i, order[i])
	}
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(history.Grants()).To(HaveLen(4))
		g.Expect(countOf(eventReasons(g, ns, "billing"), "HandedOff")).To(BeNumerically(">=", 1))
	})
	l := getLease(g, ns, "billing")
	g.Expect(lease.Holder(l)).To(BeEmpty(), "the last waiter released with nobody queued")
	g.Expect(lease.Queue(l)).To(BeEmpty())
}

// A waiter that gives up (its context ends) leaves the queue, so nobody is
// handed a lock that no one will take up.
func TestWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(10).Obj())
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := acquireInBackground(ctx, newLockClient(t, ns, "billing", "impatient"))
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal([]string{"impatient"})) })
	cancel()
	r := <-done
	g := NewWithT(t)
	g.Expect(r.err).To(MatchError(lock.ErrHeld))
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(BeEmpty()) })

	g.Expect(holder.Release(context.Background())).To(Succeed())
	l := getLease(g, ns, "billing")
	g.Expect(lease.Holder(l)).To(BeEmpty(), "the release handed the lock to a waiter that had left")
}

// A waiter that died after it registered (its entry left behind) is handed
// the lock by the release; nobody takes that grant up, and the next waiter
// gets the lock only once the handed-off grant has lapsed as it observed it:
// a dead head costs one lease, never an overlap. The dead entry is gone
// with the next grant.
func TestDeadHeadOfQueueCostsOneLease(t *testing.T) {
	ns := newNamespace(t)
	const leaseSeconds = 2
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(leaseSeconds).Obj())
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	queueGhost(t, ns, "billing", "ghost")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := acquireInBackground(ctx, newLockClient(t, ns, "billing", "alive"))
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal([]string{"ghost", "alive"})) })

	g := NewWithT(t)
	g.Expect(holder.Release(context.Background())).To(Succeed())
	handedAt := time.Now()
	l := getLease(g, ns, "billing")
	g.Expect(lease.Holder(l)).To(Equal("ghost"), "the release hands the lock to the head")
	ghostToken := lease.Token(l)

	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.grant.Token()).To(Equal(ghostToken + 1))
	g.Expect(r.at.Sub(handedAt)).To(BeNumerically(">=", leaseSeconds*time.Second),
		"the next waiter took the lock before the dead head's grant could lapse")
	g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(BeEmpty())
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}

// A lock that fell free with waiters queued (its holder lapsed) goes to
// the queue first: TryAcquire, which does not queue, gets ErrHeld saying
// how many come first; once the dead head's turn has passed as this client
// observed it, TryAcquire gets the lock and the skipped entry is dropped.
func TestTryAcquireDoesNotJumpTheQueue(t *testing.T) {
	ns := newNamespace(t)
	const leaseSeconds = 2
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(leaseSeconds).Obj())
	g := NewWithT(t)
	grantSilently(g, ns, "billing", "silent", leaseSeconds*time.Second)
	queueGhost(t, ns, "billing", "ghost")

	c := newLockClient(t, ns, "billing", "outsider")
	_, err := c.TryAcquire(context.Background())
	var held *lock.HeldError
	g.Expect(errors.As(err, &held)).To(BeTrue(), "TryAcquire on a live grant: %v", err)
	g.Expect(held.Holder).To(Equal("silent"))

	// Once the silent holder has lapsed, the ghost's turn comes first.
	var sawQueueAhead bool
	var gr *lock.Grant
	g.Eventually(func() error {
		var err error
		gr, err = c.TryAcquire(context.Background())
		if errors.As(err, &held) && held.Holder == "" {
			g.Expect(held.Ahead).To(Equal(1), "waiters ahead of a caller outside the queue")
			sawQueueAhead = true
		}
		return err
	}).WithTimeout(15 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	g.Expect(sawQueueAhead).To(BeTrue(), "TryAcquire took a free lock without letting the queued head have its turn")
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(BeEmpty(), "the controller drops the entry passed over")
	})
	g.Expect(gr.Release(context.Background())).To(Succeed())
}

// crowd is n waiters on one lock ("waiter-0" to "waiter-<n-1>") that call
// Acquire together when started, each taking the lock once and releasing
// it at once. A waiter's error is a test error, but for one that came
// because the crowd's ctx ended.
type crowd struct {
	ctx     context.Context
	clients []*lock.Client
	wg      sync.WaitGroup
}

// newCrowd makes the crowd's clients; run starts them.
func newCrowd(ctx context.Context, t *testing.T, ns, name string, n int) *crowd {
	c := &crowd{ctx: ctx, clients: make([]*lock.Client, n)}
	for i := range c.clients {
		c.clients[i] = newLockClient(t, ns, name, "waiter-"+itoa(int64(i)))
	}
	return c
}

// run starts the waiters at once, each passing its grant to onGrant before
// releasing it.
func (c *crowd) run(t *testing.T, onGrant func(*lock.Grant)) {
	start := make(chan struct{})
	for _, lc := range c.clients {
		c.wg.Go(func() {
			<-start
			gr, err := lc.Acquire(c.ctx)
			if err != nil {
				if c.ctx.Err() == nil {
					t.Errorf("a waiter gave up: %v", err)
				}
				return
			}
			onGrant(gr)
			if err := gr.Release(context.Background()); err != nil {
				t.Errorf("a waiter's release was lost in the crowd: %v", err)
			}
		})
	}
	close(start)
}

// wait waits for every waiter to be done (they report with t.Errorf, so
// they must be done before the test is).
func (c *crowd) wait() { c.wg.Wait() }

// A crowd of waiters arriving at once registers one compare-and-swap at a
// time, each winning a race the others lose. A holder releasing in the
// middle of that crowd loses races too, and must still land; every waiter
// then gets the lock once, each with a token of its own, and its release
// lands, while the rest of the crowd may still be registering (only the
// crowd's outcome is checked). A crowd of 60 does not reliably make a
// release lose many races in a row, so the bound on its retries is argued
// in maxWriteAttempts' comment rather than shown here.
func TestReleaseLandsThroughACrowdRegistering(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())

	const size = 60
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	waiters := newCrowd(ctx, t, ns, "billing", size)
	defer func() { cancel(); waiters.wait() }()
	grants := make(chan *lock.Grant, size)
	waiters.run(t, func(gr *lock.Grant) { grants <- gr })
	// Release while the crowd is still registering.
	var queued int
	eventually(t, 10*time.Second, func(g Gomega) {
		queued = len(queueOf(g, ns, "billing"))
		g.Expect(queued).To(BeNumerically(">", 0))
	})
	g.Expect(holder.Release(context.Background())).To(Succeed(), "the holder's release was lost in the crowd")
	t.Logf("released with %d of %d waiters queued", queued, size)
	waiters.wait()
	close(grants)
	seen := map[int64]bool{}
	for gr := range grants {
		g.Expect(seen).NotTo(HaveKey(gr.Token()), "token %d granted twice", gr.Token())
		seen[gr.Token()] = true
	}
	g.Expect(seen).To(HaveLen(size), "every waiter held the lock once")
}

// A holder keeps its grant through a crowd of waiters registering at once
// on a 3 s lease. A renewal tests only the grant's own fields, so no
// registration makes it fail; but every write of the Lease is applied by the
// apiserver one at a time, and a crowd writing at once starves the
// renewals. Waiters whose first registration lost a race spread their
// second over half a lease (registrationSpread), so the holder's renewals
// land: the grant must last through the crowd, renewed, and its release
// must hand the lock on. (100 waiters: on a 2-core machine that also runs
// the control plane, 150 can keep the holder's renewal unanswered for the
// whole 3 s lease.)
func TestHolderKeepsItsGrantThroughACrowdRegistering(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(3).Obj())
	g := NewWithT(t)
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())

	const size = 100
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	waiters := newCrowd(ctx, t, ns, "billing", size)
	defer func() { cancel(); waiters.wait() }()
	// The first waiter granted holds the lock until the hand-off is
	// checked: released at once, it would hand the lock on again.
	firstGrant, checked := make(chan *lock.Grant, 1), make(chan struct{})
	defer close(checked)
	var first sync.Once
	waiters.run(t, func(gr *lock.Grant) { first.Do(func() { firstGrant <- gr; <-checked }) })
	// Hold through the crowd's registration, and at least three leases.
	held := time.Now()
	var queuedIn time.Duration
	eventually(t, 90*time.Second, func(g Gomega) {
		if err := holder.Err(); err != nil {
			StopTrying("the holder lost its grant in the crowd").Wrap(err).Now()
		}
		g.Expect(queueOf(g, ns, "billing")).To(HaveLen(size))
		if queuedIn == 0 {
			queuedIn = time.Since(held)
		}
		g.Expect(time.Since(held)).To(BeNumerically(">", 9*time.Second))
	})
	g.Expect(holder.Err()).NotTo(HaveOccurred(), "the holder lost its grant in the crowd")
	t.Logf("the crowd of %d queued within %s", size, queuedIn.Round(time.Millisecond))
	g.Expect(holder.Release(context.Background())).To(Succeed())
	var head *lock.Grant
	g.Eventually(firstGrant, 10*time.Second).Should(Receive(&head), "nobody took up the hand-off")
	handed := getLease(g, ns, "billing")
	g.Expect(handed.Spec.HolderIdentity).To(HaveValue(Equal(head.Holder())), "the release handed the lock to the head")
	g.Expect(head.Token()).To(Equal(holder.Token() + 1))
	g.Expect(handed.Annotations).To(HaveKeyWithValue(locksv1alpha1.HandedOffByAnnotation, "holder"), "the release handed the lock to the head")
}
