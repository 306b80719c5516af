package lock

import (
	"context"

	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// leaseWatch is the one watch an Acquire call keeps on its Lease. It is
// opened at the first wait, reopened when the server ends it, and narrowed
// or widened as the caller moves in the queue: a waiter behind the front
// of the queue (its first lease.FrontLength waiters) watches the Lease only
// for the moment it moves up to the front (lease.FrontSelector on its
// ticket), so that a renewal or a registration reaches the front alone
// instead of every waiter; the front, and a caller outside the queue,
// watch every change.
type leaseWatch struct {
	client *Client
	name   string
	// ticket is the caller's place in the queue ("" when it has none).
	ticket string
	w      watch.Interface
	// scoped: w watches only for the Lease naming ticket at the front.
	scoped bool
	// retries backs off the watches in a row that could not be opened;
	// failing says one failed last.
	retries wait.Backoff
	failing bool
}

// next waits for the Lease's next change, the hint's deadline, or the end of
// ctx, and returns the copy of the Lease to judge next (an empty leaseCopy
// means: read it afresh).
func (lw *leaseWatch) next(ctx context.Context, hint waitHint) (leaseCopy, error) {
	if hint.unwatched {
		return leaseCopy{}, lw.sleep(ctx, hint.deadline)
	}
	clk := lw.client.cfg.Clock
	timer := clk.NewTimer(max(hint.deadline.Sub(clk.Now()), time.Millisecond))
	defer timer.Stop()
	scoped := hint.behindFront && lw.ticket != ""
	if lw.w != nil && lw.scoped != scoped {
		lw.stop()
	}
	if lw.w == nil {
		selector := ""
		if scoped {
			selector = lease.FrontSelector(lw.ticket)
		}
		w, err := lw.client.watchLease(ctx, lw.name, hint.resourceVersion, selector)
		if err != nil {
			// No watch (the resourceVersion may be too old, or watching is
			// not allowed, or the apiserver is away): back off, then read
			// afresh.
			if !lw.failing {
				lw.retries, lw.failing = watchBackoff(), true
			}
			backoff := clk.NewTimer(jitterDown(lw.retries.Step()))
			defer backoff.Stop()
			select {
			case <-ctx.Done():
				return leaseCopy{}, ctx.Err()
			case <-timer.C():
			case <-backoff.C():
			}
			return leaseCopy{}, nil
		}
		lw.w, lw.scoped, lw.failing = w, scoped, false
	}
	select {
	case <-ctx.Done():
		return leaseCopy{}, ctx.Err()
	case <-timer.C():
		if lw.scoped {
			// A scoped watch hears of no renewal: read afresh.
			return leaseCopy{}, nil
		}
		// Nothing changed until the deadline: judge the same copy again,
		// now past its observed expiry.
		return hint.judged, nil
	case ev, ok := <-lw.w.ResultChan():
		if l, isLease := ev.Object.(*coordinationv1.Lease); ok && isLease && (ev.Type == watch.Added || ev.Type == watch.Modified) {
			lw.client.remember(l)
			// A scoped watch brings the Lease when the caller reaches the
			// front, whenever its record last changed.
			return leaseCopy{lease: l, fromWatch: !lw.scoped, verified: true}, nil
		}
		// Anything else is read afresh. Never judge a DELETED event's
		// object: when the Lease stops matching a scoped watch's selector,
		// the apiserver sends its content before the change under the
		// change's resourceVersion, a copy that never existed (a grant
		// compare-and-swapped on it would overwrite the change).
		if !ok || ev.Type == watch.Error {
			lw.stop()
		}
		lw.client.remember(nil)
		return leaseCopy{}, nil
	}
}

// sleep waits, unwatched, until deadline or the end of ctx (its error).
func (lw *leaseWatch) sleep(ctx context.Context, deadline time.Time) error {
	lw.stop()
	clk := lw.client.cfg.Clock
	timer := clk.NewTimer(max(deadline.Sub(clk.Now()), time.Millisecond))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C():
		return nil
	}
}

// watchLease watches the Lease name from resourceVersion ("" for its
// current state), every change of it, or only while it matches the label
// selector (when not "").
func (c *Client) watchLease(ctx context.Context, name, resourceVersion, labelSelector string) (watch.Interface, error) {
	return c.leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		LabelSelector:   labelSelector,
		ResourceVersion: resourceVersion,
	})
}

func (lw *leaseWatch) stop() {
	if lw.w != nil {
		lw.w.Stop()
		lw.w = nil
	}
}
