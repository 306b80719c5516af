package lock

import (
	"context"
	"testing"
	"time"
)

func TestRegisterBackoffDoublesUpToItsLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		conflicts int
		lease     time.Duration
		max       time.Duration
	}{
		{"first race lost", 1, 15 * time.Second, 10 * time.Millisecond},
		{"second", 2, 15 * time.Second, 20 * time.Millisecond},
		{"fifth", 5, 15 * time.Second, 160 * time.Millisecond},
		{"capped at a second", 8, 15 * time.Second, time.Second},
		{"many", 1000, 15 * time.Second, time.Second},
		{"capped at a tenth of a short lease", 8, 2 * time.Second, 200 * time.Millisecond},
		{"never below the base", 3, time.Millisecond, 10 * time.Millisecond},
	} {
		for range 100 {
			if got := registerBackoff(tc.conflicts, tc.lease); got > tc.max || got < tc.max/2 {
				t.Fatalf("%s: %v, want %v to %v", tc.name, got, tc.max/2, tc.max)
			}
		}
	}
}

// A waiter that lost a registration race backs off unwatched: the watch it
// had is closed, none is opened, events are not judged, and at the deadline
// it reads the Lease afresh.
func TestBackingOffWaitsUnwatchedThenReadsAfresh(t *testing.T) {
	h := newWatchHarness(t)
	// A watch open from before (the waiter was queued once).
	first := waitHint{resourceVersion: "5", deadline: h.clock.Now().Add(time.Second), judged: candidate{lease: leaseNamed("5"), verified: true}}
	go func() {
		for _, watchers := h.opened(); len(watchers) == 0 || !h.clock.HasWaiters(); _, watchers = h.opened() {
			time.Sleep(time.Millisecond)
		}
		_, watchers := h.opened()
		watchers[0].Modify(leaseNamed("6"))
	}()
	if cand, err := h.lw.next(context.Background(), first); err != nil || cand.lease == nil {
		t.Fatalf("the open watch brought %+v, %v", cand, err)
	}

	done := make(chan candidate, 1)
	go func() {
		cand, _ := h.lw.next(context.Background(), waitHint{deadline: h.clock.Now().Add(50 * time.Millisecond), backingOff: true})
		done <- cand
	}()
	for !h.clock.HasWaiters() { // the watch is stopped before the timer starts
		time.Sleep(time.Millisecond)
	}
	selectors, watchers := h.opened()
	if len(selectors) != 1 || !watchers[0].IsStopped() {
		t.Fatalf("backing off: watches opened %q, the first stopped: %v; want the one, stopped", selectors, watchers[0].IsStopped())
	}
	h.clock.Step(49 * time.Millisecond)
	select {
	case cand := <-done:
		t.Fatalf("returned %+v before the backoff ended", cand)
	case <-time.After(20 * time.Millisecond):
	}
	h.clock.Step(time.Millisecond)
	if cand := <-done; cand.lease != nil {
		t.Errorf("after the backoff got a copy to judge, want a fresh read: %+v", cand)
	}
	if selectors, _ := h.opened(); len(selectors) != 1 {
		t.Errorf("backing off opened a watch: %q", selectors)
	}
}
