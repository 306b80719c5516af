package lock

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// casLease is one Lease behind a fake clientset that keeps the
// compare-and-swap of the apiserver: an Update must carry the current
// resourceVersion. raceRegistration, when set, decides what a registration
// (an Update that lengthens the queue) meets instead: another write landing
// first (a 409), or its own write landing with a 409 answer.
type casLease struct {
	mu      sync.Mutex
	l       *coordinationv1.Lease
	rv      int
	watches []time.Time
	// lost are the times of the registrations that got a 409.
	lost []time.Time
	// landedAt is when a registration landed (zero until one did).
	landedAt time.Time

	raceRegistration func(n int) (otherWins, landsUnanswered bool)
}

var leasesResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

// writeLocked stores l as the next version. Callers hold mu.
func (s *casLease) writeLocked(l *coordinationv1.Lease) *coordinationv1.Lease {
	s.rv++
	s.l = l.DeepCopy()
	s.l.ResourceVersion = strconv.Itoa(s.rv)
	return s.l.DeepCopy()
}

func (s *casLease) current() *coordinationv1.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.l.DeepCopy()
}

func (s *casLease) update(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.ResourceVersion != s.l.ResourceVersion {
		return nil, apierrors.NewConflict(leasesResource, l.Name, errors.New("stale"))
	}
	if len(lease.Queue(l)) > len(lease.Queue(s.l)) && s.raceRegistration != nil {
		otherWins, landsUnanswered := s.raceRegistration(len(s.lost) + 1)
		switch {
		case otherWins:
			s.writeLocked(s.l)
			s.lost = append(s.lost, time.Now())
			return nil, apierrors.NewConflict(leasesResource, l.Name, errors.New("another write won"))
		case landsUnanswered:
			s.writeLocked(l)
			s.landedAt = time.Now()
			s.lost = append(s.lost, time.Now())
			return nil, apierrors.NewConflict(leasesResource, l.Name, errors.New("retried after it landed"))
		}
		s.landedAt = time.Now()
	}
	return s.writeLocked(l), nil
}

// newCASClient is a client of lock billing whose Lease, held by "holder"
// on a 2 s lease, is s.
func newCASClient(t *testing.T) (*Client, *casLease) {
	t.Helper()
	now := time.Now()
	s := &casLease{rv: 10, l: &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "ns", ResourceVersion: "10",
			Annotations: map[string]string{locksv1alpha1.LockUIDAnnotation: "uid-1"},
			Labels:      map[string]string{locksv1alpha1.LockNameLabel: "billing"},
			Finalizers:  []string{locksv1alpha1.LeaseTokenFinalizer}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("holder"), LeaseDurationSeconds: ptr.To(int32(2)),
			AcquireTime: ptr.To(metav1.NewMicroTime(now)), RenewTime: ptr.To(metav1.NewMicroTime(now)), LeaseTransitions: ptr.To(int32(1))},
	}}
	cs := fake.NewClientset()
	cs.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, s.current(), nil
	})
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l, err := s.update(a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease))
		return true, l, err
	})
	cs.PrependWatchReactor("leases", func(k8stesting.Action) (bool, watch.Interface, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.watches = append(s.watches, time.Now())
		return true, watch.NewFake(), nil
	})
	dl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "DistributedLock",
		"metadata": map[string]any{"name": "billing", "namespace": "ns", "uid": "uid-1"},
		"spec":     map[string]any{"leaseDurationSeconds": int64(2)},
		"status":   map[string]any{"leaseName": "billing"},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{distributedLocks: "DistributedLockList"}, dl)
	c, err := NewForClients(cs, dyn, Config{Namespace: "ns", Name: "billing", Identity: "w"})
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// A waiter that loses registration races backs off between them, longer
// after each (registerBackoff), and watches nothing until its registration
// lands.
func TestWaiterBacksOffBetweenLostRegistrationRaces(t *testing.T) {
	c, s := newCASClient(t)
	const races = 6
	s.raceRegistration = func(n int) (bool, bool) { return n <= races, false }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := c.Acquire(ctx); done <- err }()
	for deadline := time.Now().Add(10 * time.Second); len(lease.Queue(s.current())) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never registered")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lost) != races {
		t.Fatalf("%d registration races lost, want %d", len(s.lost), races)
	}
	for i := 1; i < races; i++ {
		// After i races lost the waiter waits at least half of
		// registerBackoffBase doubled i-1 times.
		if gap, least := s.lost[i].Sub(s.lost[i-1]), (registerBackoffBase<<(i-1))/2; gap < least {
			t.Errorf("registration %d came %v after the race before it was lost, want at least %v", i+1, gap, least)
		}
	}
	for _, at := range s.watches {
		if at.Before(s.landedAt) {
			t.Errorf("a watch opened at %v, before the registration landed at %v", at, s.landedAt)
		}
	}
}

// A registration can land with a 409 for an answer (client-go resending a
// write whose first try landed). The waiter, backing off, is queued all the
// same: a hand-off to it meanwhile is taken up with a window counted from
// its first registration, and a waiter that gives up while backing off gets
// a *HeldError and leaves the queue.
func TestRegistrationThatLandedWithAConflict(t *testing.T) {
	landsUnanswered := func(n int) (bool, bool) { return n < 3, n == 3 }
	t.Run("hand-off while backing off", func(t *testing.T) {
		c, s := newCASClient(t)
		s.raceRegistration = landsUnanswered
		started := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		type result struct {
			g   *Grant
			err error
		}
		done := make(chan result, 1)
		go func() { g, err := c.Acquire(ctx); done <- result{g, err} }()
		for len(lease.Queue(s.current())) == 0 {
			time.Sleep(time.Millisecond)
		}
		s.mu.Lock()
		handed, _, ok, err := lease.HandOff(s.l, "holder", 2*time.Second, time.Now())
		if !ok || err != nil {
			s.mu.Unlock()
			t.Fatalf("hand-off: %v, %v", ok, err)
		}
		s.writeLocked(handed)
		s.mu.Unlock()
		r := <-done
		if r.err != nil {
			t.Fatalf("the hand-off was not taken up: %v", r.err)
		}
		// Nobody else can see the handed-off grant lapse before the first
		// registration was sent plus the lease: the waiter's window ends
		// before that.
		if limit := started.Add(2 * time.Second); r.g.ValidUntil().After(limit) {
			t.Errorf("the grant is trusted until %v, after the first registration plus the lease (%v)", r.g.ValidUntil(), limit)
		}
		r.g.stopRenewing()
	})
	t.Run("giving up while backing off", func(t *testing.T) {
		c, s := newCASClient(t)
		s.raceRegistration = landsUnanswered
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := c.Acquire(ctx); done <- err }()
		for len(lease.Queue(s.current())) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
		err := <-done
		if held := (*HeldError)(nil); !errors.As(err, &held) || held.Holder != "holder" {
			t.Errorf("giving up while backing off returned %v, want a *HeldError naming the holder", err)
		}
		if q := lease.Queue(s.current()); len(q) != 0 {
			t.Errorf("the waiter that gave up is still queued: %+v", q)
		}
	})
}
