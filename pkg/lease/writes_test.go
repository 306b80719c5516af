package lease

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// lockLease is a Lease of lock "billing" held by holder with token, as the
// controller keeps it.
func lockLease(holder string, token int32) *coordinationv1.Lease {
	l := heldLease(holder, token)
	if holder == "" {
		l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil, nil
	}
	l.Labels = map[string]string{locksv1alpha1.LockNameLabel: "billing"}
	l.Annotations = map[string]string{locksv1alpha1.LockUIDAnnotation: "uid-1", locksv1alpha1.LeaseDurationAnnotation: "10"}
	return l
}

// apply applies a JSON patch to l as the apiserver does: an error is a
// failed test (or a removal of something absent), and nothing is written.
func apply(l *coordinationv1.Lease, p *Patch) (*coordinationv1.Lease, error) {
	raw, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	patch, err := jsonpatch.DecodePatch(p.Bytes())
	if err != nil {
		return nil, err
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		return nil, err
	}
	out := &coordinationv1.Lease{}
	return out, json.Unmarshal(patched, out)
}

func mustApply(t *testing.T, l *coordinationv1.Lease, p *Patch) *coordinationv1.Lease {
	t.Helper()
	out, err := apply(l, p)
	if err != nil {
		t.Fatalf("patch %s: %v", p, err)
	}
	return out
}

var now = time.Date(2026, 12, 6, 10, 0, 5, 0, time.UTC)

