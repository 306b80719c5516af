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
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"
)

const ns = "ops"

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// fixture is a Lock on a fake clientset with a fake clock, and the Lease
// as frontdesk's controller creates it (free, token 0). The lease duration
// is 2s, so the default safety margin is 140ms.
type fixture struct {
	t     *testing.T
	cs    *fake.Clientset
	clock *clocktesting.FakeClock
	lock  *Lock
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWithClock(t, nil)
}

// newFixtureWithClock builds the fixture's Lock on clk, or on the fake
// clock itself when clk is nil.
func newFixtureWithClock(t *testing.T, clk func(*clocktesting.FakeClock) clock.WithDelayedExecution) *fixture {
	t.Helper()
	f := &fixture{t: t, cs: fake.NewClientset(freeLease()), clock: clocktesting.NewFakeClock(t0)}
	var c clock.WithDelayedExecution = f.clock
	if clk != nil {
		c = clk(f.clock)
	}
	var err error
	if f.lock, err = New(f.cs.CoordinationV1(), Config{Namespace: ns, Name: "op", Identity: "me", Clock: c}); err != nil {
		t.Fatal(err)
	}
	return f
}

// freeLease is the Lease as frontdesk's controller creates it for a lock:
// nobody holds it, token 0.
func freeLease() *coordinationv1.Lease {
	return leasetest.MakeLease("op", ns).Duration(2).Token(0).Obj()
}

// record is what client-go writes when holder leads with token.
func (f *fixture) record(holder string, token int) resourcelock.LeaderElectionRecord {
	now := metav1.NewTime(f.clock.Now())
	return resourcelock.LeaderElectionRecord{HolderIdentity: holder, LeaseDurationSeconds: 2,
		AcquireTime: now, RenewTime: now, LeaderTransitions: token}
}

// lead takes the free Lease over as client-go's first leader does (read,
// then write the next token, 1).
func (f *fixture) lead() *Term {
	f.t.Helper()
	if err := f.renew(1); err != nil {
		f.t.Fatal(err)
	}
	term := f.lock.Term()
	if term == nil {
		f.t.Fatal("no Term after a successful takeover")
	}
	return term
}

// renew reads and writes the Lease as client-go's slow path does.
func (f *fixture) renew(token int) error {
	if _, _, err := f.lock.Get(context.Background()); err != nil {
		return err
	}
	return f.lock.Update(context.Background(), f.record("me", token))
}

// setLease edits the stored Lease as another party would.
func (f *fixture) setLease(edit func(l *coordinationv1.Lease)) {
	f.t.Helper()
	leases := f.cs.CoordinationV1().Leases(ns)
	l, err := leases.Get(context.Background(), "op", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	edit(l)
	if _, err := leases.Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// stepDuringWrites makes every Lease create or update take d on the fake
// clock, as a slow answer would.
func (f *fixture) stepDuringWrites(d time.Duration) {
	step := func(k8stesting.Action) (bool, runtime.Object, error) {
		f.clock.Step(d)
		return false, nil, nil
	}
	f.cs.PrependReactor("create", "leases", step)
	f.cs.PrependReactor("update", "leases", step)
}

// ended waits for ctx to end (the safe-window timer hands over to a
// goroutine) and returns its cause.
func ended(t *testing.T, ctx context.Context) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the Term's Context did not end")
		return nil
	}
}

// live fails unless ctx is still live, giving an expiry goroutine a moment
// to run if one was (wrongly) started.
func live(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatalf("%s: the Term ended early: %v", when, context.Cause(ctx))
	case <-time.After(20 * time.Millisecond):
	}
}

func TestTokenIsWhatTheApiserverStored(t *testing.T) {
	f := newFixture(t)
	// The apiserver answers with the stored object; say a mutating webhook
	// raised the token on the way in.
	f.cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		l.Spec.LeaseTransitions = ptr.To[int32](7)
		return true, l, nil
	})
	term := f.lead()
	if term.Token() != 7 {
		t.Fatalf("Token() = %d, want 7 (the apiserver's answer, not client-go's record)", term.Token())
	}
	if tok, ok := f.lock.Token(); !ok || tok != 7 {
		t.Fatalf("Lock.Token() = %d, %v", tok, ok)
	}
}

