package lock

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Release gives the lock up if this client's identity holds it, whatever
// the grant (for a holder that lost its Grant object, such as
// `kubectl lock release`). It is a compare-and-swap; when another identity
// holds the lock nothing changes and the error is ErrNotHolder.
func (c *Client) Release(ctx context.Context) error {
	_, err := c.modifyLease(ctx, func(l *coordinationv1.Lease) error {
		if holder := ptr.Deref(l.Spec.HolderIdentity, ""); holder != c.cfg.Identity {
			if holder == "" {
				holder = "nobody"
			}
			return fmt.Errorf("%w: lock %s is held by %s, not %s; nothing released", ErrNotHolder, c.LockName(), holder, c.cfg.Identity)
		}
		l.Spec.HolderIdentity = nil
		l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
		return nil
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
	_, err := c.modifyLease(ctx, func(l *coordinationv1.Lease) error {
		res.PreviousHolder = ptr.Deref(l.Spec.HolderIdentity, "")
		res.PreviousToken = int64(ptr.Deref(l.Spec.LeaseTransitions, 0))
		res.Token = res.PreviousToken + 1
		l.Spec.HolderIdentity = nil
		l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
		l.Spec.LeaseTransitions = ptr.To(int32(res.Token))
		return nil
	})
	return res, err
}

// modifyLease applies mutate to a fresh read of the Lease and writes it back
// with a compare-and-swap, re-reading on a conflict. mutate may refuse by
// returning an error, which is returned as is.
func (c *Client) modifyLease(ctx context.Context, mutate func(*coordinationv1.Lease) error) (*coordinationv1.Lease, error) {
	info, _, err := c.resolve(ctx, false)
	if err != nil {
		return nil, err
	}
	for range maxCASAttempts {
		current, err := c.readLease(ctx, info.leaseName)
		if err != nil {
			return nil, err
		}
		l := current.DeepCopy()
		if err := mutate(l); err != nil {
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
	return nil, fmt.Errorf("updating lease %s/%s: lost %d compare-and-swap races in a row", c.cfg.Namespace, info.leaseName, maxCASAttempts)
}
