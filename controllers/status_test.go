package controllers

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func makeLease(holder string, transitions, duration int32, acquire, renew time.Time) *coordinationv1.Lease {
	b := testutil.MakeLease("billing", "ns").Token(transitions).Duration(duration)
	if holder != "" {
		b.Held(holder, acquire, renew)
	}
	return b.Obj()
}

// brokenLease is l as a break left it: marked with the token it raised.
func brokenLease(l *coordinationv1.Lease) *coordinationv1.Lease {
	l.Annotations = map[string]string{locksv1alpha1.BrokenAtAnnotation: strconv.FormatInt(lease.Token(l), 10)}
	return l
}

func revokedLease(l *coordinationv1.Lease) *coordinationv1.Lease {
	l.Annotations = map[string]string{
		locksv1alpha1.CandidateGrantAnnotation: *l.Spec.HolderIdentity,
		locksv1alpha1.RevokedAnnotation:        *l.Spec.HolderIdentity,
	}
	return l
}

func heldStatus(holder string, token int64, acquire, renew time.Time, heldReason string) locksv1alpha1.DistributedLockStatus {
	st := locksv1alpha1.DistributedLockStatus{Holder: holder, FencingToken: token, LeaseName: "billing"}
	if holder != "" {
		st.AcquireTime = new(metav1.NewMicroTime(acquire))
		st.RenewTime = new(metav1.NewMicroTime(renew))
	}
	status := metav1.ConditionFalse
	if heldReason == locksv1alpha1.ReasonHeld {
		status = metav1.ConditionTrue
	}
	st.Conditions = []metav1.Condition{
		{Type: locksv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: locksv1alpha1.ReasonLeaseReady, LastTransitionTime: metav1.NewTime(t0)},
		{Type: locksv1alpha1.ConditionHeld, Status: status, Reason: heldReason, LastTransitionTime: metav1.NewTime(t0)},
	}
	return st
}

