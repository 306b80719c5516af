package lock

import "time"

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
