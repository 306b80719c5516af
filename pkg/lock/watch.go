package lock

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// watchRetryDelay is how long a waiter backs off when it cannot open a
// watch, before reading the Lease again.
const watchRetryDelay = time.Second

// leaseWatch is the one watch an Acquire call keeps on its Lease. It is
// opened at the first wait and reopened only when the server ends it.
type leaseWatch struct {
	client *Client
	name   string
	w      watch.Interface
}

// next waits for the Lease's next change, the hint's deadline, or the end of
// ctx, and returns the copy of the Lease to judge next (an empty candidate
// means: read it afresh).
func (lw *leaseWatch) next(ctx context.Context, hint waitHint) (candidate, error) {
	clk := lw.client.cfg.Clock
	timer := clk.NewTimer(max(hint.deadline.Sub(clk.Now()), time.Millisecond))
	defer timer.Stop()
	if lw.w == nil {
		w, err := lw.client.watchLease(ctx, lw.name, hint.resourceVersion)
		if err != nil {
			// No watch (the resourceVersion may be too old, or watching is
			// not allowed): back off, then read afresh.
			backoff := clk.NewTimer(watchRetryDelay)
			defer backoff.Stop()
			select {
			case <-ctx.Done():
				return candidate{}, ctx.Err()
			case <-timer.C():
			case <-backoff.C():
			}
			return candidate{}, nil
		}
		lw.w = w
	}
	select {
	case <-ctx.Done():
		return candidate{}, ctx.Err()
	case <-timer.C():
		// Nothing changed until the deadline: judge the same copy again,
		// now past its observed expiry.
		return hint.judged, nil
	case ev, ok := <-lw.w.ResultChan():
		if l, isLease := ev.Object.(*coordinationv1.Lease); ok && isLease && (ev.Type == watch.Added || ev.Type == watch.Modified) {
			lw.client.remember(l)
			return candidate{lease: l, fromWatch: true, verified: true}, nil
		}
		if !ok || ev.Type == watch.Error {
			lw.stop()
		}
		lw.client.remember(nil)
		return candidate{}, nil
	}
}

// watchLease watches the Lease name from resourceVersion ("" for its
// current state).
func (c *Client) watchLease(ctx context.Context, name, resourceVersion string) (watch.Interface, error) {
	return c.leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: resourceVersion,
	})
}

func (lw *leaseWatch) stop() {
	if lw.w != nil {
		lw.w.Stop()
		lw.w = nil
	}
}
