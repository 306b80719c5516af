package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgole "k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// runStockElector runs a stock client-go LeaderElector on the Lease name as
// p, under identity, without releasing on stop. leading is closed when it
// starts leading; stop ends it and waits until Run returned.
func runStockElector(t *testing.T, p participant, ns, name, identity string) (leading <-chan struct{}, stop func()) {
	t.Helper()
	lk := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Client: p.clientset().CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: identity}}
	started := make(chan struct{})
	le, err := clientgole.NewLeaderElector(clientgole.LeaderElectionConfig{
		Lock: lk, LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond,
		Callbacks: clientgole.LeaderCallbacks{OnStartedLeading: func(context.Context) { close(started) }, OnStoppedLeading: func() {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return started, stop
}

// Promise: stock client-go leader election keeps working under the
// policies. A single-replica operator whose election identity is its pod
// name (a StatefulSet pod; client-go's own examples use the hostname) is
// replaced by a new pod of the same name: a new principal under the same
// identity. client-go takes the record naming its identity for its own
// (IsLeader) and renews it without raising the token; the policy refuses
// that renewal, as another principal's, while the grant is live and, once
// the controller marks it lapsed, as a renewal of a lapsed grant. The new
// pod never leads.
func TestStockLeaderElectionSurvivesAPodReplacedUnderItsIdentity(t *testing.T) {
	ns := guardedLock(t, "op-lock", 2)
	podA := newParticipant(t, ns, "op", "aaaaaaaa-0000-0000-0000-000000000001")
	podB := newParticipant(t, ns, "op", "bbbbbbbb-0000-0000-0000-000000000002")

	leadingA, stopA := runStockElector(t, podA, ns, "op-lock", "op-0")
	select {
	case <-leadingA:
	case <-time.After(15 * time.Second):
		t.Fatal("the first pod did not lead")
	}
	stopA() // the pod is deleted: no release

	leadingB, _ := runStockElector(t, podB, ns, "op-lock", "op-0")
	select {
	case <-leadingB:
	case <-time.After(20 * time.Second):
		l := getLease(NewWithT(t), ns, "op-lock")
		t.Fatalf("BROKEN: the replacement pod did not lead in 20 s on a 2 s lease: the Lease names %s (token %d, principal %q, lapsed %v)",
			lease.Holder(l), lease.Token(l), l.Annotations["locks.frontdesk.dev/holder-principal"], lease.Lapsed(l))
	}
}
