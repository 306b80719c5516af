package lock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
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
	return testutil.MakeLease("billing", "ns").ResourceVersion(rv).Obj()
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

// Only failures that pass by themselves keep a waiter in the queue.
func TestPassingReadError(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"server timeout", context.Background(), apierrors.NewServerTimeout(gr, "get", 1), true},
		{"internal error", context.Background(), apierrors.NewInternalError(errors.New("etcd")), true},
		{"unavailable", context.Background(), apierrors.NewServiceUnavailable("starting"), true},
		{"too many requests", context.Background(), apierrors.NewTooManyRequests("slow down", 1), true},
		{"connection refused", context.Background(), fmt.Errorf("get: %w", syscall.ECONNREFUSED), true},
		{"unexpected EOF", context.Background(), fmt.Errorf("get: %w", io.ErrUnexpectedEOF), true},
		{"forbidden", context.Background(), apierrors.NewForbidden(gr, "billing", errors.New("rbac")), false},
		{"unauthorized", context.Background(), apierrors.NewUnauthorized("who are you"), false},
		{"bad request", context.Background(), apierrors.NewBadRequest("no"), false},
		{"something else", context.Background(), errors.New("x509: certificate signed by unknown authority"), false},
		{"the caller gave up", cancelled, apierrors.NewServerTimeout(gr, "get", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := passingReadError(tc.ctx, fmt.Errorf("reading lease: %w", tc.err)); got != tc.want {
				t.Errorf("passingReadError = %v, want %v", got, tc.want)
			}
		})
	}
}

// A waiter that cannot open a watch backs off longer with every failure in
// a row, up to maxRecheck, with some jitter.
func TestWatchBackoffDoublesUpToTheRecheck(t *testing.T) {
	for _, tc := range []struct {
		failures int
		max      time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {5, 16 * time.Second}, {6, maxRecheck}, {60, maxRecheck},
	} {
		for range 100 {
			b := watchBackoff()
			var got time.Duration
			for range tc.failures {
				got = jitterDown(b.Step())
			}
			if got > tc.max || got < tc.max*3/4 {
				t.Fatalf("after %d failures: %v, want %v to %v", tc.failures, got, tc.max*3/4, tc.max)
			}
		}
	}
}
