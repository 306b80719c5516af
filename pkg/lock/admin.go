package lock

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Release gives the lock up if this client's identity holds it, whatever
// the grant (for a holder that lost its Grant object, such as
// `kubectl lock release`), handing it to the head of the queue of waiters
// in the same write. It is a compare-and-swap; when another identity holds
// the lock nothing changes and the error is ErrNotHolder.
func (c *Client) Release(ctx context.Context) error {
	info, _, err := c.resolve(ctx, false)
	if err != nil {
		return err
	}
	_, err = c.modifyLease(ctx, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		if !controlledBy(l, info.uid) && l.Labels[locksv1alpha1.LockNameLabel] != c.cfg.Name {
			return nil, fmt.Errorf("%w: Lease %s/%s is not lock %s's; nothing released", ErrLeaseUnavailable, c.cfg.Namespace, l.Name, c.LockName())
		}
		if holder := lease.Holder(l); holder != c.cfg.Identity {
			if holder == "" {
				holder = "nobody"
			}
			return nil, fmt.Errorf("%w: lock %s is held by %s, not %s; nothing released", ErrNotHolder, c.LockName(), holder, c.cfg.Identity)
		}
		return c.releasedLease(l, info)
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
	info, _, err := c.resolve(ctx, true)
	if err != nil {
		return res, err
	}
	_, err = c.modifyLease(ctx, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		if !controlledBy(l, info.uid) {
			return nil, fmt.Errorf("%w: Lease %s/%s is not managed by lock %s (not adopted yet, owned by something else, or a retired record); nothing broken",
				ErrLeaseUnavailable, c.cfg.Namespace, l.Name, c.LockName())
		}
		broken, err := lease.Break(l)
		if err != nil {
			return nil, fmt.Errorf("breaking lock %s: %w", c.LockName(), err)
		}
		res = BreakResult{PreviousHolder: lease.Holder(l), PreviousToken: lease.Token(l), Token: lease.Token(broken)}
		return broken, nil
	})
	return res, err
}

// modifyLease applies edit to a fresh read of the Lease and writes the copy
// it returns back with a compare-and-swap, re-reading on a conflict. edit
// may refuse by returning an error, which is returned as is.
func (c *Client) modifyLease(ctx context.Context, edit func(*coordinationv1.Lease) (*coordinationv1.Lease, error)) (*coordinationv1.Lease, error) {
	info, _, err := c.resolve(ctx, false)
	if err != nil {
		return nil, err
	}
	for range maxWriteAttempts {
		current, err := c.readLease(ctx, info.leaseName)
		if err != nil {
			return nil, err
		}
		l, err := edit(current)
		if err != nil {
			return nil, err
		}
		updated, err := c.leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			c.remember(updated)
			return updated, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("updating lease %s/%s: %w", c.cfg.Namespace, info.leaseName, err)
		}
	}
	return nil, fmt.Errorf("updating lease %s/%s: lost %d compare-and-swap races in a row", c.cfg.Namespace, info.leaseName, maxWriteAttempts)
}
