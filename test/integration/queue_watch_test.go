package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// scopedWatchCounter counts a client's scoped watches (those with a label
// selector: a waiter behind the front of the queue) and the bytes they
// delivered (the client speaks protobuf; any event is some bytes, and a
// watch without bookmarks sends none otherwise).
type scopedWatchCounter struct {
	watches, bytes atomic.Int64
	// firstByteAt is when the scoped watch first delivered anything (Unix
	// nanoseconds; 0: never).
	firstByteAt atomic.Int64
}

type countingTransport struct {
	next    http.RoundTripper
	counter *scopedWatchCounter
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	q := req.URL.Query()
	if err == nil && q.Get("watch") == "true" && q.Get("labelSelector") != "" {
		t.counter.watches.Add(1)
		resp.Body = &countingBody{ReadCloser: resp.Body, counter: t.counter}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	counter *scopedWatchCounter
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.counter.firstByteAt.CompareAndSwap(0, time.Now().UnixNano())
	}
	b.counter.bytes.Add(int64(n))
	return n, err
}

// newCountingLockClient is newLockClient whose scoped watches are counted.
func newCountingLockClient(t *testing.T, ns, name, identity string) (*lock.Client, *scopedWatchCounter) {
	t.Helper()
	counter := &scopedWatchCounter{}
	cfg := restConfig()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, counter: counter} })
	c, err := lock.New(cfg, lock.Config{Namespace: ns, Name: name, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	return c, counter
}

// countLeaseWrites counts the changes of a Lease that the test's own watch
// of it sees.
func countLeaseWrites(t *testing.T, ns, name string) *atomic.Int64 {
	t.Helper()
	w, err := clientset.CoordinationV1().Leases(ns).Watch(context.Background(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	var n atomic.Int64
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				n.Add(1)
			}
		}
	}()
	return &n
}

// While the holder renews, only the front of the queue (its first two
// waiters) hears of it: a waiter further back watches the Lease for the
// moment it moves up to the front and receives nothing before then. Each
// waiter still gets the lock, in order, within moments of the release
// before it: it heard that it moved up, it did not wait for its next read
// of the Lease (which comes 15 to 20 s apart with this 20 s lease).
func TestWaitersBehindTheFrontHearOnlyOfTheirTurn(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(20).Obj())
	holder, err := newLockClient(t, ns, "billing", "holder", func(c *lock.Config) { c.RenewInterval = 100 * time.Millisecond }).
		TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := []string{"first", "second", "third", "fourth", "fifth"}
	counters := make([]*scopedWatchCounter, len(names))
	results := make([]<-chan acquireResult, len(names))
	for i, name := range names {
		var c *lock.Client
		c, counters[i] = newCountingLockClient(t, ns, "billing", name)
		results[i] = acquireInBackground(ctx, c)
		eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal(names[:i+1])) })
	}
	behind := counters[lease.FrontLength:]
	eventually(t, 10*time.Second, func(g Gomega) {
		for i, c := range behind {
			g.Expect(c.watches.Load()).To(BeNumerically(">=", 1), "%s, behind the front, watches every change", names[lease.FrontLength+i])
		}
	})
	g := NewWithT(t)
	for i, c := range counters[:lease.FrontLength] {
		g.Expect(c.watches.Load()).To(BeZero(), "%s, at the front, narrowed its watch", names[i])
	}
	// Count from here: every waiter is queued and has opened its watch.
	writes := countLeaseWrites(t, ns, "billing")
	before := make([]int64, len(behind))
	for i, c := range behind {
		before[i] = c.bytes.Load()
	}
	const renewals = 10
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(writes.Load()).To(BeNumerically(">=", renewals)) })
	for i, c := range behind {
		g.Expect(c.bytes.Load()-before[i]).To(BeZero(), "%s, behind the front, heard of the holder's renewals", names[lease.FrontLength+i])
	}

	g.Expect(holder.Release(context.Background())).To(Succeed())
	releasedAt := time.Now()
	for i, name := range names {
		var r acquireResult
		select {
		case r = <-results[i]:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not take the lock up within 10 s of the release before it (its periodic read comes 15-20 s apart)", name)
		}
		g.Expect(r.err).NotTo(HaveOccurred(), name)
		g.Expect(r.at.Sub(releasedAt)).To(BeNumerically("<", 10*time.Second), name)
		g.Expect(r.grant.Token()).To(Equal(holder.Token()+int64(i)+1), "%s's grant", name)
		g.Expect(r.grant.Release(context.Background())).To(Succeed())
		releasedAt = time.Now()
	}
	for i, c := range behind {
		g.Expect(c.bytes.Load()-before[i]).To(BeNumerically(">", 0), "%s heard nothing when it moved up to the front", names[lease.FrontLength+i])
	}
	for key := range getLease(g, ns, "billing").Labels {
		g.Expect(lease.IsFrontLabel(key)).To(BeFalse(), "nobody is queued, yet the Lease has %s", key)
	}
}

