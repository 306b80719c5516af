package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Grant is one holding of the lock, with its fencing token. A background
// heartbeat renews it until Release, or until it is lost.
type Grant struct {
	client   *Client
	info     lockInfo
	token    int64
	interval time.Duration

	ctx    context.Context
	cancel context.CancelCauseFunc
	// renewCtx is the parent of every renewal; stopRenewal cancels it, and
	// with it a renewal in flight, when renewing stops.
	renewCtx    context.Context
	stopRenewal context.CancelFunc
	lost        chan struct{}
	stop        chan struct{}
	done        chan struct{}
	// poke asks the heartbeat to renew at once (follow saw the Lease no
	// longer record this grant).
	poke chan struct{}

	log     logr.Logger
	started time.Time // when the grant began, on the local clock

	mu sync.Mutex
	// lease is the Lease as this grant last wrote it; latest the newest
	// version the watch brought that still records it (see freshest).
	lease        *coordinationv1.Lease
	latest       *coordinationv1.Lease
	validUntil   time.Time
	expiry       clock.Timer
	lastRenewErr error
	lostErr      error
	// released: a Release landed; a later one has nothing to do.
	released bool
	onLost   []func(error)
	stopOnce sync.Once
	lostOnce sync.Once
	endOnce  sync.Once
}

// newGrant starts the grant a: held until a.validUntil unless renewed,
// renewed first after a.firstRenewal, then every renew interval.
func newGrant(c *Client, log logr.Logger, a *acquired) *Grant {
	info, granted, validUntil, firstRenewal := a.info, a.lease, a.validUntil, a.firstRenewal
	interval := c.renewInterval(info)
	ctx, cancel := context.WithCancelCause(context.Background())
	renewCtx, stopRenewal := context.WithCancel(context.Background())
	g := &Grant{
		client:      c,
		info:        info,
		token:       lease.Token(granted),
		interval:    interval,
		ctx:         ctx,
		cancel:      cancel,
		renewCtx:    renewCtx,
		stopRenewal: stopRenewal,
		lost:        make(chan struct{}),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
		poke:        make(chan struct{}, 1),
		lease:       granted,
		started:     c.cfg.Clock.Now(),
	}
	g.log = log.WithValues("lock", c.LockName(), "holder", c.cfg.Identity, "token", g.token)
	g.log.V(1).Info("acquired the lock", "safeFor", validUntil.Sub(g.started).Round(time.Millisecond))
	g.mu.Lock()
	g.validUntil = validUntil
	g.armExpiry()
	g.mu.Unlock()
	go g.renewLoop(firstRenewal)
	go g.follow(granted.ResourceVersion)
	return g
}

// Token is the grant's fencing token: pass it with every write to a
// protected resource.
func (g *Grant) Token() int64 { return g.token }

// Holder is the identity the lock is held as.
func (g *Grant) Holder() string { return g.client.cfg.Identity }

// Lock is namespace/name of the lock.
func (g *Grant) Lock() string { return g.client.LockName() }

// FencingKey is the key to fence this grant's writes on, with Token:
// "<namespace>/<name>" of the lock (fencing.LockKey), the same for every
// grant of the lock and different for every other lock, those of the same
// name in other namespaces included.
//
//	err := guard.Fence(ctx, g.FencingKey(), g.Token(), write)
func (g *Grant) FencingKey() string {
	return fencing.LockKey(g.client.cfg.Namespace, g.client.cfg.Name)
}

// Context is cancelled the moment the holder can no longer be sure it holds
// the lock: before the lease could have lapsed for anyone else (with a
// safety margin), when the grant is found taken over or broken, and on
// Release. context.Cause tells which. Its Deadline is the end of the safe
// window as of this call (ValidUntil), so I/O bounded by it cannot outlast
// what is known to be safe; renewals push the window on, and Context called
// again reports the new one, while the returned context itself stays valid
// until the grant ends.
func (g *Grant) Context() context.Context {
	return windowContext{Context: g.ctx, deadline: g.ValidUntil()}
}

// windowContext is the grant's context with the safe window it knew when
// it was handed out as its deadline.
type windowContext struct {
	context.Context
	deadline time.Time
}

// Deadline implements context.Context.
func (c windowContext) Deadline() (time.Time, bool) { return c.deadline, true }

