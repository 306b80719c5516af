package lock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"
)

// watchHarness is a leaseWatch whose watches come from fake watchers, with
// the label selector of every watch it opened.
type watchHarness struct {
	lw    *leaseWatch
	clock *clocktesting.FakeClock

	mu        sync.Mutex
	selectors []string
	watchers  []*watch.FakeWatcher
}

// opened is the selectors of the watches opened so far, and the watchers.
func (h *watchHarness) opened() ([]string, []*watch.FakeWatcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.selectors), slices.Clone(h.watchers)
}

func newWatchHarness(t *testing.T) *watchHarness {
	t.Helper()
	h := &watchHarness{clock: clocktesting.NewFakeClock(t0)}
	cs := fake.NewClientset()
	cs.PrependWatchReactor("leases", func(action k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFakeWithChanSize(1, false)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.selectors = append(h.selectors, action.(k8stesting.WatchActionImpl).WatchRestrictions.Labels.String())
		h.watchers = append(h.watchers, w)
		return true, w, nil
	})
	c := &Client{cfg: Config{Namespace: "ns", Name: "billing", Clock: h.clock}, leases: cs.CoordinationV1().Leases("ns")}
	h.lw = &leaseWatch{client: c, name: "billing", ticket: "t2"}
	return h
}

func leaseNamed(rv string) *coordinationv1.Lease {
	return leasetest.MakeLease("billing", "ns").ResourceVersion(rv).Obj()
}

// A waiter behind the front watches with the selector on its own ticket, a
// waiter at the front (or outside the queue) watches every change, and a
// change of place reopens the watch with the other one.
func TestLeaseWatchScopesToTheFrontWhileBehindIt(t *testing.T) {
	h := newWatchHarness(t)
	judged := leaseCopy{lease: leaseNamed("5"), verified: true}
	steps := []struct {
		behindFront  bool
		wantWatches  int
		wantSelector string
	}{
		{true, 1, lease.FrontSelector("t2")},
		{true, 1, lease.FrontSelector("t2")}, // same place: the same watch
		{false, 2, ""},
		{true, 3, lease.FrontSelector("t2")},
	}
	for i, step := range steps {
		hint := waitHint{resourceVersion: "5", deadline: h.clock.Now().Add(time.Second), judged: judged, behindFront: step.behindFront}
		done := make(chan leaseCopy, 1)
		go func() {
			seen, _ := h.lw.next(context.Background(), hint)
			done <- seen
		}()
		for !h.clock.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		h.clock.Step(2 * time.Second)
		seen := <-done
		if selectors, _ := h.opened(); len(selectors) != step.wantWatches || selectors[len(selectors)-1] != step.wantSelector {
			t.Fatalf("step %d: watches opened with selectors %q, want %d, the last %q", i, selectors, step.wantWatches, step.wantSelector)
		}
		// At the deadline an unscoped watch's silence means no change;
		// a scoped watch's means nothing, so the Lease is read afresh.
		if step.behindFront && seen.lease != nil {
			t.Errorf("step %d: behind the front, the deadline re-judged the old copy instead of reading afresh", i)
		}
		if !step.behindFront && seen.lease != judged.lease {
			t.Errorf("step %d: at the front, the deadline did not re-judge the copy: %+v", i, seen)
		}
	}
	_, watchers := h.opened()
	for i, w := range watchers[:len(watchers)-1] {
		if !w.IsStopped() {
			t.Errorf("watch %d was left open when the waiter moved", i)
		}
	}
}

// Events: a Lease brought by an unscoped watch is a fresh change; one
// brought by a scoped watch (the waiter moved up to the front) may carry an
// old record; a DELETED event is never judged (from a scoped watch it
// carries the content from before the change, under the change's version).
func TestLeaseWatchEvents(t *testing.T) {
	for _, tc := range []struct {
		name          string
		behindFront   bool
		event         watch.EventType
		wantLease     bool
		wantFromWatch bool
	}{
		{"unscoped change", false, watch.Modified, true, true},
		{"moved up to the front", true, watch.Added, true, false},
		{"left the front", true, watch.Deleted, false, false},
		{"deleted", false, watch.Deleted, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newWatchHarness(t)
			h.lw.client.remember(leaseNamed("4"))
			hint := waitHint{resourceVersion: "5", deadline: h.clock.Now().Add(time.Hour), behindFront: tc.behindFront}
			done := make(chan leaseCopy, 1)
			go func() {
				seen, _ := h.lw.next(context.Background(), hint)
				done <- seen
			}()
			var watchers []*watch.FakeWatcher
			for len(watchers) == 0 || !h.clock.HasWaiters() {
				time.Sleep(time.Millisecond)
				_, watchers = h.opened()
			}
			watchers[0].Action(tc.event, leaseNamed("9"))
			seen := <-done
			if (seen.lease != nil) != tc.wantLease || seen.fromWatch != tc.wantFromWatch {
				t.Errorf("leaseCopy %+v, want a lease %v, fromWatch %v", seen, tc.wantLease, tc.wantFromWatch)
			}
			if remembered := h.lw.client.remembered("billing"); (remembered != nil) != tc.wantLease {
				t.Errorf("remembered %v after a %s event", remembered, tc.event)
			}
		})
	}
}

