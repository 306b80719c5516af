package lock

import (
	"context"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
)

// follow watches the grant's Lease while the grant lasts. Waiters write the
// Lease too (they register in its queue), so the copy the grant last wrote
// goes stale; the watch keeps the newest version that still records this
// grant (freshest), so that a renewal or the release is a single
// compare-and-swap instead of a conflict, a read and a retry. A version
// that no longer records the grant (taken over, broken, deleted, retired)
// makes the heartbeat renew at once, which finds out and ends the grant:
// sooner than the next renewal would, never later. The watch is only a
// shortcut: every write is still a compare-and-swap, and expiry is still
// the grant's own timer.
func (g *Grant) follow(fromVersion string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-g.stop:
		case <-g.lost:
		}
		cancel()
	}()
	clk := g.client.cfg.Clock
	// A grant released within followDelay never opens the watch: short
	// critical sections cost the apiserver nothing more. The watch starts
	// from the grant's own version, so it still brings every change made
	// since.
	select {
	case <-ctx.Done():
		return
	case <-clk.After(followDelay):
	}
	version := fromVersion
	for ctx.Err() == nil {
		opened := clk.Now()
		w, err := g.client.watchLease(ctx, g.info.leaseName, version, "")
		if err == nil {
			version = g.drain(ctx, w, version)
			w.Stop()
		} else if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
			version = "" // too old: start from the current version
		}
		// A watch that could not open, or ended within a second (an
		// error event, a proxy cutting idle connections), is reopened
		// after a pause, never in a tight loop.
		if clk.Since(opened) < time.Second {
			select {
			case <-ctx.Done():
			case <-clk.After(watchRetryDelay):
			}
		}
	}
}

// followDelay is how long a grant lasts before it starts following its
// Lease.
const followDelay = 50 * time.Millisecond

// drain takes the watch's events until it ends or ctx does, and returns the
// resourceVersion to resume from ("" after an error event, which may mean
// that version is too old).
func (g *Grant) drain(ctx context.Context, w watch.Interface, version string) string {
	for {
		select {
		case <-ctx.Done():
			return version
		case ev, ok := <-w.ResultChan():
			if !ok {
				return version
			}
			if ev.Type == watch.Error {
				return ""
			}
			l, isLease := ev.Object.(*coordinationv1.Lease)
			if !isLease {
				continue
			}
			version = l.ResourceVersion
			g.mu.Lock()
			own := g.lease
			if ev.Type != watch.Deleted && g.owns(l) && g.stillServing(l) == nil {
				if newerVersion(l, g.latest) {
					g.latest = l
				}
				g.mu.Unlock()
				continue
			}
			g.mu.Unlock()
			// A version older than the grant's own last write (a watch
			// reopened from the current state may start with one) says
			// nothing new; any other that does not record the grant is
			// checked by a renewal at once.
			if ev.Type == watch.Deleted || !newerVersion(own, l) {
				g.renewNow()
			}
		}
	}
}

// renewNow asks the heartbeat for a renewal at once.
func (g *Grant) renewNow() {
	select {
	case g.poke <- struct{}{}:
	default:
	}
}

// freshest is the newest copy of the Lease known to record this grant: the
// grant's own last write, or a later version the watch brought. Callers
// hold g.mu.
func (g *Grant) freshest() *coordinationv1.Lease {
	if newerVersion(g.latest, g.lease) {
		return g.latest
	}
	return g.lease
}

// newerVersion reports whether a is a later version of the Lease than b.
// resourceVersions are etcd revisions; should one not parse as a number,
// a is not taken as newer (the grant's own copy is used, and a stale copy
// only costs a conflict: every write is a compare-and-swap).
func newerVersion(a, b *coordinationv1.Lease) bool {
	if a == nil {
		return false
	}
	if b == nil {
		return true
	}
	av, errA := strconv.ParseUint(a.ResourceVersion, 10, 64)
	bv, errB := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return errA == nil && errB == nil && av > bv
}
