package util

import (
	"context"
	"fmt"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// LeaseHistory records every version of a Lease a watch delivers.
type LeaseHistory struct {
	mu       sync.Mutex
	versions []coordinationv1.Lease
	stop     func()
}

// GrantRecord is a version of the Lease where leaseTransitions went up.
type GrantRecord struct {
	Holder string
	Token  int32
}

// WatchLeaseHistory starts recording the Lease's versions from now on. The
// watch ends with ctx or Stop. A Lease deleted and recreated is followed
// only until its deletion.
func WatchLeaseHistory(ctx context.Context, cs kubernetes.Interface, namespace, name string) (*LeaseHistory, error) {
	leases := cs.CoordinationV1().Leases(namespace)
	current, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", namespace, name, err)
	}
	w, err := leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: current.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("watching lease %s/%s: %w", namespace, name, err)
	}
	h := &LeaseHistory{versions: []coordinationv1.Lease{*current}, stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && (ev.Type == watch.Modified || ev.Type == watch.Added) {
				h.mu.Lock()
				h.versions = append(h.versions, *l)
				h.mu.Unlock()
			}
		}
	}()
	return h, nil
}

// Stop ends the watch.
func (h *LeaseHistory) Stop() { h.stop() }

// Grants lists the versions where leaseTransitions went up, in order.
func (h *LeaseHistory) Grants() []GrantRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []GrantRecord
	var last int32
	for i, v := range h.versions {
		tok := ptr.Deref(v.Spec.LeaseTransitions, 0)
		if i > 0 && tok > last && v.Spec.HolderIdentity != nil {
			out = append(out, GrantRecord{Holder: *v.Spec.HolderIdentity, Token: tok})
		}
		last = max(last, tok)
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
