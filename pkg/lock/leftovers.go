package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// maxLeftovers bounds what a Client remembers of what it left behind; the
// controller clears the rest (a grant lapses, a dead place is passed over).
const maxLeftovers = 8

// leftover is a record this client may have left on the lock's Lease: a
// grant whose release failed or whose answer never came (token, with the
// nonce or hand-off ticket it was written with), or a place in the queue
// whose withdrawal failed (ticket). Both are this client's own, no longer
// used by anybody: the next attempt clears them rather than take them for
// another client's under the same identity (see identityInUse).
type leftover struct {
	token  int64
	nonce  string
	ticket string
}

// leftovers is what a Client left behind, newest last.
type leftovers struct {
	mu    sync.Mutex
	items []leftover
}

// leaveBehind remembers lo (the oldest is forgotten beyond maxLeftovers).
func (c *Client) leaveBehind(lo leftover) {
	c.left.mu.Lock()
	defer c.left.mu.Unlock()
	c.left.items = append(c.left.items, lo)
	if len(c.left.items) > maxLeftovers {
		c.left.items = c.left.items[1:]
	}
}

// forgetLeftover forgets lo, cleared or gone.
func (c *Client) forgetLeftover(lo leftover) {
	c.left.mu.Lock()
	defer c.left.mu.Unlock()
	c.left.items = slices.DeleteFunc(c.left.items, func(x leftover) bool { return x == lo })
}

// leftOn returns a leftover of this client's that current still records.
func (c *Client) leftOn(current *coordinationv1.Lease) (leftover, bool) {
	c.left.mu.Lock()
	defer c.left.mu.Unlock()
	for _, lo := range c.left.items {
		if lo.grantOn(current, c.cfg.Identity) || lo.placeOn(current) {
			return lo, true
		}
	}
	return leftover{}, false
}

// grantOn reports whether current's grant is lo: held under identity and
// handed to lo's ticket, or with lo's token and written with lo's nonce.
func (lo leftover) grantOn(current *coordinationv1.Lease, identity string) bool {
	if lease.Holder(current) != identity {
		return false
	}
	if lo.ticket != "" && current.Annotations[locksv1alpha1.TicketAnnotation] == lo.ticket {
		return true
	}
	return lo.token != 0 && lo.nonce != "" && lease.Token(current) == lo.token &&
		current.Annotations[locksv1alpha1.GrantNonceAnnotation] == lo.nonce
}

// placeOn reports whether current's queue still holds lo's place.
func (lo leftover) placeOn(current *coordinationv1.Lease) bool {
	return lo.ticket != "" && lease.Position(current, lo.ticket) >= 0
}

// leftoverOfGrant is what a grant written on l leaves behind if it is not
// released.
func leftoverOfGrant(l *coordinationv1.Lease) leftover {
	return leftover{token: lease.Token(l), nonce: l.Annotations[locksv1alpha1.GrantNonceAnnotation], ticket: l.Annotations[locksv1alpha1.TicketAnnotation]}
}

// clearLeftover ends lo on the lock's Lease: releases its grant if the
// Lease still records it, and withdraws its place. Either write is made
// only while the Lease shows lo (the release is a compare-and-swap of the
// copy judged; a withdrawal removes only lo's ticket), so it never touches
// another client's grant or place. lo is forgotten once nothing of it is
// left.
func (c *Client) clearLeftover(ctx context.Context, info lockInfo, lo leftover) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := c.modifyLease(ctx, info, func(l *coordinationv1.Lease) (*lease.Patch, error) {
		if lo.grantOn(l, c.cfg.Identity) && c.mine(ctx, &place{}, l.Annotations[locksv1alpha1.HolderPrincipalAnnotation]) {
			return c.releasePatch(l, info), nil
		}
		return nil, errNothingToDo
	})
	if err != nil && !errors.Is(err, errNothingToDo) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing this client's earlier grant (token %d) on lock %s: %w", lo.token, c.LockName(), err)
	}
	if lo.ticket != "" {
		if err := c.withdraw(ctx, info, lo.ticket); err != nil {
			return fmt.Errorf("withdrawing this client's earlier place in the queue of lock %s: %w", c.LockName(), err)
		}
	}
	c.forgetLeftover(lo)
	return nil
}

// isRefusal reports whether clearing a leftover failed with the
// apiserver's answer (a 4xx: RBAC, the policies, a bad request), not for a
// moment: then the leftover is not this client's to clear, and is dropped.
func isRefusal(err error) bool { return !mayHaveLanded(err) }
