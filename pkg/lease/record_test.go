package lease

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func held(holder string, transitions int32, renew time.Time) *coordinationv1.Lease {
	return leasetest.MakeLease("", "").Token(transitions).Duration(15).Held(holder, t0, renew).Obj()
}

func TestObserverMovesOnlyWhenTheRecordChanges(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	o := NewObserver()
	rec := RecordOf(held("a", 1, t0))

	steps := []struct {
		name       string
		step       time.Duration
		record     Record
		forget     bool
		wantMoved  bool
		wantExpiry time.Duration // deadline minus the step's now
	}{
		{name: "first sighting", record: rec, wantMoved: true, wantExpiry: 15 * time.Second},
		{name: "unchanged after 5s", step: 5 * time.Second, record: rec, wantExpiry: 10 * time.Second},
		{name: "holder's clock jumps back, record differs", step: time.Second, record: RecordOf(held("a", 1, t0.Add(-time.Hour))), wantMoved: true, wantExpiry: 15 * time.Second},
		{name: "takeover", step: 20 * time.Second, record: RecordOf(held("b", 2, t0)), wantMoved: true, wantExpiry: 15 * time.Second},
		{name: "after forget, a fresh full duration", step: 3 * time.Second, record: RecordOf(held("b", 2, t0)), forget: true, wantMoved: true, wantExpiry: 15 * time.Second},
	}
	var last Observation
	for _, s := range steps {
		clk.Step(s.step)
		if s.forget {
			o.Forget("k")
		}
		got := o.Observe("k", s.record, clk.Now())
		if moved := !got.ObservedAt.Equal(last.ObservedAt); moved != s.wantMoved {
			t.Errorf("%s: observedAt moved = %v, want %v", s.name, moved, s.wantMoved)
		}
		if d := got.Deadline(time.Minute).Sub(clk.Now()); d != s.wantExpiry {
			t.Errorf("%s: deadline in %s, want %s", s.name, d, s.wantExpiry)
		}
		last = got
	}
}

func TestRecordOfMalformedLease(t *testing.T) {
	// A Lease with every optional field missing must not panic.
	rec := RecordOf(&coordinationv1.Lease{})
	if !rec.Equal(Record{}) {
		t.Errorf("RecordOf(empty) = %+v, want zero", rec)
	}
	if d := rec.Duration(7 * time.Second); d != 7*time.Second {
		t.Errorf("Duration of a record without one = %s, want the fallback", d)
	}
}