// A Term's fencing key names the lock over the election Lease: by default
// the lock named like the Lease, else Config.LockName; in both, the Lease's
// namespace.
func TestTermFencingKeyNamesTheLock(t *testing.T) {
	if got, want := newFixture(t).lead().FencingKey(), ns+"/op"; got != want {
		t.Errorf("FencingKey = %q, want %q (the lock named like the Lease)", got, want)
	}
	f := newFixture(t)
	var err error
	if f.lock, err = New(f.cs.CoordinationV1(), Config{Namespace: ns, Name: "op", LockName: "op-fence", Identity: "me", Clock: f.clock}); err != nil {
		t.Fatal(err)
	}
	if got, want := f.lead().FencingKey(), ns+"/op-fence"; got != want {
		t.Errorf("FencingKey = %q, want %q (Config.LockName)", got, want)
	}
}

func TestTermEndsAtTheSafeWindowCountedFromTheStartOfTheWrite(t *testing.T) {
	f := newFixture(t)
	f.stepDuringWrites(400 * time.Millisecond) // each answer takes 400ms
	term := f.lead()
	// 2s lease - 140ms margin, from t0 (when the write was sent), not from
	// t0+400ms (when it was answered).
	if want := t0.Add(1860 * time.Millisecond); !term.ValidUntil().Equal(want) {
		t.Fatalf("ValidUntil = %s, want %s", term.ValidUntil(), want)
	}
	f.clock.SetTime(t0.Add(1859 * time.Millisecond))
	live(t, term.Context(), "1ms before the window ends")
	f.clock.SetTime(t0.Add(1860 * time.Millisecond))
	cause := ended(t, term.Context())
	if !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), "not renewed") {
		t.Fatalf("cause = %v", cause)
	}
	if f.lock.Term() != nil {
		t.Fatal("an ended Term is still current")
	}
}

func TestRenewalsMoveTheWindow(t *testing.T) {
	f := newFixture(t)
	term := f.lead()
	f.clock.SetTime(t0.Add(time.Second))
	if err := f.renew(1); err != nil {
		t.Fatal(err)
	}
	if f.lock.Term() != term {
		t.Fatal("a renewal under the same token began a new Term")
	}
	f.clock.SetTime(t0.Add(2500 * time.Millisecond)) // past the first window
	live(t, term.Context(), "after a renewal")
	f.clock.SetTime(t0.Add(2860 * time.Millisecond))
	_ = ended(t, term.Context())
}

func TestFailedRenewalsDoNotEndTheTermBeforeItsWindow(t *testing.T) {
	f := newFixture(t)
	term := f.lead()
	f.cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection reset")
	})
	f.clock.SetTime(t0.Add(time.Second))
	if err := f.renew(1); err == nil {
		t.Fatal("the renewal was meant to fail")
	}
	live(t, term.Context(), "after one failed renewal")
	f.clock.SetTime(t0.Add(1860 * time.Millisecond))
	_ = ended(t, term.Context())
}

func TestAnAnswerTooLateBeginsNoTerm(t *testing.T) {
	f := newFixture(t)
	f.stepDuringWrites(1900 * time.Millisecond)
	if err := f.renew(1); err != nil {
		t.Fatal(err)
	}
	if f.lock.Term() != nil {
		t.Fatal("a Term began from an answer that came after its own window")
	}
	if _, ok := f.lock.Token(); ok {
		t.Fatal("Token() reported a token without a Term")
	}
	if cause := context.Cause(f.lock.Context()); !errors.Is(cause, ErrNotLeader) {
		t.Fatalf("Context() without a Term: cause %v, want ErrNotLeader", cause)
	}
}

func TestAnotherHolderOrTokenOnTheLeaseEndsTheTerm(t *testing.T) {
	f := newFixture(t)
	term := f.lead()
	// Broken by an admin: the token goes up under this holder.
	f.setLease(func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To[int32](5) })
	if _, _, err := f.lock.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cause := ended(t, term.Context()); !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), "fencing token 5, not 1") {
		t.Fatalf("cause = %v", cause)
	}
	// client-go renews with the token it read: a new Term, token 5.
	if err := f.lock.Update(context.Background(), f.record("me", 5)); err != nil {
		t.Fatal(err)
	}
	next := f.lock.Term()
	if next == nil || next.Token() != 5 {
		t.Fatalf("after renewing under token 5: Term %+v", next)
	}

	f.setLease(func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("other"), ptr.To[int32](6)
	})
	if _, _, err := f.lock.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cause := ended(t, next.Context()); !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), `held by "other" (fencing token 6)`) {
		t.Fatalf("cause = %v", cause)
	}
}