// OnLost runs f (in a goroutine of its own) when the grant ends without
// Release, with the reason (also Err); at once if it already has. It is the
// callback form of Lost.
func (g *Grant) OnLost(f func(error)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lostErr != nil {
		go f(g.lostErr)
		return
	}
	g.onLost = append(g.onLost, f)
}

// Lost is closed when the grant ends without Release.
func (g *Grant) Lost() <-chan struct{} { return g.lost }

// Err is why the grant was lost, or nil.
func (g *Grant) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lostErr
}

// ValidUntil is the local monotonic-clock time until which the grant is
// certainly still held.
func (g *Grant) ValidUntil() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.validUntil
}

// renewLoop renews every interval until stopped or lost. A renewal that
// fails is retried sooner, with backoff, while the safe window lasts: a
// transient error or two must not cost a healthy grant. Expiry is not judged
// here but by a timer of its own (armExpiry), which keeps running while a
// renewal is in flight, so a slow renewal cannot delay the loss.
func (g *Grant) renewLoop(first time.Duration) {
	defer close(g.done)
	timer := g.client.cfg.Clock.NewTimer(first)
	defer timer.Stop()
	failures, retries := 0, renewBackoff(g.interval)
	for {
		select {
		case <-g.stop:
			return
		case <-g.lost:
			return
		case <-timer.C():
		case <-g.poke:
		}
		err := g.renewOnce()
		switch {
		case errors.Is(err, ErrLost):
			g.lose(err)
			return
		case err != nil:
			failures++
			g.mu.Lock()
			g.lastRenewErr = err
			left := g.validUntil.Sub(g.client.cfg.Clock.Now())
			g.mu.Unlock()
			retry := renewRetryDelay(&retries)
			g.client.cfg.Metrics.renewed(g.client.cfg.Namespace, g.client.cfg.Name, err)
			g.log.Error(err, "renewal failed; retrying within the safe window", "failures", failures,
				"retryIn", retry, "safeFor", left.Round(time.Millisecond))
			timer.Reset(retry)
		default:
			if failures > 0 {
				g.log.Info("renewed again after failures", "failures", failures)
			}
			failures, retries = 0, renewBackoff(g.interval)
			g.client.cfg.Metrics.renewed(g.client.cfg.Namespace, g.client.cfg.Name, nil)
			timer.Reset(g.interval)
		}
	}
}

// armExpiry (re)starts the timer that declares the grant lost at
// validUntil. Callers hold g.mu.
func (g *Grant) armExpiry() {
	if g.expiry != nil {
		g.expiry.Stop()
	}
	clk := g.client.cfg.Clock
	g.expiry = clk.AfterFunc(max(g.validUntil.Sub(clk.Now()), 0), func() {
		g.mu.Lock()
		lastErr := g.lastRenewErr
		g.mu.Unlock()
		g.lose(lostBecause("expired", "%w: lock %s not renewed within its lease (last error: %v)", ErrLost, g.Lock(), lastErr))
		go g.releaseLapsed()
	})
}

// renewOnce moves renewTime forward with a compare-and-swap. A conflict is
// re-read: if the Lease is still this grant's (waiters registering in the
// queue write it too), the renewal is retried, up to maxWriteAttempts
// times, within the safe window; otherwise the grant is lost. So is a grant
// whose Lease the lock no longer controls (the lock was deleted, or deleted
// and created again) or whose Lease is being deleted: the holder stops
// renewing, so the controller sees the grant lapse and can retire or
// recreate the Lease.
func (g *Grant) renewOnce() error {
	clk := g.client.cfg.Clock
	ctx, cancel := context.WithTimeout(g.renewCtx, max(g.ValidUntil().Sub(clk.Now()), time.Millisecond))
	defer cancel()
	g.mu.Lock()
	current := g.freshest()
	g.mu.Unlock()
	for range maxWriteAttempts {
		start := clk.Now()
		updated, err := g.client.writeLease(ctx, current, lease.RenewPatch(current, start), false)
		if err == nil {
			if lostErr := g.stillServing(updated); lostErr != nil {
				return lostErr
			}
			g.mu.Lock()
			select {
			case <-g.lost: // too late: the grant already expired
			default:
				g.lease, g.validUntil = updated, g.client.safeUntil(g.info, start)
				g.armExpiry()
			}
			g.mu.Unlock()
			return nil
		}
		switch {
		case apierrors.IsForbidden(err):
			// The lease-guard policy refuses a renewal of a grant the
			// controller marked lapsed, or one that is not this client's.
			return lostBecause("refused", "%w: the apiserver refused the renewal of lock %s: %w", ErrLost, g.Lock(), err)
		case !lostRace(err) && !apierrors.IsNotFound(err):
			return fmt.Errorf("renewing lease %s/%s: %w", g.client.cfg.Namespace, g.info.leaseName, err)
		}
		if current, err = g.reread(ctx); err != nil {
			return err
		}
		if err := g.stillServing(current); err != nil {
			return err
		}
	}
	return fmt.Errorf("renewing lease %s/%s: the Lease changed under %d renewals in a row", g.client.cfg.Namespace, g.info.leaseName, maxWriteAttempts)
}

