package integration

// Attacks a reviewer found (each failed before its fix): one entry a
// participant may write must not stop the controller's work on a lock, and
// a fenced object's lock is fixed with its first token. (A pod name too
// long for an identity: TestPodWithALongNameDoesNotStopAdmissions.)

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// The queue repair looks a pod principal's pod up by the name its place's
// identity gives when the identity carries the principal's pod UID. A
// participant queues, in its own name, with the identity "_<its pod's
// UID>": a name no pod can have. The repair must not fail on it (before the
// fix, the lookup's "name is required" failed every pass while the place
// stayed: no status write, marks or events; here alice's hand-off to bob
// was never recorded, so the fencing policy's check against the lock's
// recorded token let alice's stale token through).
func TestPlaceNamingNoPodDoesNotStopTheController(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	alice := podParticipant(t, ns, "alice", "alice-0")
	bob := podParticipant(t, ns, "bob", "bob-0")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(Equal(ga.Token()))
	})
	// Bob waits, first in the queue.
	type result struct {
		token int64
		err   error
	}
	got := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		gb, err := bob.lockClient(t, ns, "billing", "bob-1").Acquire(ctx)
		if err != nil {
			got <- result{err: err}
			return
		}
		got <- result{token: gb.Token()}
		<-ctx.Done()
		_ = gb.Release(context.Background())
	}()
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(HaveLen(1)) })
	// Mallory queues behind him, in her own name, with the identity "_<uid>".
	seq := lease.Queue(getLease(g, ns, "billing"))[0].Seq + 1
	g.Expect(mallory.patchAs(ns, "billing", "["+mallory.place("m1", fmt.Sprintf("0,%d,_%s", seq, mallory.pod.UID))+"]")).To(Succeed())
	time.Sleep(2 * time.Second)
	g.Expect(ga.Release(context.Background())).To(Succeed()) // hands the lock to bob
	r := <-got
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.token).To(Equal(ga.Token() + 1))
	eventually(t, 15*time.Second, func(g Gomega) {
		st := getLock(g, ns, "billing").Status
		g.Expect(st.FencingToken).To(Equal(r.token), "the controller records bob's grant")
		g.Expect(st.Holder).To(Equal("bob-1"))
	})
}

// A fenced object's lock is set with its first token and never after: a
// write with a token but no lock name is refused, and so is naming a lock
// (a made-up one, with a huge token) on an object fenced without one;
// the honest holder's create names its lock and is accepted. (Creating an
// object that names a lock no Lease serves cannot be refused: see
// docs/annotations.md.)
func TestFencedObjectsNameTheirLockWithTheirFirstToken(t *testing.T) {
	installFencingPolicy(t)
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	_, err := harness.Grant(ctx, clientset, ns, "billing", "writer")
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 20*time.Second, func(g Gomega) { // the policy in effect: a token never granted is refused
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns, Labels: fencedLabels,
			Annotations: fenced("billing", "999999999999999999")}}
		err := k8sClient.Create(ctx, cm, client.DryRunAll)
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "policy not active yet: %v", err)
	})
	unnamed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "unnamed", Namespace: ns, Labels: fencedLabels,
		Annotations: map[string]string{locksv1alpha1.FencingTokenAnnotation: "1"}}}
	err = k8sClient.Create(ctx, unnamed)
	g.Expect(apierrors.IsInvalid(err) || apierrors.IsForbidden(err)).To(BeTrue(), "a token without its lock: %v", err)
	g.Expect(err).To(MatchError(ContainSubstring("set locks.frontdesk.dev/fencing-lock")))

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "invoice-run", Namespace: ns, Labels: fencedLabels,
		Annotations: fenced("billing", "1")}, Data: map[string]string{"value": "writer"}}
	g.Expect(k8sClient.Create(ctx, cm)).To(Succeed(), "the honest holder's first write")
	err = writeConfigMap(ns, "invoice-run", "mallory", fenced("bi11ing", "999999999999999999"))
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "pointing the object at another lock: %v", err)
	g.Expect(writeConfigMap(ns, "invoice-run", "writer", fenced("billing", "1"))).To(Succeed(), "the holder writes again")
}
