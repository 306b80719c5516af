package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
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

	mu           sync.Mutex
	lease        *coordinationv1.Lease
	validUntil   time.Time
	expiry       clock.Timer
	lastRenewErr error
	lostErr      error
	stopOnce     sync.Once
	lostOnce     sync.Once
}

// safetyMargin is how long before the lease could lapse for others a grant
// stops counting as held: Config.SafetyMargin, or 2% of the lease duration
// plus 100ms.
func (c *Client) safetyMargin(info lockInfo) time.Duration {
	if c.cfg.SafetyMargin > 0 {
		return c.cfg.SafetyMargin
	}
	return info.duration/50 + 100*time.Millisecond
}

// safeUntil is how long a write that started at start keeps the lock: the
// others' expiry clock starts no earlier than the write, so the lease
// duration from start, minus the safety margin.
func (c *Client) safeUntil(info lockInfo, start time.Time) time.Time {
	return start.Add(info.duration - c.safetyMargin(info))
}

func newGrant(c *Client, info lockInfo, granted *coordinationv1.Lease, requestStart time.Time) *Grant {
	interval := c.cfg.RenewInterval
	if interval <= 0 {
		interval = info.duration / 3
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	renewCtx, stopRenewal := context.WithCancel(context.Background())
	g := &Grant{
		client:      c,
		info:        info,
		token:       int64(ptr.Deref(granted.Spec.LeaseTransitions, 0)),
		interval:    interval,
		ctx:         ctx,
		cancel:      cancel,
		renewCtx:    renewCtx,
		stopRenewal: stopRenewal,
		lost:        make(chan struct{}),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
		lease:       granted,
	}
	g.mu.Lock()
	g.validUntil = c.safeUntil(info, requestStart)
	g.armExpiry()
	g.mu.Unlock()
	go g.renewLoop()
	return g
}

// Token is the grant's fencing token: pass it with every write to a
// protected resource.
func (g *Grant) Token() int64 { return g.token }

// Holder is the identity the lock is held as.
func (g *Grant) Holder() string { return g.client.cfg.Identity }

// Lock is namespace/name of the lock.
func (g *Grant) Lock() string { return g.client.LockName() }

// Context is cancelled the moment the holder can no longer be sure it holds
// the lock: before the lease could have lapsed for anyone else (with a
// safety margin), when the grant is found taken over or broken, and on
// Release. context.Cause tells which.
func (g *Grant) Context() context.Context { return g.ctx }

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

// renewLoop renews every interval until stopped or lost. Expiry is not
// judged here but by a timer of its own (armExpiry), which keeps running
// while a renewal is in flight, so a slow renewal cannot delay the loss.
func (g *Grant) renewLoop() {
	defer close(g.done)
	ticker := g.client.cfg.Clock.NewTicker(g.interval)
	defer ticker.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-g.lost:
			return
		case <-ticker.C():
			if err := g.renewOnce(); errors.Is(err, ErrLost) {
				g.lose(err)
				return
			} else if err != nil {
				g.mu.Lock()
				g.lastRenewErr = err
				g.mu.Unlock()
			}
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
		g.lose(fmt.Errorf("%w: lock %s not renewed within its lease (last error: %v)", ErrLost, g.Lock(), lastErr))
	})
}

