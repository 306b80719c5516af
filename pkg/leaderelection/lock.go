// Package leaderelection gives a client-go or controller-runtime leader its
// fencing token.
//
// client-go's tools/leaderelection raises a Lease's spec.leaseTransitions on
// every change of leader and keeps it on renewals, so when a frontdesk
// DistributedLock backs that Lease, leaseTransitions is the leader's fencing
// token. Lock is a resourcelock.Interface that wraps client-go's own
// resourcelock.LeaseLock: it lets client-go run the election unchanged and
// remembers, from the apiserver's answer to the write that made this
// process leader, the token of the current leadership Term. It never
// creates the Lease: declare the DistributedLock, and frontdesk's
// controller creates the Lease from the lock's token floor.
//
//	lk, err := leaderelection.NewForConfig(restConfig, leaderelection.Config{
//		Namespace: "my-operator-system", Name: "my-operator-lock", // --leader-election-id
//	})
//	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
//		LeaderElection: true, LeaderElectionID: "my-operator-lock",
//		LeaderElectionResourceLockInterface: lk,
//	})
//	...
//	term := lk.Term()          // nil when this process does not lead
//	if err := term.Err(); err != nil { ... } // right before each write
//	guard.Fence(term.Context(), term.FencingKey(), term.Token(), write)
//
// See docs/leader-election.md for the whole recipe.
package leaderelection

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

var (
	// ErrNotLeader is the cause of the Context returned while this process
	// has no live Term.
	ErrNotLeader = errors.New("not the leader")
	// ErrLost is the cause of a Term's Context when it ended without a
	// release: its safe window ran out, another holder or another token
	// showed up on the Lease, client-go stopped leading, or the Lease is
	// being deleted.
	ErrLost = errors.New("leadership lost")
	// ErrReleased is the cause of a Term's Context when client-go released
	// the Lease (ReleaseOnCancel).
	ErrReleased = errors.New("leadership released")
	// ErrNoLease is what Create returns: the election Lease does not exist,
	// and a Lock never creates it (frontdesk's controller does).
	ErrNoLease = errors.New("election Lease does not exist")
)

// stoppedLeading is what client-go's LeaderElector records on its lock when
// its renew loop ends (RenewDeadline passed without a renewal, or its
// context ended).
const stoppedLeading = "stopped leading"

// Config names the election Lease and tunes the Lock.
type Config struct {
	// Namespace of the election Lease (controller-runtime's
	// LeaderElectionNamespace).
	Namespace string
	// Name of the election Lease (controller-runtime's LeaderElectionID).
	// Declare a DistributedLock over it (spec.leaseName).
	Name string
	// LockName is the name of that DistributedLock, which a Term's
	// FencingKey names. Default: Name, a lock named like its Lease (whose
	// spec.leaseName may then be left out), as docs/leader-election.md
	// declares it.
	LockName string
	// Identity this process leads as. It must be unique per process
	// incarnation. Default: lock.DefaultIdentity(), which names the pod
	// (and its UID) when $POD_NAME and $POD_UID are set, so frontdesk marks
	// the leader's pod when the pod consents (its annotation
	// locks.frontdesk.dev/may-hold lists the lock).
	Identity string
	// EventRecorder, optional, records client-go's "became leader" and
	// "stopped leading" on the Lease.
	EventRecorder resourcelock.EventRecorder
	// Labels, optional, are set on the Lease by whoever becomes leader (as
	// resourcelock.NewWithLabels does).
	Labels map[string]string
	// SafetyMargin is how much earlier than the lease duration a Term's
	// window ends (see Term for where it is counted from). Default: 2% of
	// the lease duration plus 100ms, as in pkg/lock.
	SafetyMargin time.Duration
	// RenewDeadline is the elector's RenewDeadline. NewForConfig bounds each
	// request by half of it, at least 1s, as client-go's
	// resourcelock.NewFromKubeconfig does. Default: 10s (controller-runtime's
	// default).
	RenewDeadline time.Duration
	// Clock is the local clock. Default: the real one (monotonic).
	Clock clock.WithDelayedExecution
	// Principal is who this process's requests come from (lock.Principal),
	// which every record naming this process carries: the lease-guard
	// policy refuses a grant bound to any other. NewForConfig learns it
	// from the apiserver (a SelfSubjectReview) before the first such
	// write; with New, set it (lock.SelfPrincipal), or leave it empty
	// where no policy guards the Lease.
	Principal string
}

