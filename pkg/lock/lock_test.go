package lock

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// The n-th retry of a grant's write in a row waits from a tenth of the
// renew interval (at most 100ms), doubling, up to half the interval.
func TestRenewBackoffStaysWithinTheInterval(t *testing.T) {
	cases := []struct {
		failures int
		interval time.Duration
		want     time.Duration
	}{
		{1, 5 * time.Second, 100 * time.Millisecond},
		{2, 5 * time.Second, 200 * time.Millisecond},
		{5, 5 * time.Second, 1600 * time.Millisecond},
		{6, 5 * time.Second, 2500 * time.Millisecond},
		{50, 5 * time.Second, 2500 * time.Millisecond},
		{1, 300 * time.Millisecond, 30 * time.Millisecond},
		{4, 300 * time.Millisecond, 150 * time.Millisecond},
		{1, time.Millisecond, time.Millisecond},
		{2, 5 * time.Millisecond, time.Millisecond},
		{3, 8 * time.Millisecond, 3200 * time.Microsecond},
	}
	for _, c := range cases {
		b := renewBackoff(c.interval)
		var got time.Duration
		for range c.failures {
			got = renewRetryDelay(&b)
		}
		if got != c.want {
			t.Errorf("retry %d of renewBackoff(%s) = %s, want %s", c.failures, c.interval, got, c.want)
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
	const uid = "0b6f8c1e-3d2a-4f5b-9c7e-1a2b3c4d5e6f"
	t.Setenv("POD_UID", uid)
	withUID := DefaultIdentity()
	if !regexp.MustCompile(`^billing-7d9f-x2x_` + uid + `_[0-9a-f]{8}$`).MatchString(withUID) {
		t.Errorf("identity %q does not look like <pod>_<uid>_<8 hex>", withUID)
	}
	if locksv1alpha1.PodUIDOf(withUID) != uid || PodNameOf(withUID) != "billing-7d9f-x2x" {
		t.Errorf("identity %q does not carry pod and UID", withUID)
	}
	t.Setenv("POD_UID", "not-a-uid")
	if got := DefaultIdentity(); locksv1alpha1.PodUIDOf(got) != "" {
		t.Errorf("a malformed $POD_UID made it into %q", got)
	}
	t.Setenv("POD_UID", "")
	t.Setenv("POD_NAME", "")
	host, _ := os.Hostname()
	if got := DefaultIdentity(); !strings.HasPrefix(got, host+locksv1alpha1.IdentitySeparator) {
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
