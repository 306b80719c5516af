package lock

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Release gives the lock up if this client's identity holds it, whatever
// the grant (for a holder that lost its Grant object, such as
// `kubectl dlock release`), handing it to the head of the queue of waiters
// in the same write. It is a compare-and-swap; when another identity holds
// the lock nothing changes and the error is ErrNotHolder.
func (c *Client) Release(ctx context.Context) error {
	info, err := c.resolve(ctx, false)
	if err != nil {
		return err
	}
	err = c.modifyLease(ctx, info, func(l *coordinationv1.Lease) (*lease.Patch, error) {
		if !controlledBy(l, info.uid) && l.Labels[locksv1alpha1.LockNameLabel] != c.cfg.Name {
			return nil, fmt.Errorf("%w: Lease %s/%s is not lock %s's; nothing released", ErrLeaseUnavailable, c.cfg.Namespace, l.Name, c.LockName())
		}
		if holder := lease.Holder(l); holder != c.cfg.Identity {
			if holder == "" {
				holder = "nobody"
			}
			return nil, fmt.Errorf("%w: lock %s is held by %s, not %s; nothing released", ErrNotHolder, c.LockName(), holder, c.cfg.Identity)
		}
		return c.releasePatch(l, info), nil
	})
	return err
}

// BreakResult is what Break did.
type BreakResult struct {
	// PreviousHolder held the lock before the break ("" if nobody).
	PreviousHolder string
	// PreviousToken was the fencing token before the break.
	PreviousToken int64
	// Token is the fencing token after the break: every later grant is
	// above it, so resources reject the previous holder once anyone newer
	// writes.
	Token int64
}

// Break force-releases the lock whoever holds it, and bumps the fencing
// token in the same compare-and-swap so the previous holder is fenced. It is
// for operators; holders use Grant.Release.
func (c *Client) Break(ctx context.Context) (BreakResult, error) {
	var res BreakResult
	info, err := c.resolve(ctx, true)
	if err != nil {
		return res, err
	}
	err = c.modifyLease(ctx, info, func(l *coordinationv1.Lease) (*lease.Patch, error) {
		if !controlledBy(l, info.uid) {
			return nil, fmt.Errorf("%w: Lease %s/%s is not managed by lock %s (not adopted yet, owned by something else, or a retired record); nothing broken",
				ErrLeaseUnavailable, c.cfg.Namespace, l.Name, c.LockName())
		}
		broken, err := lease.BreakPatch(l)
		if err != nil {
			return nil, fmt.Errorf("breaking lock %s: %w", c.LockName(), err)
		}
		res = BreakResult{PreviousHolder: lease.Holder(l), PreviousToken: lease.Token(l), Token: lease.Token(l) + 1}
		return broken, nil
	})
	return res, err
}