// Lock is a resourcelock.Interface over a coordination.k8s.io/v1 Lease that
// knows the fencing token of this process's leadership. Pass it to
// client-go's LeaderElectionConfig.Lock or to controller-runtime's
// Options.LeaderElectionResourceLockInterface (one Lock per elector). It
// delegates reads and updates to client-go's resourcelock.LeaseLock and
// watches the answers; it never creates the Lease and refuses to renew one
// that is being deleted (see Create and Update).
type Lock struct {
	inner *resourcelock.LeaseLock
	cfg   Config
	desc  string
	// fencingKey is every Term's FencingKey.
	fencingKey string

	// calls serializes Get, Create and Update, so each answer is matched to
	// its call (client-go makes them one at a time anyway).
	calls sync.Mutex
	// sent is when the latest second of renewTime this Lock wrote was first
	// sent (see firstSent). Guarded by calls.
	sent firstSent

	// reviews asks the apiserver who this process is, when Principal is
	// not set (NewForConfig); nil otherwise.
	reviews authenticationclient.SelfSubjectReviewInterface

	mu sync.Mutex
	// term is the live Term, or nil.
	term *Term
	// started is closed when a Term begins, and then replaced.
	started chan struct{}
	// answer is the Lease the apiserver answered the call in progress with.
	answer *coordinationv1.Lease
	// last is the last Lease the apiserver answered with.
	last *coordinationv1.Lease
}

var _ resourcelock.Interface = (*Lock)(nil)

// NewForConfig builds a Lock with a client of its own, each request bounded
// by max(1s, RenewDeadline/2).
func NewForConfig(rc *rest.Config, cfg Config) (*Lock, error) {
	rd := cfg.RenewDeadline
	if rd <= 0 {
		rd = 10 * time.Second
	}
	c := rest.CopyConfig(rc)
	c.Timeout = max(time.Second, rd/2)
	cs, err := kubernetes.NewForConfig(rest.AddUserAgent(c, "leader-election"))
	if err != nil {
		return nil, fmt.Errorf("building the leader election client: %w", err)
	}
	l, err := New(cs.CoordinationV1(), cfg)
	if err != nil {
		return nil, err
	}
	l.reviews = cs.AuthenticationV1().SelfSubjectReviews()
	return l, nil
}

// principal is the principal records naming this process carry: Config's,
// or learnt from the apiserver once ("" with neither).
func (l *Lock) principal(ctx context.Context) (string, error) {
	l.mu.Lock()
	known, reviews := l.cfg.Principal, l.reviews
	l.mu.Unlock()
	if known != "" || reviews == nil {
		return known, nil
	}
	principal, err := lock.SelfPrincipal(ctx, reviews)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	l.cfg.Principal = principal
	l.mu.Unlock()
	return principal, nil
}

// New builds a Lock that reaches the Lease through leases. Give the client
// a request timeout shorter than the RenewDeadline (NewForConfig does).
func New(leases coordinationclient.LeasesGetter, cfg Config) (*Lock, error) {
	if cfg.Namespace == "" || cfg.Name == "" {
		return nil, errors.New("leaderelection: Config.Namespace and Config.Name (the election Lease) are required")
	}
	if cfg.Identity == "" {
		cfg.Identity = lock.DefaultIdentity()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.LockName == "" {
		cfg.LockName = cfg.Name
	}
	l := &Lock{cfg: cfg, desc: cfg.Namespace + "/" + cfg.Name, fencingKey: fencing.LockKey(cfg.Namespace, cfg.LockName),
		started: make(chan struct{})}
	l.inner = &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     answeredLeases{LeasesGetter: leases, lock: l},
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity, EventRecorder: cfg.EventRecorder},
	}
	return l, nil
}

// Term is the current leadership Term: nil while this process does not
// lead, including once the local clock has reached the Term's ValidUntil
// (checked here, not left to a timer). Token and Context of one Term belong
// together; a process that leads again (client-go's Run called anew, a
// renewal that lands after the previous Term's window ran out, a token
// raised under the holder) gets a new Term.
func (l *Lock) Term() *Term {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.term; t != nil {
		l.checkWindowLocked(t)
	}
	return l.term
}

// Token is the fencing token of the current Term, and false when there is
// none. Prefer Term() when you also need its Context.
func (l *Lock) Token() (int64, bool) {
	if t := l.Term(); t != nil {
		return t.Token(), true
	}
	return 0, false
}

// Context is the current Term's Context, or, when there is none, a Context
// that is already cancelled with cause ErrNotLeader.
func (l *Lock) Context() context.Context {
	if t := l.Term(); t != nil {
		return t.Context()
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("%w of %s", ErrNotLeader, l.desc))
	return ctx
}

// WaitForTerm blocks until this process leads (a live Term) or ctx ends.
func (l *Lock) WaitForTerm(ctx context.Context) (*Term, error) {
	for {
		l.mu.Lock()
		if l.term != nil {
			l.checkWindowLocked(l.term)
		}
		t, started := l.term, l.started
		l.mu.Unlock()
		if t != nil {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-started:
		}
	}
}

