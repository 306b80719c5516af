package lock

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"
)

// A grant's fencing key names the lock's namespace and name, so the locks
// of one name in two namespaces never share a guard's highest token.
func TestGrantFencingKeyNamesTheLocksNamespaceAndName(t *testing.T) {
	grant := func(namespace, name string) *Grant {
		return &Grant{client: &Client{cfg: Config{Namespace: namespace, Name: name}}}
	}
	cases := []struct {
		namespace, name, want string
	}{
		{"default", "billing", "default/billing"},
		{"team-a", "billing", "team-a/billing"},
		{"billing", "default", "billing/default"},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		got := grant(c.namespace, c.name).FencingKey()
		if got != c.want {
			t.Errorf("FencingKey of %s/%s = %q, want %q", c.namespace, c.name, got, c.want)
		}
		if seen[got] {
			t.Errorf("two locks share the fencing key %q", got)
		}
		seen[got] = true
	}
}

func leaseAt(version string) *coordinationv1.Lease {
	return leasetest.MakeLease("", "").ResourceVersion(version).Obj()
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
