package lock

import (
	"math"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Timing is how a Client paces a grant of a lock: how long the lease is,
// how often it is renewed, and how long before the lease could lapse for
// others the grant stops counting as held.
type Timing struct {
	// LeaseDuration is the lock's spec.leaseDurationSeconds.
	LeaseDuration time.Duration
	// RenewInterval is how often a grant is renewed.
	RenewInterval time.Duration
	// SafetyMargin is how much earlier than the lease duration, counted
	// from the start of the last successful write, the grant's Context
	// ends (clock-rate drift and scheduling delay).
	SafetyMargin time.Duration
}

// SafeWindow is how long after the start of its last successful write a
// grant still counts as held: the lease duration minus the safety margin.
func (t Timing) SafeWindow() time.Duration { return t.LeaseDuration - t.SafetyMargin }

// TimingFor is the Timing this client uses for a lock whose lease lasts
// leaseDuration.
func (c *Client) TimingFor(leaseDuration time.Duration) Timing {
	info := lockInfo{duration: leaseDuration}
	return Timing{LeaseDuration: leaseDuration, RenewInterval: c.renewInterval(info), SafetyMargin: c.safetyMargin(info)}
}

// Timing is the grant's Timing.
func (g *Grant) Timing() Timing { return g.client.TimingFor(g.info.duration) }

// renewInterval is Config.RenewInterval, or a third of the lease duration.
func (c *Client) renewInterval(info lockInfo) time.Duration {
	if c.cfg.RenewInterval > 0 {
		return c.cfg.RenewInterval
	}
	return info.duration / 3
}

// safetyMargin is how long before the lease could lapse for others a grant
// stops counting as held (see lease.SafetyMargin).
func (c *Client) safetyMargin(info lockInfo) time.Duration {
	return lease.SafetyMargin(info.duration, c.cfg.SafetyMargin)
}

// safeUntil is how long a write that started at start keeps the lock: the
// others' expiry clock starts no earlier than the write, so the lease
// duration from start, minus the safety margin.
func (c *Client) safeUntil(info lockInfo, start time.Time) time.Time {
	return start.Add(info.duration - c.safetyMargin(info))
}

// followDelay is how long a grant lasts before it starts following its
// Lease.
const followDelay = 50 * time.Millisecond

// maxRecheck bounds how long a waiter behind the front of the queue goes
// without reading the Lease: at most a lease duration, and at most this.
const maxRecheck = 30 * time.Second

// watchRetryDelay is how long a waiter first backs off when it cannot open
// a watch, before reading the Lease again (see watchBackoff).
const watchRetryDelay = time.Second

// maxRegistrationSpread bounds registrationSpread.
const maxRegistrationSpread = 15 * time.Second

// registrationSpread is how long a waiter whose registration lost a race
// waits, unwatched, before it registers with a merge patch: a random moment
// within half a lease (at least a turn, at most maxRegistrationSpread). A
// lost race means that others are registering at the same moment (a crowd
// arriving at once). Merge patches never fail on each other, but the
// apiserver applies the writes of one Lease one at a time and redoes those
// that lost (a crowd merging at once makes it redo its work the square of
// the crowd's size times, starving the holder's renewals); spread out, the
// crowd's registrations land one after another, and the holder's renewals
// between them. The first of N sleepers wakes after about 1/N of the
// spread, so a lock that falls free meanwhile is not left free for long.
// Waiters of one crowd may queue in any order among themselves.
func registrationSpread(leaseDuration time.Duration) time.Duration {
	w := min(max(leaseDuration/2, lease.TurnLength(leaseDuration)), maxRegistrationSpread)
	return time.Duration(rand.Int64N(int64(w) + 1))
}

// renewBackoff is the backoff of a grant's writes retried after failures in
// a row (a renewal, the release of a lapsed grant): from a tenth of the
// renew interval (at most 100ms), doubling, up to half the interval, so
// that retries stay well inside the safe window. Each delay is taken at
// least 1ms (renewRetryDelay).
func renewBackoff(interval time.Duration) wait.Backoff {
	return wait.Backoff{Duration: min(interval/10, 100*time.Millisecond), Factor: 2, Steps: math.MaxInt32, Cap: interval / 2}
}

// renewRetryDelay is the next delay of b, a renewBackoff: at least 1ms.
func renewRetryDelay(b *wait.Backoff) time.Duration {
	return max(b.Step(), time.Millisecond)
}

// watchBackoff is the backoff of a waiter whose watches of the Lease could
// not be opened, failure after failure: watchRetryDelay, doubling, up to
// maxRecheck. Each delay is taken less a random quarter (jitterDown).
func watchBackoff() wait.Backoff {
	return wait.Backoff{Duration: watchRetryDelay, Factor: 2, Steps: math.MaxInt32, Cap: maxRecheck}
}

// jitterDown is d less a random part of up to a quarter, so that waiters
// cut off together (an apiserver restarting) do not come back together and
// none waits longer than d.
func jitterDown(d time.Duration) time.Duration {
	return d - time.Duration(rand.Int64N(int64(d/4)+1))
}