// stillServing is nil while l, this grant's own Lease, still serves the
// lock: not being deleted and controlled by the lock this grant came from.
func (g *Grant) stillServing(l *coordinationv1.Lease) error {
	switch {
	case l.DeletionTimestamp != nil:
		return lostBecause("lease_deleted", "%w: lease %s/%s is being deleted", ErrLost, g.client.cfg.Namespace, g.info.leaseName)
	case !controlledBy(l, g.info.uid):
		return lostBecause("lock_deleted", "%w: lock %s was deleted (or deleted and created again): its Lease %s is no longer this lock's",
			ErrLost, g.Lock(), g.info.leaseName)
	}
	return nil
}

// reread fetches the Lease and returns it if this grant still holds it, or
// an ErrLost error saying who has it now. It reads through the grant
// path's own client, with no client-side rate limiter: a renewal or a
// release that lost a race never waits behind this process's other reads.
func (g *Grant) reread(ctx context.Context) (*coordinationv1.Lease, error) {
	fresh, err := g.client.writes.Get(ctx, g.info.leaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, lostBecause("lease_deleted", "%w: lease %s/%s was deleted", ErrLost, g.client.cfg.Namespace, g.info.leaseName)
	}
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", g.client.cfg.Namespace, g.info.leaseName, err)
	}
	g.client.remember(fresh)
	if !g.owns(fresh) {
		holder := lease.Holder(fresh)
		if holder == "" {
			holder = "nobody"
		}
		return nil, lostBecause("taken_over", "%w: lock %s is now held by %s with fencing token %d (ours was %d)",
			ErrLost, g.Lock(), holder, lease.Token(fresh), g.token)
	}
	return fresh, nil
}

// owns reports whether l still records this grant: same holder, same token.
func (g *Grant) owns(l *coordinationv1.Lease) bool {
	return lease.Holder(l) == g.Holder() && lease.Token(l) == g.token
}

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

