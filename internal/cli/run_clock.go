package cli

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// bootSamples is how many readings a bootClock keeps.
const bootSamples = 64

// bootClock is the real clock, as the lock client's clock, which also
// records what the deadline clock (bootNow) read at each Now. It maps a
// time the client read, such as the start of a renewal, to the deadline
// clock, never later: the watchdog's deadlines are on that clock, which
// keeps counting while the machine is suspended.
type bootClock struct {
	clock.RealClock
	now func() time.Duration // the deadline clock

	mu sync.Mutex
	// base is the first reading; offsets are deadline-clock time minus
	// monotonic time since base.
	base    time.Time
	first   time.Duration
	samples [bootSamples]bootSample
	next    int
}

// bootSample is a reading of both clocks: offset is the deadline clock's
// reading less t's monotonic time since base, read before t.
type bootSample struct {
	t      time.Time
	offset time.Duration
}

// newBootClock is a bootClock on the deadline clock now.
func newBootClock(now func() time.Duration) *bootClock {
	c := &bootClock{now: now}
	boot := now()
	c.base = time.Now()
	c.first = boot
	return c
}

// Now is the current time, recorded with the deadline clock's reading.
func (c *bootClock) Now() time.Time {
	// The deadline clock first: its offset to t is then never larger than
	// at t.
	boot := c.now()
	t := time.Now()
	c.mu.Lock()
	c.samples[c.next%bootSamples] = bootSample{t: t, offset: boot - t.Sub(c.base)}
	c.next++
	c.mu.Unlock()
	return t
}

// Since is the time elapsed since t.
func (c *bootClock) Since(t time.Time) time.Duration { return time.Since(t) }

// toDeadline is t on the deadline clock, never later than it was at t (t
// from this clock's Now, or time.Now): the offset of the latest reading
// at or before t. The deadline clock runs at least as fast as the
// monotonic one, so that offset never exceeds the offset at t; without
// such a reading the first one serves.
func (c *bootClock) toDeadline(t time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	offset := c.first
	var latest time.Time
	for _, s := range c.samples {
		if s.t.IsZero() || s.t.After(t) || (!latest.IsZero() && s.t.Before(latest)) {
			continue
		}
		latest, offset = s.t, s.offset
	}
	return t.Sub(c.base) + offset
}
