// Package lock is the frontdesk client library: acquire, renew and release a
// DistributedLock by compare-and-swap writes on its Lease, and get the
// fencing token of each grant to pass to the resources you write.
//
//	c, _ := lock.New(restConfig, lock.Config{Namespace: "default", Name: "billing"})
//	g, err := c.Acquire(ctx)          // blocks; ctx deadline = try-lock with timeout
//	defer g.Release(context.Background())
//	doWork(g.Context(), g.Token())    // g.Context() ends before the lease could lapse
//
// At the resource, fence each write on the grant's key and token, with a
// pkg/fencing Guard: guard.Fence(ctx, g.FencingKey(), g.Token(), write).
package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
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

// DefaultIdentity is unique per process incarnation. In a pod whose
// downward API sets $POD_NAME and $POD_UID it is "<pod>_<uid>_<8 hex>": the
// controller then marks that pod (and only that pod, checked by UID) as the
// holder. Without them it is "<hostname>_<8 hex>", which marks no pod.
func DefaultIdentity() string {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	random := hex.EncodeToString(suffix)
	pod, uid := os.Getenv("POD_NAME"), os.Getenv("POD_UID")
	if pod != "" && locksv1alpha1.PodUIDOf(pod+locksv1alpha1.IdentitySeparator+uid) != "" {
		return locksv1alpha1.PodIdentity(pod, uid, random)
	}
	base := pod
	if base == "" {
		base, _ = os.Hostname()
	}
	if base == "" {
		base = "unknown"
	}
	return base + locksv1alpha1.IdentitySeparator + random
}

// PodNameOf returns the pod (or host) part of an identity made by
// DefaultIdentity; other identities are returned whole.
func PodNameOf(identity string) string {
	return locksv1alpha1.PodNameOf(identity)
}

// newTicket is a random ticket for one place in a lock's queue.
func newTicket() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Principal is who a request comes from, as a grant
// (locks.frontdesk.dev/holder-principal) and a place in the queue
// (queued-by.locks.frontdesk.dev/<ticket>) record it: "pod=<pod uid>
// user=<username>" for a token bound to a pod, else "user=<username>" (see
// lease.Principal). A client writes its own, and the lease-guard policy
// refuses any other.
func Principal(user authenticationv1.UserInfo) string {
	extra := make(map[string][]string, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = v
	}
	return lease.Principal(user.Username, extra)
}

// selfPrincipal is this client's principal, asked of the apiserver once
// (see SelfPrincipal) and then remembered. Every grant and place this
// client writes carries it.
func (c *Client) selfPrincipal(ctx context.Context) (string, error) {
	c.mu.Lock()
	known := c.principal
	c.mu.Unlock()
	if known != "" {
		return known, nil
	}
	principal, err := SelfPrincipal(ctx, c.reviews)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.principal = principal
	c.mu.Unlock()
	return principal, nil
}

// SelfPrincipal asks the apiserver who the client of reviews is (a
// SelfSubjectReview, which every authenticated user may make) and returns
// its principal. It fails when that principal is outside the grammar
// (lease.ValidPrincipal): such a client can neither hold nor queue where
// the lease-guard policy is installed.
func SelfPrincipal(ctx context.Context, reviews authenticationclient.SelfSubjectReviewInterface) (string, error) {
	review, err := reviews.Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking the apiserver who this client is: %w", err)
	}
	principal := Principal(review.Status.UserInfo)
	if !lease.ValidPrincipal(principal) {
		return "", fmt.Errorf("this client's principal %q cannot hold or queue for a lock: a principal is of the grammar %s "+
			"(a username of printable ASCII without spaces, at most %d characters)", principal, lease.PrincipalPattern, lease.MaxUsernameLength)
	}
	return principal, nil
}

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

