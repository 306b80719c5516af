package lock

import (
	"cmp"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func TestGaveUpWaitingSaysWhyItWaitedAndThatItGaveUp(t *testing.T) {
	cut := errors.New("reading lease ns/billing: context deadline exceeded")
	cases := []struct {
		name     string
		waitedOn error
		cut      error
		matches  []error
		says     []string
	}{
		{"held", &HeldError{Holder: "a"}, nil, []error{ErrHeld, context.DeadlineExceeded}, []string{"gave up waiting"}},
		{"a lost race is reported as held", errContended, nil, []error{ErrHeld, context.DeadlineExceeded}, []string{"lock ns/billing is contended"}},
		{"the Lease not ready", ErrLeaseUnavailable, nil, []error{ErrLeaseUnavailable, context.DeadlineExceeded}, nil},
		{"a read cut short", &HeldError{Holder: "a"}, cut, []error{ErrHeld, context.DeadlineExceeded, cut}, []string{"it cut short: reading lease ns/billing"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := gaveUpWaiting("ns/billing", tc.waitedOn, context.DeadlineExceeded, tc.cut)
			for _, target := range tc.matches {
				if !errors.Is(err, target) {
					t.Errorf("%q does not match %q", err, target)
				}
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
		})
	}
}

// One TryAcquire of the lock, on a fake apiserver, from each state its
// Lease may be in: the token granted (or the error, by kind), the writes
// sent, and the Lease as written afterwards (a grant handed out is then
// released, which keeps its token).
func TestTryAcquireGrantsOnlyWhatItMay(t *testing.T) {
	lapsed := obj(servedLease(testUID, 4).Annotation(locksv1alpha1.LapsedAnnotation, "4"))
	cases := []struct {
		name string
		// lease is the Lease served (nil: none), recorded the lock's
		// status.fencingToken.
		lease    *coordinationv1.Lease
		recorded int64
		// before runs first: earlier calls of the same client, changes of
		// the lock or the Lease.
		before func(t *testing.T, a *fakeAPI, c *Client)
		faults map[int]fault
		always *fault

		wantToken int64 // the grant's; 0: none
		// wantErr are what the error matches; wantCode the status of the
		// apiserver's answer it wraps.
		wantErr    []error
		wantCode   int32
		wantWrites []string
		// wantHolder and wantLeaseToken are the Lease's once the call (and
		// the release of a grant) is over.
		wantHolder     string
		wantLeaseToken int64
	}{{
		name:  "free: the next token",
		lease: obj(servedLease(testUID, 4)), wantToken: 5,
		wantWrites: []string{"update"}, wantLeaseToken: 5,
	}, {
		name:  "free after the controller ended a lapsed grant",
		lease: lapsed, wantToken: 5,
		wantWrites: []string{"update"}, wantLeaseToken: 5,
	}, {
		name:    "held by another",
		lease:   heldBy(other, otherPrinc, 4),
		wantErr: []error{ErrHeld}, wantHolder: other, wantLeaseToken: 4,
	}, {
		name:  "held past its lease on this clock, not marked lapsed: still held",
		lease: heldBy(other, otherPrinc, 4),
		before: func(t *testing.T, a *fakeAPI, c *Client) {
			if _, err := c.TryAcquire(context.Background()); !errors.Is(err, ErrHeld) {
				t.Fatalf("first sighting: %v, want ErrHeld", err)
			}
			a.clock.Step(3 * testDuration)
		},
		wantErr: []error{ErrHeld}, wantHolder: other, wantLeaseToken: 4,
	}, {
		name:    "free, but queued for by a waiter whose turn it is",
		lease:   queued(t, obj(servedLease(testUID, 4)), lease.Waiter{Identity: other, Ticket: "t-other", Principal: otherPrinc}),
		wantErr: []error{ErrHeld}, wantLeaseToken: 4,
	}, {
		name:  "wound back below the token the lock recorded",
		lease: obj(servedLease(testUID, 3)), recorded: 7,
		wantErr: []error{ErrLeaseUnavailable}, wantLeaseToken: 3,
	}, {
		name:  "wound back below a token this client saw",
		lease: heldBy(other, otherPrinc, 8),
		before: func(t *testing.T, a *fakeAPI, c *Client) {
			if _, err := c.TryAcquire(context.Background()); !errors.Is(err, ErrHeld) {
				t.Fatalf("seeing token 8: %v, want ErrHeld", err)
			}
			a.set(obj(servedLease(testUID, 3)))
		},
		wantErr: []error{ErrLeaseUnavailable}, wantLeaseToken: 3,
	}, {
		name:  "wound back, as the lock read beside the write finds: withheld and released",
		lease: obj(servedLease(testUID, 4)),
		before: func(t *testing.T, a *fakeAPI, c *Client) {
			if _, err := c.resolve(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			a.setLock(func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken = 9 })
		},
		wantErr:    []error{ErrLeaseUnavailable},
		wantWrites: []string{"update", "json-patch"}, wantLeaseToken: 5,
	}, {
		name:  "the lock read beside the write fails: withheld and released",
		lease: obj(servedLease(testUID, 4)),
		before: func(t *testing.T, a *fakeAPI, c *Client) {
			if _, err := c.resolve(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			a.mu.Lock()
			a.lockErr = apierrors.NewServiceUnavailable("the lock cannot be read")
			a.mu.Unlock()
		},
		wantCode:   http.StatusServiceUnavailable,
		wantWrites: []string{"update", "json-patch"}, wantLeaseToken: 5,
	}, {
		name:  "the lock deleted and created again while the grant was written: withheld and released",
		lease: obj(servedLease(testUID, 4)),
		before: func(t *testing.T, a *fakeAPI, c *Client) {
			if _, err := c.resolve(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			a.setLock(func(l *locksv1alpha1.DistributedLock) { l.UID = "uid-2" })
		},
		wantErr:    []error{ErrLeaseUnavailable},
		wantWrites: []string{"update", "json-patch"}, wantLeaseToken: 5,
	}, {
		name:  "the lock recorded the very token granted, for another grant: withheld and released",
		lease: obj(servedLease(testUID, 4)),
		before: func(t *testing.T, a *fakeAPI, c *Client) {
			if _, err := c.resolve(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			a.setLock(func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken, l.Status.Holder = 5, other })
		},
		wantErr:    []error{ErrLeaseUnavailable},
		wantWrites: []string{"update", "json-patch"}, wantLeaseToken: 5,
	}, {
		name:  "the lock deleted and created again: its new Lease is granted on",
		lease: obj(servedLease(testUID, 4)),
		before: func(t *testing.T, a *fakeAPI, c *Client) {
			if _, err := c.resolve(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			a.setLock(func(l *locksv1alpha1.DistributedLock) { l.UID = "uid-2" })
			a.set(obj(servedLease("uid-2", 6)))
		},
		wantToken: 7, wantWrites: []string{"update"}, wantLeaseToken: 7,
	}, {
		name:    "a Lease not (yet) the lock's",
		lease:   obj(leasetest.MakeLease(testLock, testNamespace).Token(4)),
		wantErr: []error{ErrLeaseUnavailable}, wantLeaseToken: 4,
	}, {
		name: "a Lease being deleted",
		lease: func() *coordinationv1.Lease {
			l := obj(servedLease(testUID, 4))
			l.DeletionTimestamp = &metav1.Time{Time: t0}
			return l
		}(),
		wantErr: []error{ErrLeaseUnavailable}, wantLeaseToken: 4,
	}, {
		name:    "no Lease yet",
		wantErr: []error{ErrLeaseUnavailable},
	}, {
		name:    "exhausted: the token at its maximum",
		lease:   obj(servedLease(testUID, math.MaxInt32)),
		wantErr: []error{lease.ErrTokensExhausted}, wantLeaseToken: math.MaxInt32,
	}, {
		name:  "409: the manager wrote the Lease between the read and the write; judged afresh",
		lease: obj(servedLease(testUID, 4)),
		faults: map[int]fault{1: {first: func(a *fakeAPI) {
			l := a.current()
			l.Annotations[locksv1alpha1.LeaseDurationAnnotation] = "10"
			a.set(l)
		}}},
		wantToken: 5, wantWrites: []string{"update", "json-patch"}, wantLeaseToken: 5,
	}, {
		name:  "409: a waiter registered between the read and the write; it comes first",
		lease: obj(servedLease(testUID, 4)),
		faults: map[int]fault{1: {first: func(a *fakeAPI) {
			a.set(queued(t, a.current(), lease.Waiter{Identity: other, Ticket: "t-late", Principal: otherPrinc}))
		}}},
		wantErr:    []error{ErrHeld},
		wantWrites: []string{"update"}, wantLeaseToken: 4,
	}, {
		name:  "409: another client's grant landed first",
		lease: obj(servedLease(testUID, 4)),
		faults: map[int]fault{1: {first: func(a *fakeAPI) {
			a.set(heldBy(other, otherPrinc, 5))
		}}},
		wantErr:    []error{ErrHeld},
		wantWrites: []string{"update"}, wantHolder: other, wantLeaseToken: 5,
	}, {
		name:           "409 on every write: contended after maxCASAttempts",
		lease:          obj(servedLease(testUID, 4)),
		always:         &fault{conflict: true},
		wantErr:        []error{ErrHeld},
		wantWrites:     []string{"update", "json-patch", "json-patch", "json-patch", "json-patch"},
		wantLeaseToken: 4,
	}, {
		name:    "lost answer, the grant landed: released, never handed out",
		lease:   obj(servedLease(testUID, 4)),
		faults:  map[int]fault{1: {lost: io.ErrUnexpectedEOF}},
		wantErr: []error{io.ErrUnexpectedEOF},
		// The grant's token is used up; its release was an exact write.
		wantWrites: []string{"update", "update"}, wantLeaseToken: 5,
	}, {
		name:       "lost answer, the grant did not land: nothing to release",
		lease:      obj(servedLease(testUID, 4)),
		faults:     map[int]fault{1: {refused: apierrors.NewServiceUnavailable("etcd timed out")}},
		wantCode:   http.StatusServiceUnavailable,
		wantWrites: []string{"update"}, wantLeaseToken: 4,
	}, {
		name:       "answered past the safe window: not handed out, released",
		lease:      obj(servedLease(testUID, 4)),
		faults:     map[int]fault{1: {late: testDuration}},
		wantErr:    []error{ErrAnsweredTooLate, ErrHeld},
		wantWrites: []string{"update", "update"}, wantLeaseToken: 5,
	}, {
		name:       "refused by the apiserver: nothing landed",
		lease:      obj(servedLease(testUID, 4)),
		faults:     map[int]fault{1: {refused: apierrors.NewForbidden(coordinationv1.Resource("leases"), testLock, errors.New("the lease guard says no"))}},
		wantCode:   http.StatusForbidden,
		wantWrites: []string{"update"}, wantLeaseToken: 4,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAPI(t, tc.lease, tc.recorded)
			c := a.client()
			ctx := context.Background()
			if tc.before != nil {
				tc.before(t, a, c)
			}
			a.mu.Lock()
			a.writes, a.faults, a.always = nil, tc.faults, tc.always
			a.mu.Unlock()

			g, err := c.TryAcquire(ctx)

			checkErr(t, err, tc.wantErr, tc.wantCode)
			if tc.wantToken == 0 && len(tc.wantErr) == 0 && tc.wantCode == 0 {
				t.Fatal("a case without a grant names the error it wants")
			}
			switch {
			case tc.wantToken == 0 && g != nil:
				t.Errorf("granted token %d, want no grant", g.Token())
			case tc.wantToken != 0 && err != nil:
				t.Fatalf("error %v, want token %d", err, tc.wantToken)
			case tc.wantToken != 0:
				checkHeldThenRelease(ctx, t, a, c, g, tc.wantToken)
				tc.wantWrites = append(tc.wantWrites, "update")
			}
			if got := a.writesSent(); !slices.Equal(got, tc.wantWrites) {
				t.Errorf("writes %v, want %v", got, tc.wantWrites)
			}
			l := a.current()
			if tc.lease == nil {
				if l != nil {
					t.Errorf("a Lease was written: %v", l)
				}
				return
			}
			if lease.Holder(l) != tc.wantHolder || lease.Token(l) != tc.wantLeaseToken {
				t.Errorf("Lease afterwards: holder %q, token %d; want %q, %d", lease.Holder(l), lease.Token(l), tc.wantHolder, tc.wantLeaseToken)
			}
		})
	}
}

// checkErr checks that err matches each of want and, when code is not 0,
// wraps the apiserver's answer with that status code.
func checkErr(t *testing.T, err error, want []error, code int32) {
	t.Helper()
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Errorf("error %v, want one that matches %v", err, w)
		}
	}
	var status apierrors.APIStatus
	if code != 0 && (!errors.As(err, &status) || status.Status().Code != code) {
		t.Errorf("error %v, want the apiserver's answer %d", err, code)
	}
}

// checkHeldThenRelease checks a grant of token as the Lease shows it while
// held (holder, token, principal) and its safe window, then releases it.
func checkHeldThenRelease(ctx context.Context, t *testing.T, a *fakeAPI, c *Client, g *Grant, token int64) {
	t.Helper()
	if g.Token() != token {
		t.Errorf("granted token %d, want %d", g.Token(), token)
	}
	l := a.current()
	if lease.Holder(l) != me || lease.Token(l) != token || l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] != mePrinc {
		t.Errorf("Lease while held: holder %q, token %d, principal %q; want %q, %d, %q", lease.Holder(l), lease.Token(l),
			l.Annotations[locksv1alpha1.HolderPrincipalAnnotation], me, token, mePrinc)
	}
	if want := t0.Add(testDuration - c.safetyMargin(lockInfo{duration: testDuration})); !g.ValidUntil().Equal(want) {
		t.Errorf("ValidUntil %s, want the write's start plus the safe window, %s", g.ValidUntil(), want)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// acquireInBackground runs c.Acquire(ctx) and returns where its outcome
// arrives.
func acquireInBackground(ctx context.Context, c *Client) <-chan acquireOutcome {
	out := make(chan acquireOutcome, 1)
	go func() {
		g, err := c.Acquire(ctx)
		out <- acquireOutcome{g, err}
	}()
	return out
}

type acquireOutcome struct {
	g   *Grant
	err error
}

// myPlace is the place of me in l's queue, and its position (-1: none).
func myPlace(l *coordinationv1.Lease) (lease.Waiter, int) {
	for i, w := range lease.Queue(l) {
		if w.Identity == me {
			return w, i
		}
	}
	return lease.Waiter{}, -1
}

// An Acquire of a held lock registers at the head of the queue, and takes
// up the grant its holder's release hands to it, without a write of its
// own: the hand-off was written after its registration, moments ago.
func TestAcquireWaitsInTheQueueAndTakesUpTheHandOff(t *testing.T) {
	a := newFakeAPI(t, heldBy(other, otherPrinc, 4), 0)
	c := a.client()
	ctx := t.Context()
	outcome := acquireInBackground(ctx, c)

	within(t, "registering", func() bool { _, at := myPlace(a.current()); return at == 0 })
	place, _ := myPlace(a.current())
	if place.Principal != mePrinc {
		t.Errorf("the place is bound to %q, want %q", place.Principal, mePrinc)
	}
	if got := a.writesSent(); !slices.Equal(got, []string{"update"}) {
		t.Errorf("writes while waiting %v, want one exact registration", got)
	}

	// The holder releases, handing the lock to the head of the queue.
	handOff, head, ok, err := lease.HandOffPatch(a.current(), other, testDuration, t0)
	if err != nil || !ok || head.Ticket != place.Ticket {
		t.Fatalf("hand-off to %v (ok %v): %v", head, ok, err)
	}
	a.apply(handOff)

	var got acquireOutcome
	select {
	case got = <-outcome:
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not take up the hand-off within 5s")
	}
	if got.err != nil {
		t.Fatalf("Acquire: %v", got.err)
	}
	g := got.g
	if g.Token() != 5 {
		t.Errorf("token %d, want 5 (the hand-off's)", g.Token())
	}
	l := a.current()
	if lease.Holder(l) != me || l.Annotations[locksv1alpha1.TicketAnnotation] != place.Ticket || len(lease.Queue(l)) != 0 {
		t.Errorf("Lease: holder %q, ticket %q, queue %v; want me, my ticket, none", lease.Holder(l), l.Annotations[locksv1alpha1.TicketAnnotation], lease.Queue(l))
	}
	if want := t0.Add(testDuration - c.safetyMargin(lockInfo{duration: testDuration})); !g.ValidUntil().Equal(want) {
		t.Errorf("ValidUntil %s, want the registration plus the safe window, %s", g.ValidUntil(), want)
	}
	if got := a.writesSent(); !slices.Equal(got, []string{"update"}) {
		t.Errorf("writes %v, want only the registration: a fresh hand-off is used without a renewal", got)
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l := a.current(); lease.Holder(l) != "" || lease.Token(l) != 5 {
		t.Errorf("released Lease: holder %q, token %d; want none, 5", lease.Holder(l), lease.Token(l))
	}
}

// An Acquire that gives up while queued leaves the queue, and says why it
// waited and that it gave up.
func TestAcquireThatGivesUpLeavesTheQueue(t *testing.T) {
	a := newFakeAPI(t, heldBy(other, otherPrinc, 4), 0)
	c := a.client()
	ctx, cancel := context.WithCancel(context.Background())
	outcome := acquireInBackground(ctx, c)
	within(t, "registering", func() bool { _, at := myPlace(a.current()); return at == 0 })
	cancel()

	var got acquireOutcome
	select {
	case got = <-outcome:
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not give up within 5s")
	}
	if got.g != nil || !errors.Is(got.err, ErrHeld) || !errors.Is(got.err, context.Canceled) {
		t.Fatalf("Acquire: %v, %v; want no grant, an error matching ErrHeld and context.Canceled", got.g, got.err)
	}
	l := a.current()
	if _, at := myPlace(l); at >= 0 || lease.Holder(l) != other || lease.Token(l) != 4 {
		t.Errorf("Lease afterwards: my place at %d, holder %q, token %d; want no place, %q, 4", at, lease.Holder(l), lease.Token(l), other)
	}
	if got := a.writesSent(); !slices.Equal(got, []string{"update", "merge-patch"}) {
		t.Errorf("writes %v, want the registration and the withdrawal", got)
	}
}

// An attempt that finds the lock handed to its place takes it up: at once
// when the hand-off is known to be written within a renew interval, else
// after a renewal of its own, from which its safe window counts; a
// renewal answered too late is not used.
func TestAttemptTakesUpAHandOff(t *testing.T) {
	interval := testDuration / 3
	cases := []struct {
		name string
		// waited is how long after the registration the attempt is made.
		waited     time.Duration
		faults     map[int]fault
		wantErr    error
		wantWrites []string
		// wantToken is the token taken up (0: the hand-off's, 5);
		// wantSafeFrom is when its safe window starts, after t0.
		wantToken    int64
		wantSafeFrom time.Duration
	}{
		{name: "handed over moments ago: no write", waited: time.Second, wantSafeFrom: 0},
		{name: "waited longer than a renew interval: renewed first", waited: interval + time.Second,
			wantWrites: []string{"json-patch"}, wantSafeFrom: interval + time.Second},
		{name: "the renewal answered too late", waited: interval + time.Second, faults: map[int]fault{1: {late: testDuration}},
			wantErr: ErrAnsweredTooLate, wantWrites: []string{"json-patch"}},
		{name: "the hand-off ended before its renewal: judged afresh, granted anew", waited: interval + time.Second,
			faults: map[int]fault{1: {first: func(a *fakeAPI) {
				a.apply(lease.ReleasePatch(a.current()))
			}}},
			wantToken: 6, wantWrites: []string{"json-patch", "update"}, wantSafeFrom: interval + time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &place{ticket: "t-me", waiting: true, principal: mePrinc, registeredAt: t0, sentRegistration: true}
			l := queued(t, heldBy(other, otherPrinc, 4), lease.Waiter{Identity: me, Ticket: p.ticket, Principal: mePrinc})
			handOff, _, _, err := lease.HandOffPatch(l, other, testDuration, t0)
			if err != nil {
				t.Fatal(err)
			}
			if l, err = handOff.ApplyTo(l); err != nil {
				t.Fatal(err)
			}
			a := newFakeAPI(t, l, 0)
			c := a.client()
			info, err := c.resolve(context.Background(), true)
			if err != nil {
				t.Fatal(err)
			}
			a.clock.Step(tc.waited)
			a.mu.Lock()
			a.faults = tc.faults
			a.mu.Unlock()

			acq, _, err := c.attempt(context.Background(), &info, leaseCopy{}, p)

			if got := a.writesSent(); !slices.Equal(got, tc.wantWrites) {
				t.Errorf("writes %v, want %v", got, tc.wantWrites)
			}
			if tc.wantErr != nil {
				if acq != nil || !errors.Is(err, tc.wantErr) {
					t.Fatalf("attempt: %v, %v; want no grant and an error matching %v", acq, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantToken := cmp.Or(tc.wantToken, 5)
			if l := a.current(); lease.Token(acq.lease) != wantToken || lease.Holder(l) != me || lease.Token(l) != wantToken {
				t.Errorf("took up token %d, Lease held by %q with %d; want %d, me", lease.Token(acq.lease), lease.Holder(l), lease.Token(l), wantToken)
			}
			if want := t0.Add(tc.wantSafeFrom + testDuration - c.safetyMargin(info)); !acq.validUntil.Equal(want) {
				t.Errorf("valid until %s, want %s", acq.validUntil, want)
			}
		})
	}
}
