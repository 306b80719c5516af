package lock

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// leaseWith is a Lease held by holder ("" free) with token and annotations.
func leaseWith(holder string, token int32, annotations map[string]string) *coordinationv1.Lease {
	b := testutil.MakeLease("", "").Token(token).Annotations(annotations)
	if holder != "" {
		b.Holder(holder)
	}
	return b.Obj()
}

func TestLeftoverMatchesOnlyWhatThisClientLeft(t *testing.T) {
	nonce := func(n string) map[string]string { return map[string]string{locksv1alpha1.GrantNonceAnnotation: n} }
	handed := func(ticket string) map[string]string {
		return map[string]string{locksv1alpha1.TicketAnnotation: ticket}
	}
	queued := func(ticket string) map[string]string { return map[string]string{lease.EntryKey(ticket): "0,1,me"} }
	cases := []struct {
		name      string
		lo        leftover
		l         *coordinationv1.Lease
		grant     bool
		stillHere bool
	}{
		{"its grant, release failed", leftover{token: 6, nonce: "n1"}, leaseWith("me", 6, nonce("n1")), true, false},
		{"a later grant of the same identity and token, another nonce", leftover{token: 6, nonce: "n1"}, leaseWith("me", 6, nonce("n2")), false, false},
		{"the next grant", leftover{token: 6, nonce: "n1"}, leaseWith("me", 7, nonce("n1")), false, false},
		{"another holder", leftover{token: 6, nonce: "n1"}, leaseWith("you", 6, nonce("n1")), false, false},
		{"released meanwhile", leftover{token: 6, nonce: "n1"}, leaseWith("", 6, nil), false, false},
		{"no nonce to prove it", leftover{token: 6}, leaseWith("me", 6, nonce("")), false, false},
		{"handed to its old ticket", leftover{ticket: "t1"}, leaseWith("me", 9, handed("t1")), true, false},
		{"handed to another ticket", leftover{ticket: "t1"}, leaseWith("me", 9, handed("t2")), false, false},
		{"its place still queued", leftover{ticket: "t1"}, leaseWith("you", 3, queued("t1")), false, true},
		{"another place", leftover{ticket: "t1"}, leaseWith("you", 3, queued("t2")), false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.lo.grantOn(tc.l, "me"); got != tc.grant {
				t.Errorf("grantOn = %v, want %v", got, tc.grant)
			}
			if got := tc.lo.placeOn(tc.l); got != tc.stillHere {
				t.Errorf("placeOn = %v, want %v", got, tc.stillHere)
			}
		})
	}
}

func TestLeftoversAreBounded(t *testing.T) {
	c := &Client{}
	for i := range maxLeftovers + 3 {
		c.leaveBehind(leftover{token: int64(i + 1), nonce: "n"})
	}
	if got := len(c.left.items); got != maxLeftovers {
		t.Fatalf("%d leftovers remembered, want %d", got, maxLeftovers)
	}
	if first := c.left.items[0].token; first != 4 {
		t.Errorf("oldest remembered is token %d, want 4 (the oldest are forgotten)", first)
	}
	c.forgetLeftover(leftover{token: 5, nonce: "n"})
	if got := len(c.left.items); got != maxLeftovers-1 {
		t.Errorf("%d leftovers after forgetting one, want %d", got, maxLeftovers-1)
	}
}
