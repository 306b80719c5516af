// Package lock is the frontdesk client library: acquire, renew and release a
// DistributedLock by compare-and-swap writes on its Lease, and get the
// fencing token of each grant to pass to the resources you write.
//
//	c, _ := lock.New(restConfig, lock.Config{Namespace: "default", Name: "billing"})
//	g, err := c.Acquire(ctx)          // blocks; ctx deadline = try-lock with timeout
//	defer g.Release(context.Background())
//	doWork(g.Context(), g.Token())    // g.Context() ends before the lease could lapse
package lock

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// Config names a lock and tunes the client.
type Config struct {
	// Namespace of the DistributedLock.
	Namespace string
	// Name of the DistributedLock.
	Name string
	// Identity this client holds the lock as. Default: DefaultIdentity(),
	// unique per process incarnation.
	Identity string
	// RenewInterval is how often a grant is renewed. Default: a third of
	// the lease duration.
	RenewInterval time.Duration
	// SafetyMargin is how long before the lease could lapse for others a
	// grant's Context is cancelled, to cover clock-rate drift and scheduling
	// delay. Default: 2% of the lease duration plus 100ms.
	SafetyMargin time.Duration
	// Clock is the client's clock. Default: the real one (monotonic).
	Clock clock.WithTickerAndDelayedExecution
	// Priority orders this client in the lock's queue of waiters: higher
	// first, first come first served within a priority. Default 0.
	Priority int32
	// Logger receives what the client does: grants, renewal failures (as
	// they happen, each retried within the safe window), losses, releases.
	// Default: the logger in the context passed to Acquire or TryAcquire
	// (logr.FromContext), else none.
	Logger logr.Logger
	// Metrics, when set, count acquires, renewals, failures, losses and
	// time held (NewMetrics; names in docs/metrics.md).
	Metrics *Metrics
}

// Client acquires one DistributedLock. It is safe for concurrent use, but a
// Client holds at most one grant at a time by design: use one Client per
// holder.
type Client struct {
	cfg Config
	// leases reads, watches and registers in the queue; writes sends the
	// writes of the grant path (grant, renew, release, hand-off, leaving),
	// unthrottled by a client-side rate limiter (see New).
	leases   coordinationclient.LeaseInterface
	writes   coordinationclient.LeaseInterface
	locks    dynamic.ResourceInterface
	reviews  authenticationclient.SelfSubjectReviewInterface
	observer *lease.Observer
	// left is what this client may have left on the Lease: grants and
	// places it could not end (see leftover).
	left leftovers

	mu   sync.Mutex
	info *lockInfo
	// reads numbers the reads of the lock as they are sent; infoSeq is the
	// number of the read info came from.
	reads, infoSeq uint64
	last           *coordinationv1.Lease
	// principal is who this client is to the lease-guard policy, once
	// asked (see selfPrincipal).
	principal string
	// highest is the highest fencing token this client has seen on the
	// Leases of this lock name, across deletions and re-creations of the
	// lock: tokens for a name never go back, and this is the client's own
	// guard should a record be lost.
	highest int64
}

// lockInfo is what a client needs from the DistributedLock itself.
type lockInfo struct {
	uid       types.UID
	leaseName string
	duration  time.Duration
	// recorded is the lock's status.fencingToken when it was read: no
	// grant may carry a token at or below it, except the grant recorded
	// there itself (recordedHolder, recordedAcquire).
	recorded        int64
	recordedHolder  string
	recordedAcquire time.Time
	// deleting: the lock was being deleted when it was read.
	deleting bool
}

// grantedOn is info for a grant recorded on l: judged by the lease duration
// l carries, as everyone else judges it.
func (info lockInfo) grantedOn(l *coordinationv1.Lease) lockInfo {
	info.duration = lease.RecordOf(l).Duration(info.duration)
	return info
}

// records reports whether the lock's status, as read, records the grant on
// l: the same holder, token and acquire time.
func (info lockInfo) records(l *coordinationv1.Lease) bool {
	rec := lease.RecordOf(l)
	return info.recorded == lease.Token(l) && info.recordedHolder == rec.Holder && info.recordedAcquire.Equal(rec.AcquireTime)
}

// GroupVersionResource of DistributedLocks.
var distributedLocks = locksv1alpha1.GroupVersion.WithResource("distributedlocks")

