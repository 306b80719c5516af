package lease

import (
	"errors"
	"math"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"
)

func heldLease(holder string, token int32) *coordinationv1.Lease {
	t := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	return leasetest.MakeLease("billing", "").ResourceVersion("42").Token(token).Duration(15).Held(holder, t, t).Obj()
}

func TestEdits(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 5, 0, time.UTC)
	cases := []struct {
		name       string
		edit       func(*coordinationv1.Lease) (*coordinationv1.Lease, error)
		from       *coordinationv1.Lease
		wantHolder string
		wantToken  int64
		wantErr    error
		wantRenew  bool
	}{
		{name: "grant a free lease", from: Release(heldLease("a", 4)), wantHolder: "b", wantToken: 5, wantRenew: true,
			edit: func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
				return Grant(l, "b", "user=test", 10*time.Second, now)
			}},
		{name: "grant a lease with no token yet", from: &coordinationv1.Lease{}, wantHolder: "b", wantToken: 1, wantRenew: true,
			edit: func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
				return Grant(l, "b", "user=test", 10*time.Second, now)
			}},
		{name: "grant at the end of the range", from: heldLease("a", math.MaxInt32), wantErr: ErrTokensExhausted,
			edit: func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
				return Grant(l, "b", "user=test", 10*time.Second, now)
			}},
		{name: "renew keeps holder and token", from: heldLease("a", 4), wantHolder: "a", wantToken: 4, wantRenew: true,
			edit: func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
				return Renew(l, 10*time.Second, now), nil
			}},
		{name: "release keeps the token", from: heldLease("a", 4), wantHolder: "", wantToken: 4,
			edit: func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) { return Release(l), nil }},
		{name: "break raises the token", from: heldLease("a", 4), wantHolder: "", wantToken: 5,
			edit: Break},
		{name: "break at the end of the range", from: heldLease("a", math.MaxInt32), wantErr: ErrTokensExhausted,
			edit: Break},
		{name: "raise to the floor voids the grant", from: heldLease("rogue", 2), wantHolder: "", wantToken: 7,
			edit: func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) { return RaiseToFloor(l, 7) }},
		{name: "a floor beyond int32 goes to the next token epoch", from: heldLease("a", 2), wantHolder: "", wantToken: math.MaxInt32 + 1,
			edit: func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) { return RaiseToFloor(l, math.MaxInt32+1) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := c.from.DeepCopy()
			got, err := c.edit(c.from)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("error %v, want %v", err, c.wantErr)
			}
			if c.from.String() != before.String() {
				t.Errorf("the edit changed its input")
			}
			if err != nil {
				return
			}
			if Holder(got) != c.wantHolder || Token(got) != c.wantToken {
				t.Errorf("holder %q token %d, want %q %d", Holder(got), Token(got), c.wantHolder, c.wantToken)
			}
			if got.ResourceVersion != c.from.ResourceVersion {
				t.Errorf("resourceVersion %q, want %q kept for the compare-and-swap", got.ResourceVersion, c.from.ResourceVersion)
			}
			if c.wantRenew && !got.Spec.RenewTime.Time.Equal(now) {
				t.Errorf("renewTime %v, want %v", got.Spec.RenewTime, now)
			}
			if c.wantHolder == "" && (got.Spec.AcquireTime != nil || got.Spec.RenewTime != nil) {
				t.Errorf("a lease with no holder keeps times %v %v", got.Spec.AcquireTime, got.Spec.RenewTime)
			}
		})
	}
}
