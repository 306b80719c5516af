package lease

import (
	"math"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// A lapse mark names a grant by its leaseTransitions alone. The marks of
// one token epoch must not carry over into the next, where
// leaseTransitions counts from 0 again: a live grant of the new epoch at
// the same leaseTransitions would count as lapsed at once (for clients,
// and for the lease-guard policy, which then lets anyone take it over).
func TestLapseMarkDoesNotOutliveItsEpoch(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		// end is the Lease as its epoch ends (the manager starts the next).
		end func() *coordinationv1.Lease
	}{
		{name: "the exhausted grant itself lapsed", end: func() *coordinationv1.Lease {
			l := heldLease("a", math.MaxInt32)
			l.Annotations = map[string]string{locksv1alpha1.LapsedAnnotation: strconv.Itoa(math.MaxInt32)}
			return l
		}},
		{name: "an earlier grant of the epoch lapsed", end: func() *coordinationv1.Lease {
			l := Release(heldLease("a", math.MaxInt32))
			l.Annotations = map[string]string{locksv1alpha1.LapsedAnnotation: "3"}
			return l
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			end := tc.end()
			mark := end.Annotations[locksv1alpha1.LapsedAnnotation]
			markToken, _ := strconv.Atoi(mark)
			l := NewEpoch(end)
			if Epoch(l) != 1 {
				t.Fatalf("epoch %d, want 1", Epoch(l))
			}
			// The new epoch's grants, up to leaseTransitions as the old mark names.
			for i := 0; i < markToken && i < 5; i++ {
				var err error
				if l, err = Grant(l, "b", "user=test", 10*time.Second, now); err != nil {
					t.Fatal(err)
				}
			}
			if markToken > 5 { // stands for the grants in between
				l.Spec.LeaseTransitions = ptr.To(int32(markToken))
			}
			if Lapsed(l) {
				t.Errorf("BROKEN: the live grant of %s with token %d (epoch 1) counts as lapsed: the lapse mark %q of epoch 0 survived NewEpoch",
					Holder(l), Token(l), mark)
			}
		})
	}
}
