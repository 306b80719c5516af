package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// lockRead is a read of the DistributedLock that may still be on its way.
type lockRead struct {
	done chan struct{}
	info lockInfo
	err  error
}

// startLockRead starts the read of the DistributedLock that every acquire
// makes (its UID and its recorded token: the floor no grant may go below).
// A client that has read the lock before acts on what it read then, with
// the read of now on its way beside it: the grant is handed to the caller
// only once that read agrees (confirm). A client that never read it reads
// it first (read is nil: nothing to confirm).
func (c *Client) startLockRead(ctx context.Context) (lockInfo, *lockRead, error) {
	c.mu.Lock()
	cached := c.info
	c.mu.Unlock()
	if cached == nil {
		info, err := c.resolve(ctx, true)
		return info, nil, err
	}
	r := &lockRead{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.info, r.err = c.resolve(ctx, true)
	}()
	return *cached, r, nil
}

// confirm hands the grant a to the caller once the read of the lock that
// went beside it (read; nil when the lock was read first) agrees: the same
// lock (UID) and Lease, and a token above the one the lock recorded (or
// that very grant recorded). Otherwise the grant is withheld: nobody acts
// on it, it is released, and the error says why (ErrLeaseUnavailable: the
// lock changed, or the Lease was wound back below a token already granted;
// or the read's own error).
func (c *Client) confirm(ctx context.Context, a *acquired, read *lockRead, p *place) (*Grant, error) {
	if read != nil {
		<-read.done
		fresh := read.info
		token := lease.Token(a.lease)
		switch {
		case read.err != nil:
			c.withhold(a, p)
			return nil, read.err
		case fresh.uid != a.info.uid || fresh.leaseName != a.info.leaseName:
			c.withhold(a, p)
			return nil, fmt.Errorf("%w: lock %s was deleted and created again while it was being acquired; its grant was not used",
				ErrLeaseUnavailable, c.LockName())
		case token < fresh.recorded || token == fresh.recorded && !fresh.records(a.lease):
			c.withhold(a, p)
			return nil, fmt.Errorf("%w: Lease %s/%s granted fencing token %d, but lock %s has recorded %d: the Lease was wound back; "+
				"its grant was not used, and no token is granted on it until the frontdesk controller restores it",
				ErrLeaseUnavailable, c.cfg.Namespace, a.info.leaseName, token, c.LockName(), fresh.recorded)
		}
	}
	return newGrant(c, c.logger(ctx), a), nil
}

// withhold releases a grant that was written but not handed to the caller
// (best effort, bounded): it carries a token that may have been handed out
// before, or belongs to a lock that is no more. The caller's place
// remembers it as its own grant not taken (p.uncertain), so that a copy of
// the Lease still showing it is not taken for another client's.
func (c *Client) withhold(a *acquired, p *place) {
	p.uncertain, p.uncertainNonce = lease.Token(a.lease), a.lease.Annotations[locksv1alpha1.GrantNonceAnnotation]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.writeLease(ctx, a.lease, lease.ReleasePatch(a.lease), false); err != nil {
		c.logger(ctx).Info("releasing a grant that was not used", "lock", c.LockName(), "err", err)
	}
}

// failed is why an acquire whose attempt failed with err failed: the lock
// read beside it, when that read found the lock gone (an attempt on a
// remembered Lease only learns that the Lease is no longer the lock's),
// else err. It waits for the read; a nil read (the lock was read first)
// changes nothing.
func (r *lockRead) failed(err error) error {
	if r == nil || err == nil {
		return err
	}
	<-r.done
	if errors.Is(r.err, ErrLockNotFound) {
		return r.err
	}
	return err
}