// Get reads the Lease. A record that names another holder, or another
// token, than the live Term ends that Term; so does a Lease that is gone or
// being deleted.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.calls.Lock()
	defer l.calls.Unlock()
	l.beginCall()
	rec, raw, err := l.inner.Get(ctx)
	answer := l.endCall()
	switch {
	case apierrors.IsNotFound(err):
		l.endTerm(fmt.Errorf("%w: Lease %s not found", ErrLost, l.desc))
	case err == nil:
		holder, token, _ := recordOf(rec, answer)
		switch {
		case answer != nil && answer.DeletionTimestamp != nil:
			l.endTerm(fmt.Errorf("%w: Lease %s is being deleted", ErrLost, l.desc))
		case holder != l.cfg.Identity:
			l.endTerm(fmt.Errorf("%w: Lease %s is held by %q (fencing token %d)", ErrLost, l.desc, holder, token))
		default:
			l.mu.Lock()
			if t := l.term; t != nil && t.token != token {
				l.endTermLocked(t, fmt.Errorf("%w: Lease %s names this process with fencing token %d, not %d", ErrLost, l.desc, token, t.token))
			}
			l.mu.Unlock()
		}
	}
	return rec, raw, err
}

// Create never creates the Lease: it returns an error wrapping ErrNoLease,
// and client-go's elector logs it and reads again after its RetryPeriod, so
// the process waits until the Lease exists. Only frontdesk's controller
// creates a lock's Lease, from the lock's token floor and with its
// finalizer; a Lease created here would start the fencing tokens over at 0,
// below the token the lock has recorded, and a process cannot tell whether
// a lock backs the Lease or just deleted it (a restarted process that reads
// between the finalizer's release and the recreation sees no Lease at all).
func (l *Lock) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	seen := l.last
	l.mu.Unlock()
	if seen != nil {
		return fmt.Errorf("%w: Lease %s existed (fencing token %d) and was deleted; waiting for frontdesk's controller to "+
			"recreate it from the lock's token floor (a Lock never creates it)", ErrNoLease, l.desc, lease.Token(seen))
	}
	return fmt.Errorf("%w: waiting for Lease %s; a Lock never creates it: declare a DistributedLock over it "+
		"(spec.leaseName %q in namespace %s) and frontdesk's controller creates it", ErrNoLease, l.desc, l.cfg.Name, l.cfg.Namespace)
}

// Update writes client-go's record. A record that does not name this
// process (client-go releasing the Lease) ends the live Term before it is
// sent. A renewal of a Lease that is being deleted is refused, so that
// frontdesk's controller sees the holder lapse, records its last token and
// recreates the Lease. A record naming this process counts from the moment
// it is sent, answered or not, toward the window of the next answered
// write with the same renewTime second (firstSent); one whose second is
// older than one already sent ends the live Term before it is sent.
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.calls.Lock()
	defer l.calls.Unlock()
	if ler.HolderIdentity != l.cfg.Identity {
		l.endTerm(fmt.Errorf("%w: this process released Lease %s", ErrReleased, l.desc))
	}
	l.mu.Lock()
	last := l.last
	l.mu.Unlock()
	if last != nil && last.DeletionTimestamp != nil && ler.HolderIdentity != "" {
		return fmt.Errorf("not writing Lease %s: it is being deleted (frontdesk's controller recreates it from the lock's token floor)", l.desc)
	}
	if ler.HolderIdentity == l.cfg.Identity && !l.sent.send(renewSecond(&ler), l.cfg.Clock.Now()) {
		// The record may look like one sent long ago (see firstSent): once
		// stored, others may take over at once.
		l.endTerm(fmt.Errorf("%w: renewing Lease %s with renewTime %s, older than a renewal already sent (the wall clock "+
			"stepped back): others may take it for an earlier record", ErrLost, l.desc, ler.RenewTime.UTC().Format(time.RFC3339)))
	}
	l.beginCall()
	err := l.inner.Update(ctx, ler)
	answer := l.endCall()
	if err != nil {
		// Not an end by itself: client-go retries until its RenewDeadline,
		// and the Term's window still bounds how long it counts as held.
		// The write may have been stored all the same: its sending already
		// counts (l.sent).
		return err
	}
	l.wrote(&ler, answer)
	return nil
}

// RecordEvent passes client-go's event on; "stopped leading" ends the Term.
func (l *Lock) RecordEvent(s string) {
	if s == stoppedLeading {
		l.endTerm(fmt.Errorf("%w: client-go stopped leading on Lease %s (no renewal within its RenewDeadline, or its context ended)", ErrLost, l.desc))
	}
	l.inner.RecordEvent(s)
}