// A holder that goes silent (after one last renewal), with two dead
// waiters at the front of the queue: the live waiter behind them does not
// hear of that renewal on its scoped watch. The controller ends the grant a
// lease after the renewal, then removes the dead head once its turn passed
// with nobody taking the lock; the live waiter, now at the front, hears of
// it and takes the lock at its turn behind the second dead waiter: never
// before the renewal plus the lease and two turns, and no later than its
// recheck (at most a lease duration) after that, with a few seconds to
// spare for a slow machine.
func TestWaiterBehindTheFrontTakesALapsedLockAtItsTurn(t *testing.T) {
	ns := newNamespace(t)
	const leaseSeconds = 4
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(leaseSeconds).Obj())
	g := NewWithT(t)
	silent := grantSilently(g, ns, "billing", "silent", leaseSeconds*time.Second)
	queueGhost(t, ns, "billing", "ghost-1")
	queueGhost(t, ns, "billing", "ghost-2")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, counter := newCountingLockClient(t, ns, "billing", "alive")
	done := acquireInBackground(ctx, c)
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(queueOf(g, ns, "billing")).To(Equal([]string{"ghost-1", "ghost-2", "alive"}))
		g.Expect(counter.watches.Load()).To(BeNumerically(">=", 1), "the waiter behind the front watches every change")
	})
	renewedAt := time.Now()
	editLease(g, ns, "billing", func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		if lease.Holder(l) != "silent" {
			return nil, StopTrying(fmt.Sprintf("the lock went to %q before the silent holder's last renewal was written", lease.Holder(l)))
		}
		return lease.Renew(l, leaseSeconds*time.Second, renewedAt), nil
	})

	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.grant.Token()).To(Equal(lease.Token(silent) + 1))
	granted := getLease(g, ns, "billing")
	g.Expect(lease.Holder(granted)).To(Equal("alive"))
	turn := lease.TurnLength(leaseSeconds * time.Second)
	g.Expect(granted.Spec.AcquireTime.Time.Sub(renewedAt)).To(BeNumerically(">=", leaseSeconds*time.Second+2*turn),
		"the waiter took the lock before the silent holder's last renewal could lapse and the front's turns pass")
	g.Expect(r.at.Sub(renewedAt)).To(BeNumerically("<", 2*leaseSeconds*time.Second+2*turn+5*time.Second),
		"the waiter did not read the Lease within a lease duration")
	// The scoped watch first delivers the Lease when the controller, having
	// ended the silent grant, removes the dead head whose turn passed and
	// the waiter moves up to the front: never the renewal.
	first := counter.firstByteAt.Load()
	g.Expect(first).NotTo(BeZero(), "the waiter never heard that it moved up to the front")
	g.Expect(time.Unix(0, first).Sub(renewedAt)).To(BeNumerically(">=", leaseSeconds*time.Second),
		"the scoped watch delivered the renewal of a Lease that did not name the waiter at the front")
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(BeEmpty(), "the controller drops the entries passed over")
	})
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}

// The Lease deleted (and recreated by the controller) under a queue: the
// new Lease has no queue, so no event ever names a waiter behind the old
// front. That waiter still reads the Lease within a lease duration, not
// only at its turn (which, 31 entries back, would be 15.5 s past the
// lapse), and gets the lock.
func TestWaiterBehindTheFrontFindsARecreatedLease(t *testing.T) {
	ns := newNamespace(t)
	const leaseSeconds = 3
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(leaseSeconds).Obj())
	g := NewWithT(t)
	holder, err := newLockClient(t, ns, "billing", "holder").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := acquireInBackground(ctx, newLockClient(t, ns, "billing", "first"))
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(HaveLen(1)) })
	for i := range 30 {
		queueGhost(t, ns, "billing", fmt.Sprintf("ghost-%d", i))
	}
	last := acquireInBackground(ctx, newLockClient(t, ns, "billing", "last"))
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(HaveLen(32)) })

	deletedAt := time.Now()
	g.Expect(k8sClient.Delete(ctx, getLease(g, ns, "billing"))).To(Succeed())
	// The new Lease has no queue: first and last may take it in either
	// order (last's read may find the Lease terminating and widen its
	// watch); whichever holds it releases it for the other.
	got := make([]acquireResult, 0, 2)
	for range 2 {
		var r acquireResult
		select {
		case r = <-first:
		case r = <-last:
		}
		g.Expect(r.err).NotTo(HaveOccurred())
		g.Expect(r.grant.Token()).To(BeNumerically(">", holder.Token()))
		g.Expect(r.at.Sub(deletedAt)).To(BeNumerically("<", 12*time.Second),
			"a waiter waited for its turn on the deleted Lease's queue instead of reading the new Lease")
		g.Expect(r.grant.Release(context.Background())).To(Succeed())
		got = append(got, r)
	}
	g.Expect(got[1].grant.Token()).To(BeNumerically(">", got[0].grant.Token()))
	err = holder.Release(context.Background())
	g.Expect(err == nil || errors.Is(err, lock.ErrLost)).To(BeTrue(), "the old holder's release: %v", err)
}
