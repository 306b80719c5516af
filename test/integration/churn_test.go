package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/test/internal/harness"
)

// 100 locks, each contended by several clients that grant, renew and take
// over concurrently, while a sampler watches every lock's status token:
// it must never go down, and at the end it must account for every grant.
func TestManyLocksChurnKeepsTokensMonotonic(t *testing.T) {
	const (
		locks           = 100
		holdersPerLock  = 3
		grantsPerHolder = 6
	)
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)

	for i := range locks {
		g.Expect(k8sClient.Create(ctx, testutil.MakeLock(fmt.Sprintf("lock-%03d", i), ns).LeaseDuration(1).Obj())).To(Succeed())
	}
	eventually(t, 30*time.Second, func(g Gomega) {
		var list locksv1alpha1.DistributedLockList
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		ready := 0
		for _, l := range list.Items {
			if l.Status.LeaseName != "" {
				ready++
			}
		}
		g.Expect(ready).To(Equal(locks))
	})

	samplerCtx, stopSampler := context.WithCancel(ctx)
	samples, violations := sampleTokens(samplerCtx, ns)

	start := time.Now()
	var grants [locks]atomic.Int64
	var conflicts atomic.Int64
	var wg sync.WaitGroup
	for i := range locks {
		name := fmt.Sprintf("lock-%03d", i)
		for h := range holdersPerLock {
			wg.Go(func() {
				holder := fmt.Sprintf("%s-holder-%d", name, h)
				for range grantsPerHolder {
					time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond) // jitter between attempts
					if _, err := harness.Grant(ctx, clientset, ns, name, holder); err != nil {
						if apierrors.IsConflict(err) {
							conflicts.Add(1)
							continue
						}
						t.Errorf("grant on %s: %v", name, err)
						return
					}
					grants[i].Add(1)
					_ = harness.Renew(ctx, clientset, ns, name, holder) // may lose to a takeover; fine
				}
			})
		}
	}
	wg.Wait()
	churn := time.Since(start)

	var total int64
	for i := range locks {
		total += grants[i].Load()
	}
	eventually(t, 60*time.Second, func(g Gomega) {
		var list locksv1alpha1.DistributedLockList
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(locks))
		for _, l := range list.Items {
			var i int
			_, err := fmt.Sscanf(l.Name, "lock-%03d", &i)
			g.Expect(err).NotTo(HaveOccurred())
			lease := getLease(g, ns, l.Status.LeaseName)
			g.Expect(ptr.Deref(lease.Spec.LeaseTransitions, 0)).To(BeEquivalentTo(grants[i].Load()), "lease %s", l.Name)
			g.Expect(l.Status.FencingToken).To(Equal(grants[i].Load()), "status of %s lost a grant", l.Name)
		}
	})
	stopSampler()
	n := <-samples
	for _, v := range <-violations {
		t.Error(v)
	}
	if n < 10 {
		t.Errorf("only %d status samples taken; the check saw too little", n)
	}
	t.Logf("%d grants (%d lost CAS races) over %d locks in %s; %d status samples, no token went backwards",
		total, conflicts.Load(), locks, churn.Round(time.Millisecond), n)
}

// sampleTokens lists the namespace's locks over and over until ctx ends and
// reports any lock whose status token went down between two samples.
func sampleTokens(ctx context.Context, ns string) (<-chan int, <-chan []string) {
	samples := make(chan int, 1)
	violations := make(chan []string, 1)
	go func() {
		last := map[string]int64{}
		var bad []string
		n := 0
		for ctx.Err() == nil {
			var list locksv1alpha1.DistributedLockList
			if err := k8sClient.List(ctx, &list, client.InNamespace(ns)); err == nil {
				n++
				for _, l := range list.Items {
					if prev, ok := last[l.Name]; ok && l.Status.FencingToken < prev {
						bad = append(bad, fmt.Sprintf("%s: status token went from %d to %d", l.Name, prev, l.Status.FencingToken))
					}
					last[l.Name] = l.Status.FencingToken
				}
			}
			time.Sleep(50 * time.Millisecond) // sampling interval
		}
		samples <- n
		violations <- bad
	}()
	return samples, violations
}