// New returns a client for the lock named in cfg. Leases are read, written
// and watched in protobuf, the apiserver's cheapest encoding (the waiters at
// the front of the queue decode every change of the Lease while they wait);
// the DistributedLock, a custom resource, in JSON. The writes of the grant
// path (grant, renew, release, hand-off) go through a client of their own,
// with no client-side rate limiter and a connection of its own: a renewal or
// a release never waits behind this process's other requests (restConfig's
// QPS and Burst still pace the reads and watches).
func New(restConfig *rest.Config, cfg Config) (*Client, error) {
	cs, err := kubernetes.NewForConfig(ProtobufConfig(restConfig))
	if err != nil {
		return nil, fmt.Errorf("creating kubernetes client: %w", err)
	}
	writes, err := kubernetes.NewForConfig(unthrottled(ProtobufConfig(restConfig)))
	if err != nil {
		return nil, fmt.Errorf("creating kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	c, err := NewForClients(cs, dyn, cfg)
	if err != nil {
		return nil, err
	}
	c.writes = writes.CoordinationV1().Leases(cfg.Namespace)
	return c, nil
}

// unthrottled is restConfig without a client-side rate limiter, and with a
// connection of its own: a dialer of its own keeps client-go from sharing
// the HTTP/2 connection of the reads and watches, so a write never waits
// for a free stream behind them.
func unthrottled(restConfig *rest.Config) *rest.Config {
	c := rest.CopyConfig(restConfig)
	c.RateLimiter, c.QPS = nil, -1
	if c.Dial == nil {
		c.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return c
}

// ProtobufConfig is a copy of restConfig that speaks protobuf to the
// apiserver, for the built-in types (Leases), falling back to JSON.
func ProtobufConfig(restConfig *rest.Config) *rest.Config {
	c := rest.CopyConfig(restConfig)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return c
}

// NewForClients is New with clients the caller already has; cs carries all
// of the client's Lease traffic, its writes included, so it should not be
// throttled by a client-side rate limiter that other requests share.
func NewForClients(cs kubernetes.Interface, dyn dynamic.Interface, cfg Config) (*Client, error) {
	if cfg.Namespace == "" || cfg.Name == "" {
		return nil, fmt.Errorf("lock config: namespace and name are required (got %q/%q)", cfg.Namespace, cfg.Name)
	}
	if cfg.Identity == "" {
		cfg.Identity = DefaultIdentity()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Client{
		cfg:      cfg,
		leases:   cs.CoordinationV1().Leases(cfg.Namespace),
		writes:   cs.CoordinationV1().Leases(cfg.Namespace),
		reviews:  cs.AuthenticationV1().SelfSubjectReviews(),
		locks:    dyn.Resource(distributedLocks).Namespace(cfg.Namespace),
		observer: lease.NewObserver(),
	}, nil
}

// logger is the configured logger, else the context's.
func (c *Client) logger(ctx context.Context) logr.Logger {
	if c.cfg.Logger.GetSink() != nil {
		return c.cfg.Logger
	}
	return logr.FromContextOrDiscard(ctx)
}

// Identity is who this client holds the lock as.
func (c *Client) Identity() string { return c.cfg.Identity }

// Namespace is the lock's namespace.
func (c *Client) Namespace() string { return c.cfg.Namespace }

// Name is the lock's name.
func (c *Client) Name() string { return c.cfg.Name }

// LockName is namespace/name of the lock.
func (c *Client) LockName() string { return c.cfg.Namespace + "/" + c.cfg.Name }

// GetLock reads the DistributedLock.
func (c *Client) GetLock(ctx context.Context) (*locksv1alpha1.DistributedLock, error) {
	u, err := c.locks.Get(ctx, c.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %s (create it with kubectl apply)", ErrLockNotFound, c.LockName())
	}
	if err != nil {
		return nil, fmt.Errorf("reading distributedlock %s: %w", c.LockName(), err)
	}
	lock := &locksv1alpha1.DistributedLock{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, lock); err != nil {
		return nil, fmt.Errorf("decoding distributedlock %s: %w", c.LockName(), err)
	}
	return lock, nil
}

// resolve returns the lock's Lease name and duration, reading the lock when
// asked to or when nothing is cached.
func (c *Client) resolve(ctx context.Context, refresh bool) (lockInfo, error) {
	c.mu.Lock()
	cached := c.info
	c.reads++
	seq := c.reads
	c.mu.Unlock()
	if cached != nil && !refresh {
		return *cached, nil
	}
	lock, err := c.GetLock(ctx)
	if err != nil {
		return lockInfo{}, err
	}
	info := lockInfo{uid: lock.UID, leaseName: lock.Status.LeaseName, recorded: lock.Status.FencingToken,
		recordedHolder: lock.Status.Holder, duration: time.Duration(lock.EffectiveLeaseDurationSeconds()) * time.Second,
		deleting: lock.DeletionTimestamp != nil}
	if lock.Status.AcquireTime != nil {
		info.recordedAcquire = lock.Status.AcquireTime.Time
	}
	if info.leaseName == "" {
		info.leaseName = lock.EffectiveLeaseName()
	}
	c.mu.Lock()
	if seq > c.infoSeq { // a read sent later may have answered first
		c.info, c.infoSeq = &info, seq
	}
	c.mu.Unlock()
	return info, nil
}

// floor is the highest token known to have been granted or recorded for
// the lock: a Lease below it was wound back, and granting on it could hand
// out a token again.
func (c *Client) floor(info lockInfo) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(info.recorded, c.highest)
}

// readLease reads the Lease afresh and remembers it.
func (c *Client) readLease(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	l, err := c.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.remember(nil)
		return nil, fmt.Errorf("%w: Lease %s/%s does not exist yet (is the frontdesk controller running?)", ErrLeaseUnavailable, c.cfg.Namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", c.cfg.Namespace, name, err)
	}
	c.remember(l)
	return l, nil
}

// remembered is the newest copy of the named Lease this client saw, or nil.
func (c *Client) remembered(name string) *coordinationv1.Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && c.last.Name == name {
		return c.last
	}
	return nil
}

// remember keeps the newest Lease seen, so the next write can be a single
// compare-and-swap without a read first.
func (c *Client) remember(l *coordinationv1.Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = l
	if l != nil && (l.Labels[locksv1alpha1.LockNameLabel] == c.cfg.Name || (c.info != nil && controlledBy(l, c.info.uid))) {
		c.highest = max(c.highest, lease.Token(l))
	}
}

// controlledBy reports whether the lock with the given UID controls l.
func controlledBy(l *coordinationv1.Lease, uid types.UID) bool {
	return uid != "" && lease.ControllerUID(l) == uid
}
