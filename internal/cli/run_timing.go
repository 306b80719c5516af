package cli

import (
	"fmt"
	"time"

	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// defaultGrace is what --grace auto gives a command between SIGTERM and
// SIGKILL when the lease is long enough.
const defaultGrace = 10 * time.Second

// graceValue is the --grace flag: a duration, or "auto".
type graceValue struct {
	auto bool
	d    time.Duration
}

func (v *graceValue) String() string {
	if v.auto {
		return "auto"
	}
	return v.d.String()
}

func (v *graceValue) Set(s string) error {
	if s == "auto" {
		*v = graceValue{auto: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf(`want a duration (e.g. 5s) or "auto"`)
	}
	if d < 0 {
		return fmt.Errorf("must not be negative")
	}
	*v = graceValue{d: d}
	return nil
}

func (v *graceValue) Type() string { return "duration" }

// killLead is how long before the end of the grant's safe window the
// command's process group gets SIGKILL: half the safety margin, so that the
// group is dead and reaped, not just signalled, when the grant ends (the
// other half, and the whole margin to the lease itself, stay for clock-rate
// drift and scheduling delay).
func killLead(t lock.Timing) time.Duration { return t.SafetyMargin / 2 }

// maxGrace is the longest --grace that fits a lease with Timing t. While
// renewals succeed, the end of the safe window is at least
// SafeWindow - RenewInterval - (the last two renewals' latency) away; a
// grace that fits must not reach back that far, or a healthy command would
// get SIGTERM. Half a renew interval is left for that latency.
func maxGrace(t lock.Timing) time.Duration {
	return max(t.SafeWindow()-killLead(t)-t.RenewInterval-t.RenewInterval/2, 0)
}

// resolve is the grace to use for a lease with Timing t: auto is
// defaultGrace or the maximum that fits, whichever is shorter; an explicit
// grace that does not fit is an error saying what would.
func (v graceValue) resolve(t lock.Timing, lockName string) (time.Duration, error) {
	most := maxGrace(t)
	if v.auto {
		return min(defaultGrace, most), nil
	}
	if v.d > most {
		return 0, fmt.Errorf("--grace %s does not fit the lease of %s (leaseDurationSeconds: %d): at most %s does, "+
			"so that SIGTERM waits until renewals have failed and SIGKILL still comes before the lease could lapse for another holder; "+
			"use a shorter --grace, --grace auto, or a longer lease",
			v.d, lockName, int(t.LeaseDuration/time.Second), most.Truncate(10*time.Millisecond))
	}
	return v.d, nil
}

// deadlines are when the command's process group gets SIGTERM and SIGKILL
// for a grant safe until validUntil.
func deadlines(validUntil time.Time, t lock.Timing, grace time.Duration) (term, kill time.Time) {
	kill = validUntil.Add(-killLead(t))
	return kill.Add(-grace), kill
}
