package leaderelection

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// outcome is what becomes of one write in a windowCase.
type outcome int

const (
	answered outcome = iota // stored and answered
	lost                    // stored, but the answer is lost (a timeout)
	refused                 // never stored
)

// write is one Update as client-go sends it: at is when it is sent,
// renewAt the renewTime in its record (client-go takes it once per attempt
// and resends the same record after a failure).
type write struct {
	at, renewAt time.Duration
	outcome     outcome
}

// failWrites makes the Lease updates whose outcome *next says so fail;
// a lost one is stored first, and its answer takes a second.
func (f *fixture) failWrites(next *outcome) {
	f.cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch *next {
		case lost:
			obj := a.(k8stesting.UpdateAction).GetObject()
			if err := f.cs.Tracker().Update(coordinationv1.SchemeGroupVersion.WithResource("leases"), obj, ns); err != nil {
				return true, nil, err
			}
			f.clock.Step(time.Second)
			return true, nil, context.DeadlineExceeded
		case refused:
			return true, nil, errors.New("connection refused")
		case answered:
		}
		return false, nil, nil
	})
}

// The window of a Term counts from the first sending of a record that the
// others could not tell apart from the one last written: client-go
// candidates see renewTime to the second, so that is the first write, failed
// or not, whose renewTime falls in the same second. Lease 2s, margin 140ms.
func TestWindowCountsFromTheFirstSendingOfTheRecord(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []write
		// validUntil is after t0 (a whole second).
		validUntil time.Duration
	}{
		{"a single takeover", []write{{0, 0, answered}}, 1860 * time.Millisecond},
		{"a renewal in a later second counts from itself",
			[]write{{100 * time.Millisecond, 100 * time.Millisecond, answered}, {1050 * time.Millisecond, 1050 * time.Millisecond, answered}},
			2910 * time.Millisecond},
		{"a record stored, its answer lost, then resent: from the first sending",
			[]write{{0, 0, answered}, {1200 * time.Millisecond, 1200 * time.Millisecond, lost}, {2300 * time.Millisecond, 1200 * time.Millisecond, answered}},
			3060 * time.Millisecond},
		{"a record refused, then resent: from the first sending (it might have been stored)",
			[]write{{0, 0, answered}, {1200 * time.Millisecond, 1200 * time.Millisecond, refused}, {1700 * time.Millisecond, 1200 * time.Millisecond, answered}},
			3060 * time.Millisecond},
		{"renewals within one second: from the first of them",
			[]write{{100 * time.Millisecond, 100 * time.Millisecond, answered}, {400 * time.Millisecond, 400 * time.Millisecond, answered},
				{700 * time.Millisecond, 700 * time.Millisecond, answered}},
			1960 * time.Millisecond},
		{"a failed first write of a second counts too",
			[]write{{100 * time.Millisecond, 100 * time.Millisecond, answered}, {1100 * time.Millisecond, 1100 * time.Millisecond, refused},
				{1500 * time.Millisecond, 1500 * time.Millisecond, answered}},
			2960 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			var next outcome
			f.failWrites(&next)
			for i, w := range tc.writes {
				f.clock.SetTime(t0.Add(w.at))
				rec := f.record("me", 1)
				rec.RenewTime = metav1.NewTime(t0.Add(w.renewAt))
				if _, _, err := f.lock.Get(context.Background()); err != nil {
					t.Fatal(err)
				}
				next = w.outcome
				if err := f.lock.Update(context.Background(), rec); (err == nil) != (w.outcome == answered) {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			term := f.lock.Term()
			if term == nil {
				t.Fatal("no Term")
			}
			want := t0.Add(tc.validUntil)
			if got := term.ValidUntil(); !got.Equal(want) {
				t.Fatalf("ValidUntil = t0+%s, want t0+%s", got.Sub(t0), tc.validUntil)
			}
			f.clock.SetTime(want.Add(-time.Millisecond))
			live(t, term.Context(), "1ms before ValidUntil")
			f.clock.SetTime(want)
			_ = ended(t, term.Context())
		})
	}
}

