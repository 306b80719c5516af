package lock

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func TestGrantedLeaseBumpsTokenAndKeepsResourceVersion(t *testing.T) {
	cases := []struct {
		name        string
		transitions *int32
		wantToken   int32
	}{
		{"fresh lease without transitions", nil, 1},
		{"lease at 41", ptr.To[int32](41), 42},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			current := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "billing", ResourceVersion: "77"},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old"), LeaseTransitions: tc.transitions},
			}
			got := grantedLease(current, "me", 20*time.Second, t0)
			if got.ResourceVersion != "77" {
				t.Errorf("resourceVersion %q: the Update would not be a compare-and-swap", got.ResourceVersion)
			}
			if ptr.Deref(got.Spec.LeaseTransitions, 0) != tc.wantToken || ptr.Deref(got.Spec.HolderIdentity, "") != "me" ||
				ptr.Deref(got.Spec.LeaseDurationSeconds, 0) != 20 || !got.Spec.AcquireTime.Time.Equal(t0) || !got.Spec.RenewTime.Time.Equal(t0) {
				t.Errorf("granted spec = %+v", got.Spec)
			}
			if ptr.Deref(current.Spec.HolderIdentity, "") != "old" {
				t.Error("grantedLease modified its input")
			}
		})
	}
}

func TestControllerSawExpiryOnlyForTheSameRecord(t *testing.T) {
	rec := lease.Record{Holder: "a", Transitions: 3, RenewTime: t0}
	status := func(reason, holder string, token int64, renew time.Time) *locksv1alpha1.DistributedLock {
		l := &locksv1alpha1.DistributedLock{Status: locksv1alpha1.DistributedLockStatus{
			Holder: holder, FencingToken: token, RenewTime: ptr.To(metav1.NewMicroTime(renew)),
			Conditions: []metav1.Condition{{Type: locksv1alpha1.ConditionHeld, Reason: reason}},
		}}
		return l
	}
	cases := []struct {
		name string
		lock *locksv1alpha1.DistributedLock
		want bool
	}{
		{"expired, same record", status(locksv1alpha1.ReasonExpired, "a", 3, t0), true},
		{"still held", status(locksv1alpha1.ReasonHeld, "a", 3, t0), false},
		{"expired, but renewed since", status(locksv1alpha1.ReasonExpired, "a", 3, t0.Add(-time.Second)), false},
		{"expired, an older grant", status(locksv1alpha1.ReasonExpired, "a", 2, t0), false},
		{"expired, another holder", status(locksv1alpha1.ReasonExpired, "b", 3, t0), false},
		{"no conditions yet", &locksv1alpha1.DistributedLock{}, false},
	}
	for _, tc := range cases {
		if got := controllerSawExpiry(tc.lock, rec); got != tc.want {
			t.Errorf("%s: controllerSawExpiry = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDefaultIdentityIsUniquePerProcessAndNamesThePod(t *testing.T) {
	t.Setenv("POD_NAME", "billing-7d9f-x2x")
	a, b := DefaultIdentity(), DefaultIdentity()
	if a == b {
		t.Errorf("two identities are equal: %s", a)
	}
	if !regexp.MustCompile(`^billing-7d9f-x2x_[0-9a-f]{8}$`).MatchString(a) {
		t.Errorf("identity %q does not look like <pod>_<8 hex>", a)
	}
	if PodNameOf(a) != "billing-7d9f-x2x" {
		t.Errorf("PodNameOf(%q) = %q", a, PodNameOf(a))
	}
	if PodNameOf("custom") != "custom" {
		t.Error("an identity without a separator is its own pod name")
	}
	t.Setenv("POD_NAME", "")
	host, _ := os.Hostname()
	if got := DefaultIdentity(); !strings.HasPrefix(got, host+IdentitySeparator) {
		t.Errorf("without POD_NAME the identity %q does not start with the hostname %q", got, host)
	}
}

func TestHeldErrorSaysWhoAndUntilWhen(t *testing.T) {
	err := error(&HeldError{Lock: "ns/billing", Holder: "a_1234", Token: 9, FreeAt: t0})
	if !errors.Is(err, ErrHeld) {
		t.Error("HeldError does not match ErrHeld")
	}
	want := "lock ns/billing is held by a_1234 (fencing token 9) until ~2026-12-02T12:00:00Z unless it renews"
	if err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
}