// releaseLapsed runs after the grant was lost because its safe window ended
// without a renewal: if the server still shows this very grant (renewals
// failed, or landed but their answers came too late), it clears it, so the
// others need not wait out a lease nobody uses. It first waits the safety
// margin, the time the holder has between its Context ending and the
// earliest moment anyone else could take over had nothing been released:
// releasing at once would let the next holder start while this one may still
// be finishing what its Context told it to stop. The Update is a
// compare-and-swap on a fresh read that still shows this grant, so it can
// never clear anyone else's. It gives up after one lease duration.
func (g *Grant) releaseLapsed() {
	g.stopRenewing()
	clk := g.client.cfg.Clock
	<-clk.After(g.client.safetyMargin(g.info))
	ctx, cancel := context.WithTimeout(context.Background(), g.info.duration)
	defer cancel()
	retries := renewBackoff(g.interval)
	for ctx.Err() == nil {
		fresh, err := g.client.leases.Get(ctx, g.info.leaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if err == nil {
			g.client.remember(fresh)
			if !g.owns(fresh) {
				return
			}
			if _, err := g.client.writeLease(ctx, fresh, g.client.releasePatch(fresh, g.info), false); err == nil || !lostRace(err) {
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-clk.After(renewRetryDelay(&retries)):
		}
	}
}

func (g *Grant) lose(err error) {
	g.lostOnce.Do(func() {
		g.mu.Lock()
		g.lostErr = err
		if g.expiry != nil {
			g.expiry.Stop()
		}
		hooks := g.onLost
		g.onLost = nil
		g.mu.Unlock()
		g.cancel(err)
		close(g.lost)
		g.log.Error(err, "lost the lock")
		g.ended(lossReason(err))
		for _, f := range hooks {
			go f(err)
		}
	})
}

// ended counts the end of the grant, once.
func (g *Grant) ended(lostReason string) {
	g.endOnce.Do(func() {
		g.client.cfg.Metrics.ended(g.client.cfg.Namespace, g.client.cfg.Name, g.client.cfg.Clock.Since(g.started), lostReason)
	})
}

// lossError is an ErrLost error with the reason the metrics count it by.
type lossError struct {
	reason string
	err    error
}

func (e *lossError) Error() string { return e.err.Error() }

func (e *lossError) Unwrap() error { return e.err }

// lostBecause is an error for a grant lost for reason (a metric label).
func lostBecause(reason, format string, args ...any) error {
	return &lossError{reason: reason, err: fmt.Errorf(format, args...)}
}

// lossReason is the metric label of a loss.
func lossReason(err error) string {
	var le *lossError
	if errors.As(err, &le) {
		return le.reason
	}
	return "other"
}

// stopRenewing ends the heartbeat, cancelling a renewal in flight, and
// waits for it.
func (g *Grant) stopRenewing() {
	g.stopOnce.Do(func() {
		close(g.stop)
		g.stopRenewal()
	})
	<-g.done
}

// Release gives the lock up if this grant still holds it: a patch that
// clears the holder only while the Lease records this grant (holder and
// token; the Kubernetes form of compare-value-then-delete), handing the lock
// to the head of the queue in the same write. Releasing a grant that was
// lost changes nothing and returns ErrNotHolder with why it was lost;
// releasing it again after a Release that landed changes nothing and
// returns ErrNotHolder saying so.
func (g *Grant) Release(ctx context.Context) error {
	// The holder stops believing it holds the lock at once, before anything
	// that can wait on the network.
	g.cancel(ErrReleased)
	g.stopRenewing()
	defer g.ended("")
	g.mu.Lock()
	if g.expiry != nil {
		g.expiry.Stop()
	}
	g.mu.Unlock()
	if err := g.Err(); err != nil {
		return fmt.Errorf("%w: nothing released: %w", ErrNotHolder, err)
	}
	g.mu.Lock()
	current, released := g.freshest(), g.released
	g.mu.Unlock()
	if released {
		return fmt.Errorf("%w: this grant (fencing token %d) was released already; nothing released", ErrNotHolder, g.token)
	}
	for attempt := range maxWriteAttempts {
		updated, err := g.client.writeLease(ctx, current, g.client.releasePatch(current, g.info), attempt == 0)
		if err == nil {
			g.mu.Lock()
			g.released = true
			g.mu.Unlock()
			g.log.V(1).Info("released the lock", "handedTo", lease.Holder(updated))
			return nil
		}
		if !lostRace(err) && !apierrors.IsNotFound(err) {
			g.client.leaveBehind(leftoverOfGrant(current))
			return fmt.Errorf("releasing lease %s/%s: %w", g.client.cfg.Namespace, g.info.leaseName, refusal(err))
		}
		fresh, err := g.reread(ctx)
		if err != nil {
			if !errors.Is(err, ErrLost) {
				g.client.leaveBehind(leftoverOfGrant(current))
			}
			return fmt.Errorf("%w: nothing released: %w", ErrNotHolder, err)
		}
		current = fresh
	}
	g.client.leaveBehind(leftoverOfGrant(current))
	return fmt.Errorf("releasing lease %s/%s: the Lease changed under %d releases in a row", g.client.cfg.Namespace, g.info.leaseName, maxWriteAttempts)
}

// releasePatch gives up current's grant, held by this client: handed to the
// head of the queue in the same write, or simply released when nobody is
// queued, or when the Lease is being deleted or no longer serves the lock
// (retired): nobody could take a hand-off up there. An exact release lands
// only on current's very version, so the hand-off goes to the head of the
// queue as it is when the release lands; a release that is not exact lands
// whatever the queue did since current (a waiter whose registration it did
// not see finds the lock free, and takes it at its turn). Releases try
// exact first (writeLease), and once the Lease changed, read it again and
// go on not exact: a crowd registering cannot keep a release from landing.
func (c *Client) releasePatch(current *coordinationv1.Lease, info lockInfo) *lease.Patch {
	if current.DeletionTimestamp == nil && controlledBy(current, info.uid) {
		if handed, _, ok, err := lease.HandOffPatch(current, c.cfg.Identity, info.duration, c.cfg.Clock.Now()); err == nil && ok {
			return handed
		}
	}
	return lease.ReleasePatch(current)
}