// renewOnce moves renewTime forward with a compare-and-swap. A conflict is
// re-read: if the Lease is still this grant's, the renewal is retried once;
// otherwise the grant is lost.
func (g *Grant) renewOnce() error {
	clk := g.client.cfg.Clock
	ctx, cancel := context.WithTimeout(g.renewCtx, max(g.ValidUntil().Sub(clk.Now()), time.Millisecond))
	defer cancel()
	g.mu.Lock()
	current := g.lease
	g.mu.Unlock()
	for range 2 {
		start := clk.Now()
		l := current.DeepCopy()
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(start))
		l.Spec.LeaseDurationSeconds = ptr.To(int32(g.info.duration / time.Second))
		updated, err := g.client.leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil && updated.DeletionTimestamp != nil {
			// The Lease is being deleted: stop renewing, so the controller
			// sees this grant lapse and can let the Lease go.
			g.client.remember(updated)
			return fmt.Errorf("%w: lease %s/%s is being deleted", ErrLost, g.client.cfg.Namespace, g.info.leaseName)
		}
		if err == nil {
			g.mu.Lock()
			select {
			case <-g.lost: // too late: the grant already expired
			default:
				g.lease, g.validUntil = updated, g.client.safeUntil(g.info, start)
				g.armExpiry()
			}
			g.mu.Unlock()
			g.client.remember(updated)
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("renewing lease %s/%s: %w", g.client.cfg.Namespace, g.info.leaseName, err)
		}
		if current, err = g.reread(ctx); err != nil {
			return err
		}
	}
	return fmt.Errorf("renewing lease %s/%s: lost two compare-and-swap races", g.client.cfg.Namespace, g.info.leaseName)
}

// reread fetches the Lease and returns it if this grant still holds it, or
// an ErrLost error saying who has it now.
func (g *Grant) reread(ctx context.Context) (*coordinationv1.Lease, error) {
	fresh, err := g.client.leases.Get(ctx, g.info.leaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: lease %s/%s was deleted", ErrLost, g.client.cfg.Namespace, g.info.leaseName)
	}
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", g.client.cfg.Namespace, g.info.leaseName, err)
	}
	g.client.remember(fresh)
	if fresh.DeletionTimestamp != nil {
		return nil, fmt.Errorf("%w: lease %s/%s is being deleted", ErrLost, g.client.cfg.Namespace, g.info.leaseName)
	}
	if !g.owns(fresh) {
		holder := ptr.Deref(fresh.Spec.HolderIdentity, "")
		if holder == "" {
			holder = "nobody"
		}
		return nil, fmt.Errorf("%w: lock %s is now held by %s with fencing token %d (ours was %d)",
			ErrLost, g.Lock(), holder, ptr.Deref(fresh.Spec.LeaseTransitions, 0), g.token)
	}
	return fresh, nil
}

// owns reports whether l is still this grant: same holder, same token, not
// being deleted.
func (g *Grant) owns(l *coordinationv1.Lease) bool {
	return l.DeletionTimestamp == nil && ptr.Deref(l.Spec.HolderIdentity, "") == g.Holder() &&
		int64(ptr.Deref(l.Spec.LeaseTransitions, 0)) == g.token
}

func (g *Grant) lose(err error) {
	g.lostOnce.Do(func() {
		g.mu.Lock()
		g.lostErr = err
		if g.expiry != nil {
			g.expiry.Stop()
		}
		g.mu.Unlock()
		g.cancel(err)
		close(g.lost)
	})
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

// Release gives the lock up if this grant still holds it: a compare-and-swap
// that clears the holder only on the Lease version this grant owns (the
// Kubernetes form of compare-value-then-delete). Releasing a grant that was
// lost changes nothing and returns ErrNotHolder with who holds it now.
func (g *Grant) Release(ctx context.Context) error {
	// The holder stops believing it holds the lock at once, before anything
	// that can wait on the network.
	g.cancel(ErrReleased)
	g.stopRenewing()
	g.mu.Lock()
	if g.expiry != nil {
		g.expiry.Stop()
	}
	g.mu.Unlock()
	if err := g.Err(); err != nil {
		return fmt.Errorf("%w: nothing released: %w", ErrNotHolder, err)
	}
	g.mu.Lock()
	current := g.lease
	g.mu.Unlock()
	for range maxCASAttempts {
		l := current.DeepCopy()
		l.Spec.HolderIdentity = nil
		l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
		updated, err := g.client.leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			g.client.remember(updated)
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("releasing lease %s/%s: %w", g.client.cfg.Namespace, g.info.leaseName, err)
		}
		if current, err = g.reread(ctx); err != nil {
			return fmt.Errorf("%w: nothing released: %w", ErrNotHolder, err)
		}
	}
	return fmt.Errorf("releasing lease %s/%s: lost %d compare-and-swap races", g.client.cfg.Namespace, g.info.leaseName, maxCASAttempts)
}
