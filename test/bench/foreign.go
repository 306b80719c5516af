package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// foreignNamespace holds the Leases that back no lock.
const foreignNamespace = "cost-foreign"

// foreignRenewEvery is how often each foreign Lease is renewed while
// measuring: a node's heartbeat Lease is renewed every 10 s.
const foreignRenewEvery = 10 * time.Second

// createForeignLeases creates n Leases that no DistributedLock names, held
// by components of their own, as node heartbeats are.
func createForeignLeases(ctx context.Context, cs kubernetes.Interface, n int) error {
	if n <= 0 {
		return nil
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: foreignNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", foreignNamespace, err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = foreignLeaseName(i)
	}
	return parallel(32, names, func(name string) error {
		now := metav1.NewMicroTime(time.Now())
		_, err := cs.CoordinationV1().Leases(foreignNamespace).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: new(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating foreign lease %s: %w", name, err)
		}
		return nil
	})
}

func foreignLeaseName(i int) string { return fmt.Sprintf("node-%05d", i) }

// churnForeign, until ctx ends, renews every foreign Lease every 10 s and
// changes one unrelated pod in 60 each second (an annotation, as a status
// or label change would), spread evenly over 8 workers; it returns how
// many Lease and pod changes landed.
func churnForeign(ctx context.Context, cs kubernetes.Interface, opts CostOptions) foreignWrites {
	var done foreignWrites
	if !opts.ForeignChurn {
		return done
	}
	leasesPerSecond := float64(opts.ForeignLeases) / foreignRenewEvery.Seconds()
	perSecond := leasesPerSecond + float64(opts.Pods)/60
	if perSecond <= 0 {
		return done
	}
	jobs := make(chan int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for n := range jobs {
				isLease := rand.Float64()*perSecond < leasesPerSecond
				err := touchForeign(ctx, cs, opts, n, isLease)
				mu.Lock()
				switch {
				case err != nil:
				case isLease:
					done.leases++
				default:
					done.pods++
				}
				mu.Unlock()
			}
		})
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			close(jobs)
			wg.Wait()
			return done
		case <-tick.C:
		}
		select {
		case jobs <- n:
		case <-ctx.Done():
		}
	}
}

// foreignWrites counts the changes churnForeign made.
type foreignWrites struct{ leases, pods int }

// touchForeign renews foreign Lease n (modulo their number), or changes a
// random unrelated pod.
func touchForeign(ctx context.Context, cs kubernetes.Interface, opts CostOptions, n int, isLease bool) error {
	if isLease {
		now := metav1.NewMicroTime(time.Now())
		patch := fmt.Sprintf(`{"spec":{"renewTime":%q}}`, now.Format(metav1.RFC3339Micro))
		_, err := cs.CoordinationV1().Leases(foreignNamespace).Patch(ctx, foreignLeaseName(n%opts.ForeignLeases),
			types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"example.com/revision":"%d"}}}`, n)
	_, err := cs.CoreV1().Pods(podsNamespace).Patch(ctx, workloadPodName(rand.IntN(opts.Pods)),
		types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// readWatchEvents scrapes apiserver_watch_events_total, summed by
// resource ("leases", "pods", ...).
func readWatchEvents(ctx context.Context, cs kubernetes.Interface) (map[string]float64, error) {
	events := map[string]float64{}
	err := scrapeCounter(ctx, cs, "apiserver_watch_events_total", func(labels map[string]string, value float64) {
		resource := labels["resource"]
		if resource == "" {
			resource = labels["kind"]
		}
		events[resourceOf(resource)] += value
	})
	return events, err
}

// Resources as the apiserver's metrics name them.
const (
	leasesResource = "leases"
	podsResource   = "pods"
)

// resourceOf names a watch-event label value by resource: older apiservers
// label by kind ("Lease"), newer by resource ("leases").
func resourceOf(v string) string {
	switch strings.ToLower(v) {
	case "lease", leasesResource:
		return leasesResource
	case "pod", podsResource:
		return podsResource
	}
	return strings.ToLower(v)
}