// A renewal whose renewTime is in an older second than one already sent
// (the wall clock stepped back) may look to others like a record sent long
// ago: the Term ends before it is sent, and its success begins none.
func TestARenewTimeOlderThanOneSentEndsTheTerm(t *testing.T) {
	f := newFixture(t)
	f.clock.SetTime(t0.Add(1500 * time.Millisecond))
	term := f.lead()
	var liveWhenSent bool
	f.cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		liveWhenSent = term.Context().Err() == nil
		return false, nil, nil
	})
	f.clock.SetTime(t0.Add(1800 * time.Millisecond))
	rec := f.record("me", 1)
	rec.RenewTime = metav1.NewTime(t0.Add(900 * time.Millisecond))
	if err := f.lock.Update(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if liveWhenSent {
		t.Fatal("the Term was live when the renewal was sent")
	}
	if cause := context.Cause(term.Context()); !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), "stepped back") {
		t.Fatalf("cause = %v", cause)
	}
	if f.lock.Term() != nil {
		t.Fatal("a renewal whose window cannot be counted began a Term")
	}
	// A later second counts again, from its own first sending.
	f.clock.SetTime(t0.Add(2100 * time.Millisecond))
	if err := f.renew(1); err != nil {
		t.Fatal(err)
	}
	if next := f.lock.Term(); next == nil || !next.ValidUntil().Equal(t0.Add(3960*time.Millisecond)) {
		t.Fatalf("after a renewal in a later second: Term %+v", next)
	}
}

// stalledTimers is a clock whose timers never fire: the goroutine that
// would end a Term at ValidUntil has not run yet.
type stalledTimers struct{ *clocktesting.FakeClock }

func (stalledTimers) AfterFunc(time.Duration, func()) clock.Timer {
	return clocktesting.NewFakeClock(time.Time{}).NewTimer(time.Hour)
}

// Err and Lock.Term compare the clock with ValidUntil themselves: the Term
// is over at ValidUntil even when the timer's goroutine has not run.
func TestErrAndTermCheckTheClockThemselves(t *testing.T) {
	f := newFixtureWithClock(t, func(c *clocktesting.FakeClock) clock.WithDelayedExecution { return stalledTimers{c} })
	term := f.lead()
	f.clock.SetTime(term.ValidUntil().Add(-time.Millisecond))
	if err := term.Err(); err != nil {
		t.Fatalf("1ms before ValidUntil: %v", err)
	}
	f.clock.SetTime(term.ValidUntil())
	if term.Context().Err() != nil {
		t.Fatal("the stalled timer ended the Term: the test proves nothing")
	}
	if err := term.Err(); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "not renewed in time") {
		t.Fatalf("Err at ValidUntil = %v", err)
	}
	if term.Context().Err() == nil {
		t.Fatal("Err found the window over but left the Context live")
	}
	if f.lock.Term() != nil {
		t.Fatal("Lock.Term returned a Term whose window is over")
	}

	g := newFixtureWithClock(t, func(c *clocktesting.FakeClock) clock.WithDelayedExecution { return stalledTimers{c} })
	second := g.lead()
	g.clock.SetTime(second.ValidUntil())
	if g.lock.Term() != nil {
		t.Fatal("Lock.Term returned a Term whose window is over")
	}
	if !errors.Is(context.Cause(second.Context()), ErrLost) {
		t.Fatalf("after Lock.Term found the window over: cause %v", context.Cause(second.Context()))
	}
}

// A Lock never creates the Lease, even when it has never seen one (a
// restarted process): client-go's elector waits until frontdesk's
// controller has created it, then leads with the next token.
func TestTheElectorWaitsForTheLeaseInsteadOfCreatingIt(t *testing.T) {
	f := newFixture(t)
	if err := f.cs.CoordinationV1().Leases(ns).Delete(context.Background(), "op", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := f.lock.Create(context.Background(), f.record("me", 0))
	if !errors.Is(err, ErrNoLease) || !strings.Contains(err.Error(), "declare a DistributedLock") {
		t.Fatalf("Create = %v", err)
	}

	lk, err := New(f.cs.CoordinationV1(), Config{Namespace: ns, Name: "op", Identity: "fresh", Clock: clock.RealClock{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lk, LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 20 * time.Millisecond,
		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	go le.Run(ctx)
	wait, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if _, err := lk.WaitForTerm(wait); err == nil {
		t.Fatal("led without a Lease")
	}
	if _, err := f.cs.CoordinationV1().Leases(ns).Get(ctx, "op", metav1.GetOptions{}); err == nil {
		t.Fatal("the elector created the Lease")
	}
	lease := freeLease()
	lease.Spec.LeaseTransitions = ptr.To[int32](4) // the lock's token floor
	if _, err := f.cs.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait, stop = context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	term, err := lk.WaitForTerm(wait)
	if err != nil {
		t.Fatalf("no Term once the Lease exists: %v", err)
	}
	if term.Token() != 5 {
		t.Fatalf("token %d, want 5 (the floor 4, plus one)", term.Token())
	}
}
