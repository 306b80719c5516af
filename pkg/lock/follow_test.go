package lock

import (
	"errors"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

func leaseAt(version string) *coordinationv1.Lease {
	return testutil.MakeLease("", "").ResourceVersion(version).Obj()
}

func TestNewerVersion(t *testing.T) {
	cases := []struct {
		name string
		a, b *coordinationv1.Lease
		want bool
	}{
		{"later revision", leaseAt("12"), leaseAt("9"), true},
		{"earlier revision", leaseAt("9"), leaseAt("12"), false},
		{"same revision", leaseAt("9"), leaseAt("9"), false},
		{"nothing to compare with", leaseAt("9"), nil, true},
		{"no copy", nil, leaseAt("9"), false},
		{"not a number: the grant's own copy wins", leaseAt("x9"), leaseAt("1"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := newerVersion(tc.a, tc.b); got != tc.want {
				t.Errorf("newerVersion = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLandedUncertainNeedsTheAttemptsNonce(t *testing.T) {
	granted := func(holder string, token int32, nonce string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{locksv1alpha1.GrantNonceAnnotation: nonce}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: new(holder), LeaseTransitions: new(token)},
		}
		return l
	}
	p := &place{uncertain: 6, uncertainNonce: "n1"}
	cases := []struct {
		name string
		l    *coordinationv1.Lease
		p    *place
		want bool
	}{
		{"its own grant landed", granted("me", 6, "n1"), p, true},
		{"same identity and token, another process's grant", granted("me", 6, "n2"), p, false},
		{"another token", granted("me", 7, "n1"), p, false},
		{"another holder", granted("you", 6, "n1"), p, false},
		{"nothing uncertain", granted("me", 6, "n1"), &place{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := landedUncertain(tc.l, "me", tc.p); got != tc.want {
				t.Errorf("landedUncertain = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMayHaveLanded(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"no answer", errors.New("connection reset by peer"), true},
		{"server timeout", apierrors.NewServerTimeout(gr, "update", 1), true},
		{"internal error", apierrors.NewInternalError(errors.New("etcd")), true},
		{"request timeout", apierrors.NewTimeoutError("slow", 1), true},
		{"forbidden", apierrors.NewForbidden(gr, "billing", errors.New("no")), false},
		{"invalid", apierrors.NewBadRequest("bad"), false},
		{"too many requests", apierrors.NewTooManyRequests("later", 1), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := mayHaveLanded(tc.err); got != tc.want {
				t.Errorf("mayHaveLanded(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
