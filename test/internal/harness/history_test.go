package harness

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
)

func version(holder string, token int32) coordinationv1.Lease {
	l := coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseTransitions: new(token)}}
	if holder != "" {
		l.Spec.HolderIdentity = new(holder)
	}
	return l
}

func TestGrantsAreHolderChangesAndTokenChanges(t *testing.T) {
	cases := []struct {
		name     string
		versions []coordinationv1.Lease
		want     []GrantRecord
	}{
		{"renewals are not grants", []coordinationv1.Lease{version("a", 1), version("a", 1), version("a", 1)}, nil},
		{"a release is not a grant; the next acquire is",
			[]coordinationv1.Lease{version("", 0), version("a", 1), version("", 1), version("a", 2)},
			[]GrantRecord{{"a", 1}, {"a", 2}}},
		{"a takeover is a grant", []coordinationv1.Lease{version("a", 1), version("b", 2)}, []GrantRecord{{"b", 2}}},
		{"a token bumped under the same holder is a grant", []coordinationv1.Lease{version("a", 1), version("a", 3)}, []GrantRecord{{"a", 3}}},
		{"a new holder with a lower token is reported as it is, for the caller to flag",
			[]coordinationv1.Lease{version("a", 5), version("b", 4)}, []GrantRecord{{"b", 4}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := &LeaseHistory{versions: tc.versions}
			got := h.Grants()
			if len(got) != len(tc.want) {
				t.Fatalf("Grants() = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("Grants()[%d] = %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