// A waiter behind the front reads the Lease at least once per lease
// duration (or maxRecheck), in the last quarter of that, and never later
// than its turn.
func TestWaitBehindFrontCapsTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		duration time.Duration
		turnIn   time.Duration
		min, max time.Duration
	}{
		{"turn far off: one lease", 15 * time.Second, time.Minute, 15 * time.Second * 3 / 4, 15 * time.Second},
		{"long lease: maxRecheck", 5 * time.Minute, time.Hour, maxRecheck * 3 / 4, maxRecheck},
		{"turn sooner", 15 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 100 {
				h := waitHint{deadline: t0.Add(tc.turnIn)}
				h.waitBehindFront(t0, tc.duration)
				if got := h.deadline.Sub(t0); !h.behindFront || got < tc.min || got > tc.max {
					t.Fatalf("deadline in %v (behind the front: %v), want %v to %v", got, h.behindFront, tc.min, tc.max)
				}
			}
		})
	}
}

func TestLandedUncertainNeedsTheAttemptsNonce(t *testing.T) {
	granted := func(holder string, token int32, nonce string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{locksv1alpha1.GrantNonceAnnotation: nonce}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseTransitions: ptr.To(token)},
		}
		return l
	}
	p := &place{uncertain: 6, uncertainNonce: "n1"}
	cases := []struct {
		name string
		l    *coordinationv1.Lease
		p    *place
		want bool
	}{
		{"its own grant landed", granted("me", 6, "n1"), p, true},
		{"same identity and token, another process's grant", granted("me", 6, "n2"), p, false},
		{"another token", granted("me", 7, "n1"), p, false},
		{"another holder", granted("you", 6, "n1"), p, false},
		{"nothing uncertain", granted("me", 6, "n1"), &place{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := landedUncertain(tc.l, "me", tc.p); got != tc.want {
				t.Errorf("landedUncertain = %v, want %v", got, tc.want)
			}
		})
	}
}

// leaseWith is a Lease held by holder ("" free) with token and annotations.
func leaseWith(holder string, token int32, annotations map[string]string) *coordinationv1.Lease {
	b := leasetest.MakeLease("", "").Token(token).Annotations(annotations)
	if holder != "" {
		b.Holder(holder)
	}
	return b.Obj()
}

func TestLeftoverMatchesOnlyWhatThisClientLeft(t *testing.T) {
	nonce := func(n string) map[string]string { return map[string]string{locksv1alpha1.GrantNonceAnnotation: n} }
	handed := func(ticket string) map[string]string {
		return map[string]string{locksv1alpha1.TicketAnnotation: ticket}
	}
	queued := func(ticket string) map[string]string {
		return map[string]string{lease.EntryKey(ticket): "0,1,me", lease.QueuedByKey(ticket): "user=me"}
	}
	cases := []struct {
		name      string
		lo        leftover
		l         *coordinationv1.Lease
		grant     bool
		stillHere bool
	}{
		{"its grant, release failed", leftover{token: 6, nonce: "n1"}, leaseWith("me", 6, nonce("n1")), true, false},
		{"a later grant of the same identity and token, another nonce", leftover{token: 6, nonce: "n1"}, leaseWith("me", 6, nonce("n2")), false, false},
		{"the next grant", leftover{token: 6, nonce: "n1"}, leaseWith("me", 7, nonce("n1")), false, false},
		{"another holder", leftover{token: 6, nonce: "n1"}, leaseWith("you", 6, nonce("n1")), false, false},
		{"released meanwhile", leftover{token: 6, nonce: "n1"}, leaseWith("", 6, nil), false, false},
		{"no nonce to prove it", leftover{token: 6}, leaseWith("me", 6, nonce("")), false, false},
		{"handed to its old ticket", leftover{ticket: "t1"}, leaseWith("me", 9, handed("t1")), true, false},
		{"handed to another ticket", leftover{ticket: "t1"}, leaseWith("me", 9, handed("t2")), false, false},
		{"its place still queued", leftover{ticket: "t1"}, leaseWith("you", 3, queued("t1")), false, true},
		{"another place", leftover{ticket: "t1"}, leaseWith("you", 3, queued("t2")), false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.lo.grantOn(tc.l, "me"); got != tc.grant {
				t.Errorf("grantOn = %v, want %v", got, tc.grant)
			}
			if got := tc.lo.placeOn(tc.l); got != tc.stillHere {
				t.Errorf("placeOn = %v, want %v", got, tc.stillHere)
			}
		})
	}
}

func TestLeftoversAreBounded(t *testing.T) {
	c := &Client{}
	for i := range maxLeftovers + 3 {
		c.leaveBehind(leftover{token: int64(i + 1), nonce: "n"})
	}
	if got := len(c.left.items); got != maxLeftovers {
		t.Fatalf("%d leftovers remembered, want %d", got, maxLeftovers)
	}
	if first := c.left.items[0].token; first != 4 {
		t.Errorf("oldest remembered is token %d, want 4 (the oldest are forgotten)", first)
	}
	c.forgetLeftover(leftover{token: 5, nonce: "n"})
	if got := len(c.left.items); got != maxLeftovers-1 {
		t.Errorf("%d leftovers after forgetting one, want %d", got, maxLeftovers-1)
	}
}
