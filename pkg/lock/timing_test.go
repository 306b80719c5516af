package lock

import (
	"testing"
	"time"
)

// The n-th retry of a grant's write in a row waits from a tenth of the
// renew interval (at most 100ms), doubling, up to half the interval.
func TestRenewBackoffStaysWithinTheInterval(t *testing.T) {
	cases := []struct {
		failures int
		interval time.Duration
		want     time.Duration
	}{
		{1, 5 * time.Second, 100 * time.Millisecond},
		{2, 5 * time.Second, 200 * time.Millisecond},
		{5, 5 * time.Second, 1600 * time.Millisecond},
		{6, 5 * time.Second, 2500 * time.Millisecond},
		{50, 5 * time.Second, 2500 * time.Millisecond},
		{1, 300 * time.Millisecond, 30 * time.Millisecond},
		{4, 300 * time.Millisecond, 150 * time.Millisecond},
		{1, time.Millisecond, time.Millisecond},
		{2, 5 * time.Millisecond, time.Millisecond},
		{3, 8 * time.Millisecond, 3200 * time.Microsecond},
	}
	for _, c := range cases {
		b := renewBackoff(c.interval)
		var got time.Duration
		for range c.failures {
			got = renewRetryDelay(&b)
		}
		if got != c.want {
			t.Errorf("retry %d of renewBackoff(%s) = %s, want %s", c.failures, c.interval, got, c.want)
		}
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
