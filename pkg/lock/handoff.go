package lock

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// claimHandOff takes up a grant that a release handed to the caller. The
// caller did not write it, so it trusts no window it did not start: the
// hand-off was written after the caller's registration or its last read at
// the front of the queue (handOffWrittenAfter), so nobody else can see the
// handed-off grant lapse before that moment plus the lease duration the
// hand-off wrote (everyone's expiry clock starts at or after the hand-off's
// write). If that moment is at most a renew interval ago, the grant is used
// at once, as if this client had written it then: it is held until that
// moment plus the safe window, and first renewed when a grant written then
// would be (a renew interval after it), so that its ValidUntil is never
// nearer than a grant of its own would have it. Otherwise (the wait was
// long, or the front's reads failed) the caller renews first and counts
// from that write, like any grant.
func (c *Client) claimHandOff(ctx context.Context, info lockInfo, current *coordinationv1.Lease, p *place, now time.Time) (*acquired, error) {
	handed := info.grantedOn(current)
	interval := c.renewInterval(handed)
	if from := p.handOffWrittenAfter(current); !from.IsZero() && now.Sub(from) <= interval {
		c.logger(ctx).V(1).Info("taking up the lock handed to this client", "lock", c.LockName(), "token", lease.Token(current))
		return &acquired{lease: current, info: handed, validUntil: c.safeUntil(handed, from),
			firstRenewal: max(interval-now.Sub(from), 0)}, nil
	}
	updated, err := c.writeLease(ctx, current, lease.RenewPatch(current, now), false)
	if err != nil {
		return nil, err
	}
	if _, late := c.answeredTooLate(handed, updated, now); late != nil {
		return nil, late // the next attempt finds the hand-off still its own and renews again
	}
	c.observer.Observe(info.leaseName, lease.RecordOf(updated), now)
	return &acquired{lease: updated, info: handed, validUntil: c.safeUntil(handed, now), firstRenewal: interval}, nil
}