// Identity is the identity this process leads as.
func (l *Lock) Identity() string { return l.inner.Identity() }

// Describe is namespace/name of the Lease.
func (l *Lock) Describe() string { return l.inner.Describe() }

// wrote judges a successful write of ler: a record naming this process
// extends the live Term, or begins one when there is none or its token
// differs; any other record ends it. The window is counted from the first
// sending of a record others may take for this one (firstSent), not from
// this write's start: a resent or same-second record restarts nobody's wait.
func (l *Lock) wrote(ler *resourcelock.LeaderElectionRecord, answer *coordinationv1.Lease) {
	holder, token, duration := recordOf(ler, answer)
	if holder != l.cfg.Identity {
		l.endTerm(fmt.Errorf("%w: this process released Lease %s", ErrReleased, l.desc))
		return
	}
	since, ok := l.sent.since(renewSecond(ler))
	if !ok {
		return // its window cannot be counted; Update ended the Term
	}
	validUntil := since.Add(duration - lease.SafetyMargin(duration, l.cfg.SafetyMargin))
	now := l.cfg.Clock.Now()

	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.term; t != nil {
		// A Term whose window ran out ends here, whether or not its timer's
		// goroutine has run yet: this write may begin a new one.
		l.checkWindowLocked(t)
	}
	if t := l.term; t != nil {
		if t.token == token {
			l.extendLocked(t, validUntil, now)
			return
		}
		l.endTermLocked(t, fmt.Errorf("%w: Lease %s now carries fencing token %d under this process, not %d", ErrLost, l.desc, token, t.token))
	}
	if !now.Before(validUntil) {
		return // answered too late to count: others may already have taken over
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &Term{lock: l, token: token, ctx: ctx, cancel: cancel, validUntil: validUntil}
	l.term = t
	l.armLocked(t, now)
	close(l.started)
	l.started = make(chan struct{})
}

// extendLocked moves t's window to validUntil if that is later. An answer
// that arrives after the window ran out extends nothing: the timer ends t.
func (l *Lock) extendLocked(t *Term, validUntil, now time.Time) {
	if !validUntil.After(t.validUntil) || !now.Before(t.validUntil) {
		return
	}
	t.validUntil = validUntil
	l.armLocked(t, now)
}

// armLocked (re)starts the timer that ends t at its validUntil. The timer's
// function hands over to a goroutine, so that it never runs under the
// clock's own lock.
func (l *Lock) armLocked(t *Term, now time.Time) {
	if t.timer != nil {
		t.timer.Stop()
	}
	t.generation++
	gen := t.generation
	t.timer = l.cfg.Clock.AfterFunc(t.validUntil.Sub(now), func() { go l.expire(t, gen) })
}

// expire ends t if the timer that fired is still its latest.
func (l *Lock) expire(t *Term, gen int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.generation != gen {
		return
	}
	l.endTermLocked(t, l.expired())
}

// checkWindowLocked ends t if the local clock has reached its ValidUntil,
// whether or not its timer has fired yet.
func (l *Lock) checkWindowLocked(t *Term) {
	if t.ctx.Err() == nil && !l.cfg.Clock.Now().Before(t.validUntil) {
		l.endTermLocked(t, l.expired())
	}
}

// expired is the cause of a Term whose window ran out.
func (l *Lock) expired() error {
	return fmt.Errorf("%w: Lease %s not renewed in time: its window (the lease duration minus a safety margin, "+
		"from the first sending of the record last written) ran out", ErrLost, l.desc)
}

func (l *Lock) endTerm(cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term != nil {
		l.endTermLocked(l.term, cause)
	}
}

func (l *Lock) endTermLocked(t *Term, cause error) {
	t.cancel(cause)
	if t.timer != nil {
		t.timer.Stop()
	}
	t.generation++
	if l.term == t {
		l.term = nil
	}
}

func (l *Lock) beginCall() {
	l.mu.Lock()
	l.answer = nil
	l.mu.Unlock()
}

func (l *Lock) endCall() *coordinationv1.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.answer
	l.answer = nil
	return a
}

// answered records a Lease the apiserver answered a call with.
func (l *Lock) answered(lease *coordinationv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answer, l.last = lease, lease
}

// recordOf is holder, token and lease duration as the apiserver answered
// the call, or, without an answer, as client-go's record says.
func recordOf(ler *resourcelock.LeaderElectionRecord, answer *coordinationv1.Lease) (string, int64, time.Duration) {
	if answer == nil {
		return ler.HolderIdentity, int64(ler.LeaderTransitions), time.Duration(ler.LeaseDurationSeconds) * time.Second
	}
	rec := lease.RecordOf(answer)
	return rec.Holder, rec.Token, rec.Duration(0)
}
