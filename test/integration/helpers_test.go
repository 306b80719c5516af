package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// createReadyLock creates lock and waits until the controller reports its
// Lease Ready.
func createReadyLock(t *testing.T, lock *locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLock {
	t.Helper()
	g := NewWithT(t)
	g.Expect(k8sClient.Create(context.Background(), lock)).To(Succeed())
	var got *locksv1alpha1.DistributedLock
	g.Eventually(func(g Gomega) {
		got = getLock(g, lock.Namespace, lock.Name)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, locksv1alpha1.ConditionReady)).To(BeTrue(),
			"Ready condition: %+v", got.Status.Conditions)
	}).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())
	return got
}

func getLock(g Gomega, namespace, name string) *locksv1alpha1.DistributedLock {
	lock := &locksv1alpha1.DistributedLock{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, lock)).To(Succeed())
	return lock
}

func getLease(g Gomega, namespace, name string) *coordinationv1.Lease {
	lease := &coordinationv1.Lease{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, lease)).To(Succeed())
	return lease
}

// heldReason is the reason of the lock's Held condition, or "" if unset.
func heldReason(lock *locksv1alpha1.DistributedLock) string {
	if c := meta.FindStatusCondition(lock.Status.Conditions, locksv1alpha1.ConditionHeld); c != nil {
		return c.Reason
	}
	return ""
}

// eventReasons lists the reasons of the Events recorded on a lock, oldest
// first, counting an Event series as its number of occurrences.
func eventReasons(g Gomega, namespace, lockName string) []string {
	var list eventsv1.EventList
	g.Expect(k8sClient.List(context.Background(), &list, client.InNamespace(namespace))).To(Succeed())
	var reasons []string
	for _, ev := range list.Items {
		if ev.Regarding.Kind != "DistributedLock" || ev.Regarding.Name != lockName {
			continue
		}
		n := 1
		if ev.Series != nil {
			n = int(ev.Series.Count)
		}
		for range n {
			reasons = append(reasons, ev.Reason)
		}
	}
	return reasons
}

func countOf(items []string, want string) int {
	n := 0
	for _, s := range items {
		if s == want {
			n++
		}
	}
	return n
}

// eventually polls fn until it succeeds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, fn func(g Gomega)) {
	t.Helper()
	NewWithT(t).Eventually(fn).WithTimeout(timeout).WithPolling(20 * time.Millisecond).Should(Succeed())
}

// leaseWriteRequest reports whether req writes a Lease: a client's patch
// (grant, renewal, release, registration) or an Update.
func leaseWriteRequest(req *http.Request) bool {
	return (req.Method == http.MethodPut || req.Method == http.MethodPatch) && strings.Contains(req.URL.Path, "/leases/")
}
