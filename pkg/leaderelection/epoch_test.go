package leaderelection

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A leader's fencing token is the lock's token: past the end of a token
// epoch (leaseTransitions back to 0 in epoch 1), a Term must carry a token
// above every token of the epoch that ended, as the frontdesk library's
// grants do (lease.Token), not leaseTransitions alone.
func TestTermTokenContinuesAcrossTokenEpochs(t *testing.T) {
	answer := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{locksv1alpha1.TokenEpochAnnotation: "1"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("op-1"), LeaseTransitions: ptr.To[int32](1),
			LeaseDurationSeconds: ptr.To[int32](15)},
	}
	ler := &resourcelock.LeaderElectionRecord{HolderIdentity: "op-1", LeaderTransitions: 1, LeaseDurationSeconds: 15}
	_, token, _ := recordOf(ler, answer)
	if want := lease.Token(answer); token != want {
		t.Errorf("BROKEN: the Term's fencing token in token epoch 1 is %d, below %d, the last token of epoch 0; want %d",
			token, int64(1<<31-1), want)
	}
}
