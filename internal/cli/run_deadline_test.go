package cli

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// fakeDeadlineClock is a deadline clock that moves only when a wait on it
// (after) is made: each wait advances it by the wait, plus jump once.
type fakeDeadlineClock struct {
	now   time.Duration
	waits []time.Duration
	// jump is added to the clock at the next wait (a suspend).
	jump time.Duration
}

func (c *fakeDeadlineClock) read() time.Duration { return c.now }

func (c *fakeDeadlineClock) after(d time.Duration) <-chan time.Time {
	c.waits = append(c.waits, d)
	c.now += d + c.jump
	c.jump = 0
	fired := make(chan time.Time, 1)
	fired <- time.Time{}
	return fired
}

func TestAwaitDeadline(t *testing.T) {
	t.Run("passes without extension", func(t *testing.T) {
		clk := &fakeDeadlineClock{now: time.Second}
		if !awaitDeadline(1300*time.Millisecond, make(chan time.Duration), clk.read, clk.after) {
			t.Fatal("closed: want the deadline to pass")
		}
		if clk.now != 1300*time.Millisecond {
			t.Errorf("fired at %s, want 1.3s", clk.now)
		}
		for _, w := range clk.waits {
			if w > deadlinePoll {
				t.Errorf("waited %s at once, want at most %s", w, deadlinePoll)
			}
		}
	})
	t.Run("already passed", func(t *testing.T) {
		clk := &fakeDeadlineClock{now: 2 * time.Second}
		if !awaitDeadline(time.Second, make(chan time.Duration), clk.read, clk.after) || len(clk.waits) != 0 {
			t.Fatalf("want the deadline to count as passed at once, waited %v", clk.waits)
		}
	})
	t.Run("a suspend is noticed within a poll", func(t *testing.T) {
		clk := &fakeDeadlineClock{now: 0, jump: 10 * time.Second}
		if !awaitDeadline(time.Hour, make(chan time.Duration), clk.read, clk.after) {
			t.Fatal("want the deadline to pass")
		}
		if clk.now != time.Hour {
			t.Errorf("fired at %s, want 1h", clk.now)
		}
	})
	t.Run("closed", func(t *testing.T) {
		clk := &fakeDeadlineClock{}
		deadlines := make(chan time.Duration)
		close(deadlines)
		// A clock that never fires: only the close can end the wait.
		never := func(time.Duration) <-chan time.Time { return nil }
		if awaitDeadline(time.Hour, deadlines, clk.read, never) {
			t.Fatal("want closed, not passed")
		}
	})
}

// An extension received before the deadline moves it; one received after
// it passed does not revive it.
func TestAwaitDeadlineExtension(t *testing.T) {
	now := time.Second
	read := func() time.Duration { return now }
	never := func(time.Duration) <-chan time.Time { return nil }
	deadlines := make(chan time.Duration)
	passed := make(chan bool)
	go func() { passed <- awaitDeadline(2*time.Second, deadlines, read, never) }()
	deadlines <- 3 * time.Second // at 1s: before the deadline, moves it
	deadlines <- 4 * time.Second // at 1s: moves it again
	close(deadlines)
	if <-passed {
		t.Fatal("passed: want the extensions taken and the close to end the wait")
	}

	deadlines = make(chan time.Duration, 1)
	now = 5 * time.Second
	deadlines <- 10 * time.Second // waiting when it passed
	if !awaitDeadline(4*time.Second, deadlines, read, never) {
		t.Fatal("a late extension revived a passed deadline")
	}
}

func TestDeadlinesRoundTrip(t *testing.T) {
	var pipe bytes.Buffer
	sent := []time.Duration{1, 123456789 * time.Second, 42 * time.Millisecond}
	for _, d := range sent {
		if err := writeDeadline(&pipe, d); err != nil {
			t.Fatal(err)
		}
	}
	pipe.WriteString("not a deadline\n")
	pipe.WriteString("7\n")
	var got []time.Duration
	for d := range readDeadlines(io.Reader(&pipe)) {
		got = append(got, d)
	}
	if len(got) != len(sent) {
		t.Fatalf("read %v, want %v and a stop at the malformed line", got, sent)
	}
	for i := range sent {
		if got[i] != sent[i] {
			t.Errorf("deadline %d: read %s, want %s", i, got[i], sent[i])
		}
	}
}

// toDeadline maps a time the client read to the deadline clock with the
// offset read with it: a suspend after it does not move it later.
func TestBootClockToDeadline(t *testing.T) {
	boot := 100 * time.Second
	clk := newBootClock(func() time.Duration { return boot })
	renewal := clk.Now()
	boot += 30 * time.Second // a suspend: the deadline clock jumps, time.Now does not
	later := clk.Now()
	got := clk.toDeadline(renewal)
	want := 100 * time.Second
	if got != want {
		t.Errorf("renewal on the deadline clock: %s, want %s (the offset read with it)", got, want)
	}
	if got := clk.toDeadline(later); got < want+30*time.Second {
		t.Errorf("a reading after the suspend: %s, want it to count the suspend", got)
	}

	// A time with no reading at or before it in the ring: the first
	// reading's offset, never a later one.
	boot = 0
	fresh := newBootClock(func() time.Duration { return boot })
	before := time.Now().Add(-time.Second)
	boot = time.Hour
	for range bootSamples + 1 {
		fresh.Now()
	}
	if got := fresh.toDeadline(before); got > 0 {
		t.Errorf("time before any reading: %s, want at most 0 (the first offset)", got)
	}
}

// watchdogDeadline on the deadline clock is ValidUntil, counted from the
// start of the renewal: after run's own SIGKILL, before the lease could
// lapse.
func TestWatchdogDeadline(t *testing.T) {
	boot := 50 * time.Second
	clk := newBootClock(func() time.Duration { return boot })
	timing := lock.Timing{LeaseDuration: 3 * time.Second, RenewInterval: time.Second, SafetyMargin: 160 * time.Millisecond}
	start := clk.Now()
	boot += time.Hour // later readings must not matter
	clk.Now()
	validUntil := start.Add(timing.SafeWindow())
	got := watchdogDeadline(clk, validUntil, timing)
	if want := 50*time.Second + timing.SafeWindow(); got != want {
		t.Errorf("watchdog deadline %s, want %s", got, want)
	}
	_, kill := deadlines(validUntil, timing, 0)
	if runKill := 50*time.Second + kill.Sub(start); got <= runKill {
		t.Errorf("watchdog deadline %s is not after run's own SIGKILL (%s)", got, runKill)
	}
	if lapse := 50*time.Second + timing.LeaseDuration; got >= lapse {
		t.Errorf("watchdog deadline %s is not before the lease could lapse (%s)", got, lapse)
	}
}
