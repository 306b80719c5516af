package chaos

import (
	"context"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
)

// The DistributedLock itself is deleted and created again (GitOps prune and
// re-sync, kubectl replace --force) while its holder is frozen with
// SIGSTOP. The deleted lock waits for the frozen holder's lease to lapse and
// keeps its Lease as the record of its tokens; the new lock continues from
// it. When the old holder thaws, the ledger must refuse its writes (a token
// below one it has seen), and no token may have been granted twice: the
// usual checks (ledger order, distinct and rising grants, linearizable
// history, status never down across the two locks) catch a reset.
func TestLockDeletedAndRecreatedUnderAFrozenHolder(t *testing.T) {
	runScenario(t, scenario{workers: 3, increments: size(6, 24), perGrant: 2, ttl: 2,
		inject: func(t *testing.T, r *runState) {
			ctx := context.Background()
			key := client.ObjectKey{Namespace: r.ns, Name: r.lock}
			for round := range size(1, 3) {
				var frozen int
				var token int64
				waitFor(t, time.Minute, "a holder", func() bool { frozen, token = r.holderWorker(); return frozen >= 0 })
				r.workers[frozen].Signal(syscall.SIGSTOP)
				old := &locksv1alpha1.DistributedLock{}
				if err := r.c.k8sClient.Get(ctx, key, old); err != nil {
					t.Fatal(err)
				}
				if err := r.c.k8sClient.Delete(ctx, old); err != nil {
					t.Fatal(err)
				}
				deleted := time.Now()
				waitFor(t, time.Minute, "the lock to be gone", func() bool {
					return apierrors.IsNotFound(r.c.k8sClient.Get(ctx, key, &locksv1alpha1.DistributedLock{}))
				})
				gone := time.Since(deleted)
				fresh := testutil.MakeLock(r.lock, r.ns).LeaseDuration(old.Spec.LeaseDurationSeconds).Obj()
				if err := r.c.k8sClient.Create(ctx, fresh); err != nil {
					t.Fatal(err)
				}
				waitFor(t, time.Minute, "a grant on the new lock", func() bool { _, tok := r.holderWorker(); return tok > token })
				r.workers[frozen].Signal(syscall.SIGCONT)
				t.Logf("round %d: froze %s holding token %d, deleted the lock (gone after %s), created it again; the next grant went on from there",
					round, r.workers[frozen].Name, token, gone.Round(time.Millisecond))
			}
		}})
}
