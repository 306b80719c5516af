package harness

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"
)

// LeaseHistory records every version of a Lease a watch delivers.
type LeaseHistory struct {
	mu       sync.Mutex
	versions []coordinationv1.Lease
	// at is when each version was received.
	at      []time.Time
	resumes int
	cancel  context.CancelFunc
	done    chan struct{}
}

// GrantRecord is a version of the Lease that grants the lock: see Grants.
type GrantRecord struct {
	Holder string
	Token  int32
}

// resumeInterval is how long the history waits before it watches again
// after its watch broke (an apiserver killed, a connection reset).
const resumeInterval = 200 * time.Millisecond

// WatchLeaseHistory starts recording the Lease's versions from now on,
// until ctx ends or Stop. When the watch breaks (its apiserver died, say),
// it reads the Lease again, records that version, and watches on from it:
// versions written while no watch was open are missed, but the order of
// the recorded ones stays the Lease's own.
func WatchLeaseHistory(ctx context.Context, cs kubernetes.Interface, namespace, name string) (*LeaseHistory, error) {
	leases := cs.CoordinationV1().Leases(namespace)
	current, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", namespace, name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &LeaseHistory{versions: []coordinationv1.Lease{*current}, at: []time.Time{time.Now()}, cancel: cancel, done: make(chan struct{})}
	go h.follow(ctx, leases, name, current.ResourceVersion)
	return h, nil
}

// follow watches from resourceVersion, and again from a fresh read each
// time the watch ends, until ctx ends.
func (h *LeaseHistory) follow(ctx context.Context, leases coordinationclient.LeaseInterface, name, resourceVersion string) {
	defer close(h.done)
	for {
		w, err := leases.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: resourceVersion,
		})
		if err == nil {
			h.record(w.ResultChan())
			w.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(resumeInterval):
		}
		if current, err := leases.Get(ctx, name, metav1.GetOptions{}); err == nil {
			h.mu.Lock()
			h.versions = append(h.versions, *current)
			h.at = append(h.at, time.Now())
			h.resumes++
			h.mu.Unlock()
			resourceVersion = current.ResourceVersion
		}
	}
}

// record appends the Leases a watch delivers until it ends.
func (h *LeaseHistory) record(events <-chan watch.Event) {
	for ev := range events {
		if l, ok := ev.Object.(*coordinationv1.Lease); ok && (ev.Type == watch.Modified || ev.Type == watch.Added) {
			h.mu.Lock()
			h.versions = append(h.versions, *l)
			h.at = append(h.at, time.Now())
			h.mu.Unlock()
		}
	}
}

// Stop ends the watch and waits for it to finish.
func (h *LeaseHistory) Stop() {
	h.cancel()
	<-h.done
}

// Resumes is how many times, after its watch broke, the history read the
// Lease again and watched on from there.
func (h *LeaseHistory) Resumes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.resumes
}

// Grants lists the versions that grant the lock, in order: the holder
// changed to a non-empty identity, or leaseTransitions changed under a
// holder. The tokens are as recorded, so a caller can check that each is
// above every token before it.
func (h *LeaseHistory) Grants() []GrantRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []GrantRecord
	for i := 1; i < len(h.versions); i++ {
		prev, cur := h.versions[i-1].Spec, h.versions[i].Spec
		holder := ptr.Deref(cur.HolderIdentity, "")
		if holder == "" {
			continue
		}
		tok := ptr.Deref(cur.LeaseTransitions, 0)
		if holder != ptr.Deref(prev.HolderIdentity, "") || tok != ptr.Deref(prev.LeaseTransitions, 0) {
			out = append(out, GrantRecord{Holder: holder, Token: tok})
		}
	}
	return out
}

// Tokens lists leaseTransitions of every recorded version, in order.
func (h *LeaseHistory) Tokens() []int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]int32, len(h.versions))
	for i, v := range h.versions {
		out[i] = ptr.Deref(v.Spec.LeaseTransitions, 0)
	}
	return out
}

// Versions is every recorded version of the Lease, in order (a copy).
func (h *LeaseHistory) Versions() []coordinationv1.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.versions)
}

// ReceivedAt is when each of Versions was received, in the same order.
func (h *LeaseHistory) ReceivedAt() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.at)
}