func TestDeriveStatus(t *testing.T) {
	ready := func(l *coordinationv1.Lease) leaseState {
		return leaseState{lease: l, ready: true, reason: locksv1alpha1.ReasonLeaseReady, message: "in sync"}
	}
	cases := []struct {
		name         string
		old          locksv1alpha1.DistributedLockStatus
		spec         int32
		lease        leaseState
		observedAgo  time.Duration // how long before "now" the record was first observed
		wantHolder   string
		wantToken    int64
		wantHeld     metav1.ConditionStatus
		wantReason   string
		wantReady    metav1.ConditionStatus
		wantEvents   []string
		wantExpireIn time.Duration
		// renewFollows: the status changes for another reason (holder,
		// token, acquireTime, a condition), so its renewTime becomes the
		// record's; otherwise it stays as it was.
		renewFollows bool
		highWater    int64
	}{
		{
			name:         "free lease: not held, token mirrored",
			renewFollows: true,
			lease:        ready(makeLease("", 4, 15, t0, t0)),
			wantToken:    4,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonNotHeld,
			wantReady:    metav1.ConditionTrue,
		},
		{
			name:         "grant on a free lock: held and Acquired",
			renewFollows: true,
			old:          heldStatus("", 4, t0, t0, locksv1alpha1.ReasonNotHeld),
			lease:        ready(makeLease("a", 5, 15, t0, t0)),
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventAcquired},
			wantExpireIn: 15 * time.Second,
		},
		{
			name:         "held and observed 10s ago: 5s left, no event",
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(makeLease("a", 5, 15, t0, t0)),
			observedAgo:  10 * time.Second,
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantExpireIn: 5 * time.Second,
		},
		{
			name: "holder's renewTime far in the past is irrelevant: only observation counts",
			old:  heldStatus("a", 5, t0.Add(-time.Hour), t0.Add(-time.Hour), locksv1alpha1.ReasonHeld),
			// The holder's clock is an hour behind ours; we saw the record 1s ago.
			lease:        ready(makeLease("a", 5, 15, t0.Add(-time.Hour), t0.Add(-time.Hour))),
			observedAgo:  time.Second,
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantExpireIn: 14 * time.Second,
		},
		{
			name:         "no renewal observed for the duration: Expired once",
			renewFollows: true,
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(makeLease("a", 5, 15, t0, t0)),
			observedAgo:  15 * time.Second,
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonExpired,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventExpired},
		},
		{
			name:        "still expired: no second event",
			old:         heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonExpired),
			lease:       ready(makeLease("a", 5, 15, t0, t0)),
			observedAgo: time.Minute,
			wantHolder:  "a",
			wantToken:   5,
			wantHeld:    metav1.ConditionFalse,
			wantReason:  locksv1alpha1.ReasonExpired,
			wantReady:   metav1.ConditionTrue,
		},
		{
			name:         "lease duration in the Lease wins over the lock's",
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			spec:         60,
			lease:        ready(makeLease("a", 5, 2, t0, t0)),
			observedAgo:  time.Second,
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantExpireIn: time.Second,
		},
		{
			name:         "another holder granted while the old one had not released: TakenOver",
			renewFollows: true,
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonExpired),
			lease:        ready(makeLease("b", 6, 15, t0, t0)),
			wantHolder:   "b",
			wantToken:    6,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventTakenOver},
			wantExpireIn: 15 * time.Second,
		},
		{
			name:         "holder cleared: Released",
			renewFollows: true,
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(makeLease("", 5, 15, t0, t0)),
			wantToken:    5,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonNotHeld,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventReleased},
		},
		{
			name:         "holder cleared and token raised by a break: Broken, not Released",
			renewFollows: true,
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(brokenLease(makeLease("", 6, 15, t0, t0))),
			wantToken:    6,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonNotHeld,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventBroken},
		},
		{
			// The controller was down while holders came and went: nothing
			// was broken.
			name:         "holder cleared and token raised with no break: Released, not Broken",
			renewFollows: true,
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(makeLease("", 9, 15, t0, t0)),
			wantToken:    9,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonNotHeld,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventReleased},
		},
		{
			name:         "a free lock broken: Broken",
			renewFollows: true,
			old:          heldStatus("", 5, t0, t0, locksv1alpha1.ReasonNotHeld),
			lease:        ready(brokenLease(makeLease("", 6, 15, t0, t0))),
			wantToken:    6,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonNotHeld,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventBroken},
		},
		{
			name:         "a new holder with a token already granted: InvalidGrant, not held",
			renewFollows: true,
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(makeLease("rogue", 5, 15, t0, t0)),
			wantHolder:   "rogue",
			wantToken:    5,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonInvalidGrant,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventInvalidGrant},
			wantExpireIn: 15 * time.Second,
		},
		{
			name:         "an invalid grant stays invalid while it renews, with no second event",
			old:          heldStatus("rogue", 5, t0, t0, locksv1alpha1.ReasonInvalidGrant),
			lease:        ready(makeLease("rogue", 5, 15, t0, t0.Add(5*time.Second))),
			wantHolder:   "rogue",
			wantToken:    5,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonInvalidGrant,
			wantReady:    metav1.ConditionTrue,
			wantExpireIn: 15 * time.Second,
		},
		{
			name:         "a revoked candidate grant: Revoked, not held, no event from status",
			renewFollows: true,
			old:          heldStatus("web-0_u", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(revokedLease(makeLease("web-0_u", 5, 15, t0, t0.Add(time.Second)))),
			wantHolder:   "web-0_u",
			wantToken:    5,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonRevoked,
			wantReady:    metav1.ConditionTrue,
			observedAgo:  time.Second,
		},
		{
			name:       "token never decreases below the recorded one",
			old:        heldStatus("", 7, t0, t0, locksv1alpha1.ReasonNotHeld),
			lease:      ready(makeLease("", 3, 15, t0, t0)),
			wantToken:  7,
			wantHeld:   metav1.ConditionFalse,
			wantReason: locksv1alpha1.ReasonNotHeld,
			wantReady:  metav1.ConditionTrue,
		},
		{
			name:         "token never below the highest seen in any Lease event (a hand edit wound it back)",
			renewFollows: true,
			old:          heldStatus("", 4, t0, t0, locksv1alpha1.ReasonNotHeld),
			lease:        ready(makeLease("", 3, 15, t0, t0)),
			highWater:    6,
			wantToken:    6,
			wantHeld:     metav1.ConditionFalse,
			wantReason:   locksv1alpha1.ReasonNotHeld,
			wantReady:    metav1.ConditionTrue,
		},
		{
			name:       "lease missing: holder cleared, token kept, not ready",
			old:        heldStatus("a", 7, t0, t0, locksv1alpha1.ReasonHeld),
			lease:      leaseState{reason: locksv1alpha1.ReasonLeaseMissing, message: "creating"},
			wantToken:  7,
			wantHeld:   metav1.ConditionFalse,
			wantReason: locksv1alpha1.ReasonLeaseUnavailable,
			wantReady:  metav1.ConditionFalse,
		},
		{
			name:         "first renewal of a grant: no event",
			old:          heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld),
			lease:        ready(makeLease("a", 5, 15, t0, t0.Add(5*time.Second))),
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantExpireIn: 15 * time.Second,
		},
		{
			name:         "later renewals: no event",
			old:          heldStatus("a", 5, t0, t0.Add(5*time.Second), locksv1alpha1.ReasonHeld),
			lease:        ready(makeLease("a", 5, 15, t0, t0.Add(10*time.Second))),
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantExpireIn: 15 * time.Second,
		},
		{
			name:         "renewal after the lease lapsed: Renewed warning",
			renewFollows: true,
			old:          heldStatus("a", 5, t0, t0.Add(5*time.Second), locksv1alpha1.ReasonExpired),
			lease:        ready(makeLease("a", 5, 15, t0, t0.Add(30*time.Second))),
			wantHolder:   "a",
			wantToken:    5,
			wantHeld:     metav1.ConditionTrue,
			wantReason:   locksv1alpha1.ReasonHeld,
			wantReady:    metav1.ConditionTrue,
			wantEvents:   []string{EventRenewed},
			wantExpireIn: 15 * time.Second,
		},
		{
			// After a controller restart its observations start over; the
			// status already names this very record as lapsed.
			name:       "the record status already says lapsed, freshly observed: stays Expired, no Renewed",
			old:        heldStatus("a", 5, t0, t0.Add(5*time.Second), locksv1alpha1.ReasonExpired),
			lease:      ready(makeLease("a", 5, 15, t0, t0.Add(5*time.Second))),
			wantHolder: "a",
			wantToken:  5,
			wantHeld:   metav1.ConditionFalse,
			wantReason: locksv1alpha1.ReasonExpired,
			wantReady:  metav1.ConditionTrue,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			tracker := lease.NewObserver()
			const key = "ns/billing"
			lock := testutil.MakeLock("billing", "ns").LeaseDuration(tc.spec).Generation(3).Status(tc.old).Obj()

			var obs lease.Observation
			if tc.lease.lease != nil {
				tracker.Observe(key, lease.RecordOf(tc.lease.lease), clk.Now())
				clk.Step(tc.observedAgo)
				obs = tracker.Observe(key, lease.RecordOf(tc.lease.lease), clk.Now())
			}
			res := deriveStatus(statusInput{lock: lock, lease: tc.lease, observation: obs, now: clk.Now(), highWater: tc.highWater})

			st := res.status
			if st.Holder != tc.wantHolder || st.FencingToken != tc.wantToken {
				t.Errorf("holder/token = %q/%d, want %q/%d", st.Holder, st.FencingToken, tc.wantHolder, tc.wantToken)
			}
			held := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionHeld)
			if held == nil || held.Status != tc.wantHeld || held.Reason != tc.wantReason {
				t.Errorf("Held condition = %+v, want %s/%s", held, tc.wantHeld, tc.wantReason)
			}
			if held != nil && held.ObservedGeneration != 3 {
				t.Errorf("Held observedGeneration = %d, want 3", held.ObservedGeneration)
			}
			if ready := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionReady); ready == nil || ready.Status != tc.wantReady {
				t.Errorf("Ready condition = %+v, want %s", ready, tc.wantReady)
			}
			if st.ObservedGeneration != 3 || st.LeaseName != "billing" {
				t.Errorf("observedGeneration/leaseName = %d/%q, want 3/billing", st.ObservedGeneration, st.LeaseName)
			}
			var reasons []string
			for _, ev := range res.events {
				reasons = append(reasons, ev.reason)
			}
			if !slices.Equal(reasons, tc.wantEvents) {
				t.Errorf("events = %v, want %v", reasons, tc.wantEvents)
			}
			if res.expiresIn != tc.wantExpireIn {
				t.Errorf("expiresIn = %s, want %s", res.expiresIn, tc.wantExpireIn)
			}
			wantRenew := tc.old.RenewTime
			switch {
			case tc.lease.lease == nil:
				wantRenew = nil
			case tc.renewFollows:
				wantRenew = tc.lease.lease.Spec.RenewTime
			}
			if !st.RenewTime.Equal(wantRenew) {
				t.Errorf("renewTime = %v, want %v", st.RenewTime, wantRenew)
			}
		})
	}
}