// maxWriteAttempts bounds the retries of a write that should land whatever
// the contention (a release, an admin edit): each retry follows a write of
// the grant's own fields by someone else, which is rare, since the queue's
// writes never make a grant's patch fail.
const maxWriteAttempts = 25

// errNothingToDo ends a modifyLease that has nothing to write.
var errNothingToDo = errors.New("nothing to do")

// writeLease sends a write of the grant path, the patch p judged on
// current, through the client's unthrottled writer, and remembers the Lease
// it answers with. Exact, it is current with p applied, written with an
// Update carrying current's resourceVersion (a compare-and-swap on the
// whole object, in the apiserver's cheapest encoding: a Conflict when
// anything wrote the Lease since current); otherwise it is p itself, whose
// tests are the compare-and-swap, on the fields the judgement rests on.
func (c *Client) writeLease(ctx context.Context, current *coordinationv1.Lease, p *lease.Patch, exact bool) (*coordinationv1.Lease, error) {
	var l *coordinationv1.Lease
	var err error
	if exact {
		var next *coordinationv1.Lease
		if next, err = p.ApplyTo(current); err != nil {
			return nil, err
		}
		l, err = c.writes.Update(ctx, next, metav1.UpdateOptions{})
	} else {
		l, err = c.writes.Patch(ctx, current.Name, types.JSONPatchType, p.Bytes(), metav1.PatchOptions{})
	}
	if err != nil {
		return nil, err
	}
	c.remember(l)
	return l, nil
}

// lostRace reports whether a write failed because the Lease was no longer
// the copy it was judged on: a patch whose tests failed, or that removed
// something already gone, an Update whose resourceVersion had moved, or a
// registration or hand-off the lease-guard policy refused because the
// queue changed since (lease.StaleQueueRefusal). Re-read and judge again.
func lostRace(err error) bool {
	return apierrors.IsConflict(err) || lease.PatchDidNotApply(err) ||
		apierrors.IsForbidden(err) && strings.Contains(err.Error(), lease.StaleQueueRefusal)
}

// refusal is err, saying plainly when the apiserver refused the write
// (its admission policies, or RBAC): the message names the rule.
func refusal(err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("the apiserver refused the write: %w", err)
	}
	return err
}

// mayHaveLanded reports whether a write that failed with err may still
// have been applied: an answer from the apiserver below 500 (other than a
// request timeout) is a refusal; a 5xx, a timeout or no answer is not.
func mayHaveLanded(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == http.StatusRequestTimeout
	}
	return true
}

// passingReadError reports whether a failed read is one that passes by
// itself: the apiserver timed out, was overloaded (429, 5xx) or the
// connection broke or timed out; never when the caller's ctx has ended, and
// never an error that retrying cannot mend (a refusal, bad credentials).
func passingReadError(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		utilnet.IsTimeout(err) || utilnet.IsProbableEOF(err) || utilnet.IsConnectionReset(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsHTTP2ConnectionLost(err)
}

// modifyLease applies edit to a fresh read of the Lease and sends the patch
// it returns, reading again when the patch finds the Lease changed. edit
// may refuse by returning an error, which is returned as is.
//
// The first attempt is exact (see writeLease), the others are not.
func (c *Client) modifyLease(ctx context.Context, info lockInfo, edit func(l *coordinationv1.Lease) (*lease.Patch, error)) error {
	for attempt := range maxWriteAttempts {
		current, err := c.readLease(ctx, info.leaseName)
		if err != nil {
			return err
		}
		p, err := edit(current)
		if err != nil {
			return err
		}
		_, err = c.writeLease(ctx, current, p, attempt == 0)
		if err == nil {
			return nil
		}
		if !lostRace(err) {
			return fmt.Errorf("updating lease %s/%s: %w", c.cfg.Namespace, info.leaseName, refusal(err))
		}
	}
	return fmt.Errorf("updating lease %s/%s: the Lease changed under %d writes in a row", c.cfg.Namespace, info.leaseName, maxWriteAttempts)
}