func TestReleaseEndsTheTermBeforeItIsSent(t *testing.T) {
	f := newFixture(t)
	term := f.lead()
	var doneWhenSent bool
	f.cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		doneWhenSent = term.Context().Err() != nil
		return false, nil, nil
	})
	if _, _, err := f.lock.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	release := f.record("", 0) // client-go's release: no holder, 1s
	release.LeaseDurationSeconds = 1
	if err := f.lock.Update(context.Background(), release); err != nil {
		t.Fatal(err)
	}
	if !doneWhenSent {
		t.Fatal("the Term was still live when the release was sent")
	}
	if cause := context.Cause(term.Context()); !errors.Is(cause, ErrReleased) {
		t.Fatalf("cause = %v, want ErrReleased", cause)
	}
}

func TestClientGoStoppingEndsTheTerm(t *testing.T) {
	f := newFixture(t)
	term := f.lead()
	f.lock.RecordEvent("became leader")
	live(t, term.Context(), "after became leader")
	f.lock.RecordEvent("stopped leading")
	if cause := context.Cause(term.Context()); !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), "stopped leading") {
		t.Fatalf("cause = %v", cause)
	}
}

func TestADeletedLeaseIsNeitherRenewedNorCreatedAgain(t *testing.T) {
	f := newFixture(t)
	term := f.lead()
	f.setLease(func(l *coordinationv1.Lease) {
		l.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
		l.Finalizers = []string{"locks.frontdesk.dev/fencing-token"}
	})
	err := f.renew(1)
	if cause := context.Cause(term.Context()); !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), "being deleted") {
		t.Fatalf("cause = %v", cause)
	}
	if err == nil || !strings.Contains(err.Error(), "being deleted") {
		t.Fatalf("renewing a Lease being deleted: %v", err)
	}
	if f.lock.Term() != nil {
		t.Fatal("a Term began on a Lease being deleted")
	}

	if err := f.cs.CoordinationV1().Leases(ns).Delete(context.Background(), "op", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.lock.Get(context.Background()); err == nil {
		t.Fatal("Get found a deleted Lease")
	}
	err = f.lock.Create(context.Background(), f.record("me", 0))
	if !errors.Is(err, ErrNoLease) || !strings.Contains(err.Error(), "existed (fencing token 1) and was deleted") {
		t.Fatalf("creating a Lease that existed before: %v", err)
	}
	if _, err := f.cs.CoordinationV1().Leases(ns).Get(context.Background(), "op", metav1.GetOptions{}); err == nil {
		t.Fatal("the Lease was created again")
	}
}

// The real client-go LeaderElector drives the Lock: the Term begins before
// OnStartedLeading with the stored token and ends with a release. The next
// leader's token is one higher.
func TestWithClientGoLeaderElector(t *testing.T) {
	cs := fake.NewClientset(freeLease())
	run := func(identity string) (token int64, cause error) {
		t.Helper()
		lk, err := New(cs.CoordinationV1(), Config{Namespace: ns, Name: "op", Identity: identity, Clock: clock.RealClock{}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var term *Term
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lk, LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { term = lk.Term(); cancel() },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { le.Run(ctx); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the elector did not lead and release")
		}
		if term == nil {
			t.Fatal("no Term in OnStartedLeading")
		}
		return term.Token(), context.Cause(term.Context())
	}
	first, cause := run("a")
	if !errors.Is(cause, ErrReleased) {
		t.Fatalf("after client-go released: cause %v", cause)
	}
	second, _ := run("b")
	stored, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "op", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if first != 1 || second != 2 || int64(*stored.Spec.LeaseTransitions) != second {
		t.Fatalf("tokens %d then %d, Lease at %d; want 1, 2, 2", first, second, *stored.Spec.LeaseTransitions)
	}
}