func TestDeriveStatusKeepsTransitionTimeWhenUnchanged(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	held := makeLease("a", 1, 15, t0, t0)
	lock := testutil.MakeLock("billing", "ns").Obj()
	state := leaseState{lease: held, ready: true, reason: locksv1alpha1.ReasonLeaseReady, message: "in sync"}
	obs := lease.NewObserver().Observe("ns/billing", lease.RecordOf(held), clk.Now())

	first := deriveStatus(statusInput{lock: lock, lease: state, observation: obs, now: clk.Now()})
	clk.Step(3 * time.Second)
	lock.Status = first.status
	second := deriveStatus(statusInput{lock: lock, lease: state, observation: obs, now: clk.Now()})

	a := meta.FindStatusCondition(first.status.Conditions, locksv1alpha1.ConditionHeld)
	b := meta.FindStatusCondition(second.status.Conditions, locksv1alpha1.ConditionHeld)
	if !a.LastTransitionTime.Equal(&b.LastTransitionTime) {
		t.Errorf("lastTransitionTime moved from %v to %v without a transition", a.LastTransitionTime, b.LastTransitionTime)
	}
	if len(second.events) != 0 {
		t.Errorf("an unchanged lease produced events %v", second.events)
	}
}

// A renewal changes nothing in status (so it costs no status write), and an
// Expired status names the renewTime of the record that lapsed.
func TestRenewalsLeaveStatusUnchanged(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	tracker := lease.NewObserver()
	lock := testutil.MakeLock("billing", "ns").Generation(1).Obj()
	derive := func(l *coordinationv1.Lease) statusResult {
		obs := tracker.Observe("ns/billing", lease.RecordOf(l), clk.Now())
		res := deriveStatus(statusInput{lock: lock, lease: leaseState{lease: l, ready: true, reason: locksv1alpha1.ReasonLeaseReady,
			message: "in sync"}, observation: obs, now: clk.Now()})
		lock.Status = res.status
		return res
	}
	granted := derive(makeLease("a", 1, 15, t0, t0))
	for i := 1; i <= 5; i++ {
		clk.Step(5 * time.Second)
		before := *lock.Status.DeepCopy()
		res := derive(makeLease("a", 1, 15, t0, t0.Add(time.Duration(i)*5*time.Second)))
		if !equality.Semantic.DeepEqual(before, res.status) || len(res.events) != 0 {
			t.Fatalf("renewal %d changed status or made events: %v", i, res.events)
		}
	}
	if !lock.Status.RenewTime.Time.Equal(t0) || granted.status.Holder != "a" {
		t.Fatalf("renewTime %v after renewals; want the grant's %v", lock.Status.RenewTime, t0)
	}
	clk.Step(15 * time.Second)
	expired := derive(makeLease("a", 1, 15, t0, t0.Add(25*time.Second)))
	if held := meta.FindStatusCondition(expired.status.Conditions, locksv1alpha1.ConditionHeld); held.Reason != locksv1alpha1.ReasonExpired {
		t.Fatalf("Held = %+v, want Expired", held)
	}
	if want := t0.Add(25 * time.Second); !expired.status.RenewTime.Time.Equal(want) {
		t.Errorf("Expired status names renewTime %v, want the lapsed record's %v", expired.status.RenewTime, want)
	}
}