func TestGrantIsACompareAndSwapOnTheToken(t *testing.T) {
	free := lockLease("", 4)
	grant := func(identity string) *Patch {
		p, err := GrantPatch(free, identity, "user=test", "", "n-"+identity, time.Second, now)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	won := mustApply(t, free, grant("b"))
	if Holder(won) != "b" || Token(won) != 5 || won.Annotations[locksv1alpha1.GrantNonceAnnotation] != "n-b" {
		t.Fatalf("grant: holder %q token %d", Holder(won), Token(won))
	}
	if d := *won.Spec.LeaseDurationSeconds; d != 10 {
		t.Errorf("the grant carries %ds, want the manager's 10s", d)
	}
	if _, err := apply(won, grant("c")); !errors.Is(err, jsonpatch.ErrTestFailed) {
		t.Errorf("a second grant judged on the same token: %v, want a failed test", err)
	}
	// A change of the queue between the judgement and the write does not
	// stop the grant.
	queued := register(t, free, Waiter{Principal: "user=w", Identity: "w", Ticket: "tw"})
	if out := mustApply(t, queued, grant("b")); Token(out) != 5 || Position(out, "tw") != 0 {
		t.Errorf("grant over a queue change: token %d, queue %v", Token(out), tickets(out))
	}
	// A Lease the lock no longer controls (retired) or being deleted.
	retired := free.DeepCopy()
	delete(retired.Annotations, locksv1alpha1.LockUIDAnnotation)
	if _, err := apply(retired, grant("b")); err == nil {
		t.Errorf("granted on a Lease the lock no longer controls")
	}
}

func TestNobodyGrantsOnAHeldLease(t *testing.T) {
	if _, err := GrantPatch(lockLease("a", 4), "b", "user=test", "", "n", time.Second, now); err == nil {
		t.Errorf("a grant patch on a held Lease")
	}
	// The controller ends a lapsed grant: the Lease is free, the token
	// kept, the mark naming it.
	held := lockLease("a", 4)
	held.Annotations[locksv1alpha1.GrantNonceAnnotation] = "n-a"
	lapsed := mustApply(t, held, LapsePatch(held))
	if Holder(lapsed) != "" || Token(lapsed) != 4 || !Lapsed(lapsed) || lapsed.Annotations[locksv1alpha1.GrantNonceAnnotation] != "" {
		t.Fatalf("lapsed: holder %q token %d lapsed %v marks %v", Holder(lapsed), Token(lapsed), Lapsed(lapsed), lapsed.Annotations)
	}
	p, err := GrantPatch(lapsed, "b", "user=test", "", "n", time.Second, now)
	if err != nil {
		t.Fatal(err)
	}
	if out := mustApply(t, lapsed, p); Holder(out) != "b" || Token(out) != 5 || Lapsed(out) {
		t.Errorf("the grant after a lapse: holder %q token %d lapsed %v", Holder(out), Token(out), Lapsed(out))
	}
	// The lapsed holder's renewal, judged on its own copy, does not land.
	if _, err := apply(lapsed, RenewPatch(held, now)); err == nil {
		t.Errorf("renewed a grant the controller ended as lapsed")
	}
}

func TestRenewLandsWhateverTheQueueDid(t *testing.T) {
	held := lockLease("a", 4)
	later := register(t, held, Waiter{Principal: "user=b", Identity: "b", Ticket: "tb"}, Waiter{Principal: "user=c", Identity: "c", Ticket: "tc"})
	out := mustApply(t, later, RenewPatch(held, now))
	if !out.Spec.RenewTime.Time.Equal(now) || Holder(out) != "a" || Token(out) != 4 {
		t.Errorf("renewal: %v", out.Spec)
	}
	taken := lockLease("b", 5)
	if _, err := apply(taken, RenewPatch(held, now)); err == nil {
		t.Errorf("renewed a grant that was taken over")
	}
}

func TestReleaseAndHandOff(t *testing.T) {
	held := lockLease("a", 4)
	held.Annotations[locksv1alpha1.GrantNonceAnnotation] = "n"
	released := mustApply(t, held, ReleasePatch(held))
	if Holder(released) != "" || Token(released) != 4 || released.Spec.RenewTime != nil || released.Annotations[locksv1alpha1.GrantNonceAnnotation] != "" {
		t.Errorf("release: %v %v", released.Spec, released.Annotations)
	}
	queued := register(t, held, Waiter{Principal: "user=b", Identity: "b", Ticket: "tb"}, Waiter{Principal: "user=c", Identity: "c", Ticket: "tc"}, Waiter{Principal: "user=d", Identity: "d", Ticket: "td"})
	p, head, ok, err := HandOffPatch(queued, "a", time.Second, now)
	if err != nil || !ok || head.Ticket != "tb" {
		t.Fatalf("hand-off: %v %v %+v", ok, err, head)
	}
	out := mustApply(t, queued, p)
	if Holder(out) != "b" || Token(out) != 5 || out.Annotations[locksv1alpha1.TicketAnnotation] != "tb" || out.Annotations[locksv1alpha1.HandedOffByAnnotation] != "a" {
		t.Errorf("hand-off wrote holder %q token %d marks %v", Holder(out), Token(out), out.Annotations)
	}
	if !slices.Equal(tickets(out), []string{"tc", "td"}) || !slices.Equal(front(out), []string{"tc", "td"}) {
		t.Errorf("after the hand-off: queue %v front %v", tickets(out), front(out))
	}
	// The head left meanwhile: the hand-off does not land on its place.
	left := merge(t, queued, mustWithdrawal(t, "tb"))
	if _, err := apply(left, p); err == nil {
		t.Errorf("handed the lock to a waiter that had left")
	}
	if _, _, ok, _ := HandOffPatch(held, "a", time.Second, now); ok {
		t.Errorf("a hand-off with nobody queued")
	}
	// A grant after the hand-off drops its marks.
	g, err := GrantPatch(mustApply(t, out, ReleasePatch(out)), "x", "user=test", "", "n2", time.Second, now)
	if err != nil {
		t.Fatal(err)
	}
	if after := mustApply(t, mustApply(t, out, ReleasePatch(out)), g); after.Annotations[locksv1alpha1.TicketAnnotation] != "" {
		t.Errorf("a grant kept the ticket of the hand-off before it")
	}
}

func TestGrantOfAWaiterLeavesTheQueue(t *testing.T) {
	free := register(t, lockLease("", 4), Waiter{Principal: "user=b", Identity: "b", Ticket: "tb"}, Waiter{Principal: "user=c", Identity: "c", Ticket: "tc"},
		Waiter{Principal: "user=d", Identity: "d", Ticket: "td"})
	p, err := GrantPatch(free, "c", "user=test", "tc", "n", time.Second, now)
	if err != nil {
		t.Fatal(err)
	}
	out := mustApply(t, free, p)
	if !slices.Equal(tickets(out), []string{"tb", "td"}) || !slices.Equal(front(out), []string{"tb", "td"}) {
		t.Errorf("after c took the lock: queue %v front %v (c's place gone, nobody else's)", tickets(out), front(out))
	}
}

func TestBreakAndTheEndOfTheRange(t *testing.T) {
	held := lockLease("a", 4)
	p, err := BreakPatch(held)
	if err != nil {
		t.Fatal(err)
	}
	out := mustApply(t, held, p)
	if Holder(out) != "" || Token(out) != 5 {
		t.Errorf("break: holder %q token %d", Holder(out), Token(out))
	}
	last := lockLease("", math.MaxInt32)
	if _, err := GrantPatch(last, "b", "user=test", "", "n", time.Second, now); !errors.Is(err, ErrTokensExhausted) {
		t.Errorf("grant at the end of the range: %v", err)
	}
	if _, err := BreakPatch(last); !errors.Is(err, ErrTokensExhausted) {
		t.Errorf("break at the end of the range: %v", err)
	}
}

func TestLapseEndsOnlyTheRecordJudged(t *testing.T) {
	held := lockLease("a", 4)
	out := mustApply(t, held, LapsePatch(held))
	if !Lapsed(out) {
		t.Fatalf("not lapsed after the mark: %v", out.Annotations)
	}
	renewed := mustApply(t, held, RenewPatch(held, now))
	if _, err := apply(renewed, LapsePatch(held)); err == nil {
		t.Errorf("ended as lapsed a grant renewed since it was judged")
	}
	free := lockLease("", 4)
	free.Spec.LeaseTransitions = ptr.To[int32](4)
	if Lapsed(free) {
		t.Errorf("a free Lease counts as lapsed")
	}
}

func TestGrantDuration(t *testing.T) {
	l := lockLease("a", 1)
	if d := GrantDuration(l, time.Minute); d != 10*time.Second {
		t.Errorf("with the annotation: %s", d)
	}
	delete(l.Annotations, locksv1alpha1.LeaseDurationAnnotation)
	if d := GrantDuration(l, time.Minute); d != 15*time.Second {
		t.Errorf("from the spec: %s", d)
	}
	l.Spec.LeaseDurationSeconds = nil
	if d := GrantDuration(l, time.Minute); d != time.Minute {
		t.Errorf("fallback: %s", d)
	}
	// The annotation is read as the lease-guard policy reads it: a number
	// of the grammar within int32, else not at all.
	l.Spec.LeaseDurationSeconds = ptr.To[int32](15)
	for value, want := range map[string]time.Duration{
		"30": 30 * time.Second, "2147483647": math.MaxInt32 * time.Second,
		"0": 15 * time.Second, "030": 15 * time.Second, "+30": 15 * time.Second, "-30": 15 * time.Second,
		"2147483648": 15 * time.Second, "999999999999999999": 15 * time.Second,
	} {
		l.Annotations[locksv1alpha1.LeaseDurationAnnotation] = value
		if d := GrantDuration(l, time.Minute); d != want {
			t.Errorf("with the annotation %q: %s, want %s", value, d, want)
		}
	}
}

func TestEpochReadsTheGrammar(t *testing.T) {
	l := lockLease("a", 1)
	for value, want := range map[string]int64{
		"": 0, "0": 0, "1": 1, "999999999999999999": 999999999999999999,
		"007": 0, "+1": 0, "-1": 0, "-0": 0, "1000000000000000000": 0, "9223372036854775807": 0,
	} {
		l.Annotations[locksv1alpha1.TokenEpochAnnotation] = value
		if got := Epoch(l); got != want {
			t.Errorf("Epoch with token-epoch %q: %d, want %d", value, got, want)
		}
	}
}

func TestPatchDidNotApply(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"a failed test", apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", "testing value failed", 0, false), true},
		{"an invalid result", apierrors.NewInvalid(schema.GroupKind{Group: "coordination.k8s.io", Kind: "Lease"}, "billing",
			field.ErrorList{field.Invalid(field.NewPath("spec", "leaseDurationSeconds"), -1, "must be positive")}), false},
		{"a conflict", apierrors.NewConflict(gr, "billing", errors.New("changed")), false},
		{"a refusal", apierrors.NewForbidden(gr, "billing", errors.New("no")), false},
		{"no answer", errors.New("connection reset"), false},
	}
	for _, tc := range cases {
		if got := PatchDidNotApply(tc.err); got != tc.want {
			t.Errorf("%s: PatchDidNotApply = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestTokenEpochs(t *testing.T) {
	l := lockLease("a", math.MaxInt32)
	if !Exhausted(l) || Token(l) != math.MaxInt32 {
		t.Fatalf("at the end of epoch 0: exhausted %v token %d", Exhausted(l), Token(l))
	}
	next := NewEpoch(l)
	if Holder(next) != "" || Epoch(next) != 1 || Token(next) != EpochSize || Exhausted(next) {
		t.Errorf("new epoch: holder %q epoch %d token %d", Holder(next), Epoch(next), Token(next))
	}
	p, err := GrantPatch(next, "b", "user=test", "", "n", time.Second, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := Token(mustApply(t, next, p)); got != EpochSize+1 || got <= Token(l) {
		t.Errorf("the first grant of epoch 1: token %d", got)
	}
	raised, err := RaiseToFloor(lockLease("", 3), 3*EpochSize+7)
	if err != nil || Token(raised) != 3*EpochSize+7 || Epoch(raised) != 3 {
		t.Errorf("a floor in epoch 3: token %d epoch %d %v", Token(raised), Epoch(raised), err)
	}
	bad := lockLease("", 5)
	bad.Annotations[locksv1alpha1.TokenEpochAnnotation] = "not a number"
	if Token(bad) != 5 {
		t.Errorf("a malformed epoch: token %d", Token(bad))
	}
}

func TestProvenDeadPatchEndsOnlyTheGrantOfThePrincipalJudged(t *testing.T) {
	held := lockLease("a", 4)
	if held.Annotations == nil {
		held.Annotations = map[string]string{}
	}
	held.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = "pod=u1 user=system:serviceaccount:ns:app"
	out := mustApply(t, held, ProvenDeadPatch(held))
	if !Lapsed(out) || Holder(out) != "" || out.Annotations[locksv1alpha1.HolderPrincipalAnnotation] != "" {
		t.Fatalf("not ended as lapsed, its principal cleared: holder %q, %v", Holder(out), out.Annotations)
	}
	other := held.DeepCopy()
	other.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = "pod=u2 user=system:serviceaccount:ns:app"
	if _, err := apply(other, ProvenDeadPatch(held)); err == nil {
		t.Error("ended a grant bound to another principal than the one judged")
	}
	renewed := mustApply(t, held, RenewPatch(held, now))
	if _, err := apply(renewed, ProvenDeadPatch(held)); err == nil {
		t.Error("ended a grant renewed since it was judged")
	}
}