// Only a status that already says Expired for this very record (holder,
// token and renewTime) keeps it Expired without a fresh observation.
func TestLapseRecordedOnlyForTheSameRecord(t *testing.T) {
	lapsed := heldStatus("a", 5, t0, t0.Add(5*time.Second), locksv1alpha1.ReasonExpired)
	cases := []struct {
		name  string
		old   locksv1alpha1.DistributedLockStatus
		lease *coordinationv1.Lease
		want  bool
	}{
		{"the record status says lapsed", lapsed, makeLease("a", 5, 15, t0, t0.Add(5*time.Second)), true},
		{"renewed since", lapsed, makeLease("a", 5, 15, t0, t0.Add(6*time.Second)), false},
		{"another token", lapsed, makeLease("a", 6, 15, t0, t0.Add(5*time.Second)), false},
		{"another holder", lapsed, makeLease("b", 5, 15, t0, t0.Add(5*time.Second)), false},
		{"status says held", heldStatus("a", 5, t0, t0.Add(5*time.Second), locksv1alpha1.ReasonHeld),
			makeLease("a", 5, 15, t0, t0.Add(5*time.Second)), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := lapseRecorded(tc.old, lease.RecordOf(tc.lease), tc.lease); got != tc.want {
				t.Errorf("lapseRecorded = %v, want %v", got, tc.want)
			}
		})
	}
}

// The InvalidGrant condition names the holder the token was granted to,
// also on the passes after the first (when status already names the
// invalid holder): before, they said it was granted to the invalid holder
// itself.
func TestInvalidGrantNamesTheHolderTheTokenWentTo(t *testing.T) {
	lock := testutil.MakeLock("billing", "ns").LeaseDuration(15).Status(heldStatus("a", 5, t0, t0, locksv1alpha1.ReasonHeld)).Obj()
	rogue := leaseState{lease: makeLease("rogue", 5, 15, t0, t0), ready: true, reason: locksv1alpha1.ReasonLeaseReady}
	obs := lease.Observation{Record: lease.RecordOf(rogue.lease), ObservedAt: t0}
	first := deriveStatus(statusInput{lock: lock, lease: rogue, observation: obs, now: t0})
	lock.Status = first.status
	second := deriveStatus(statusInput{lock: lock, lease: rogue, observation: obs, now: t0.Add(time.Second)})
	for i, st := range []locksv1alpha1.DistributedLockStatus{first.status, second.status} {
		held := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionHeld)
		if held == nil || held.Reason != locksv1alpha1.ReasonInvalidGrant || !strings.Contains(held.Message, "already granted (to a)") {
			t.Errorf("pass %d: Held %+v, want InvalidGrant naming a", i+1, held)
		}
	}
}
