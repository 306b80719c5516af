package lock

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lease/leasetest"
)

// The lock the grant-path tests acquire: ns/billing, its Lease of the same
// name, a lease of leaseSeconds.
const (
	testNamespace = "ns"
	testLock      = "billing"
	testUID       = types.UID("uid-1")
	leaseSeconds  = 10
	testDuration  = leaseSeconds * time.Second
	// me is the identity of the client under test, user=alice its
	// principal; other is another client's (user=bob).
	me         = "me_0001"
	other      = "other_0002"
	mePrinc    = "user=alice"
	otherPrinc = "user=bob"
)

// fault is what the fake apiserver does with one write of the Lease in
// place of applying it and answering.
type fault struct {
	// first runs before the write is judged: another client's write
	// landing just before this one.
	first func(a *fakeAPI)
	// conflict answers 409 without applying the write.
	conflict bool
	// lost applies the write, then answers lost instead of the Lease (the
	// answer never came back).
	lost error
	// refused answers refused without applying the write (a 4xx, or a
	// 5xx that did not land).
	refused error
	// late applies the write and answers after the fake clock moved on by
	// late.
	late time.Duration
}

// fakeAPI is an apiserver's store of one Lease and one DistributedLock
// behind a fake clientset: resourceVersions that move with every write,
// Updates that conflict (409) on a stale resourceVersion, JSON patches whose
// tests fail answered 422 as the apiserver answers them, merge patches,
// watches, and faults per write.
type fakeAPI struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	cs    *fake.Clientset
	dyn   *dynamicfake.FakeDynamicClient

	mu      sync.Mutex
	rv      int
	lease   *coordinationv1.Lease // nil: none
	lock    *locksv1alpha1.DistributedLock
	lockErr error // every read of the lock's answer, when set
	writes  []string
	faults  map[int]fault // by write number, from 1
	always  *fault        // every write's, when set
	watches []*watch.RaceFreeFakeWatcher
}

// newFakeAPI serves l (nil: no Lease) and a lock that recorded the token
// recorded, whose principal for the client is mePrinc.
func newFakeAPI(t *testing.T, l *coordinationv1.Lease, recorded int64) *fakeAPI {
	t.Helper()
	a := &fakeAPI{t: t, clock: clocktesting.NewFakeClock(t0), faults: map[int]fault{}}
	a.lock = &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: testLock, Namespace: testNamespace, UID: testUID},
		Spec:       locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: leaseSeconds},
		Status:     locksv1alpha1.DistributedLockStatus{LeaseName: testLock, FencingToken: recorded},
	}
	if l != nil {
		a.put(l)
	}
	a.cs = fake.NewClientset()
	a.cs.PrependReactor("*", "leases", a.react)
	a.cs.PrependWatchReactor("leases", a.watch)
	a.cs.PrependReactor("create", "selfsubjectreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authenticationv1.SelfSubjectReview{Status: authenticationv1.SelfSubjectReviewStatus{
			UserInfo: authenticationv1.UserInfo{Username: "alice"}}}, nil
	})
	a.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{distributedLocks: "DistributedLockList"})
	a.dyn.PrependReactor("get", "distributedlocks", func(k8stesting.Action) (bool, runtime.Object, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.lockErr != nil {
			return true, nil, a.lockErr
		}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(a.lock.DeepCopy())
		if err != nil {
			return true, nil, err
		}
		return true, &unstructured.Unstructured{Object: u}, nil
	})
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, w := range a.watches {
			w.Stop()
		}
	})
	return a
}

// client is a Client of the lock as me, on the fake clock.
func (a *fakeAPI) client() *Client {
	a.t.Helper()
	c, err := NewForClients(a.cs, a.dyn, Config{Namespace: testNamespace, Name: testLock, Identity: me, Clock: a.clock})
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

// setLock changes the lock as the apiserver serves it.
func (a *fakeAPI) setLock(edit func(*locksv1alpha1.DistributedLock)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	edit(a.lock)
}

// put stores l as the Lease (nil: deletes it), at the next resourceVersion.
// Callers hold a.mu, or are the only goroutine.
func (a *fakeAPI) put(l *coordinationv1.Lease) {
	if l == nil {
		a.lease = nil
		return
	}
	a.rv++
	l = l.DeepCopy()
	l.ResourceVersion = strconv.Itoa(a.rv)
	a.lease = l
	for _, w := range a.watches {
		if !w.IsStopped() {
			w.Modify(l.DeepCopy())
		}
	}
}

// set replaces the Lease, as another writer would.
func (a *fakeAPI) set(l *coordinationv1.Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.put(l)
}

// current is a copy of the Lease as stored (nil: none).
func (a *fakeAPI) current() *coordinationv1.Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lease == nil {
		return nil
	}
	return a.lease.DeepCopy()
}

// writesSent is the writes of the Lease so far: update, json-patch or
// merge-patch each.
func (a *fakeAPI) writesSent() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.writes)
}

// apply writes the patch p, judged on the Lease as stored, as another
// client would (no fault).
func (a *fakeAPI) apply(p *lease.Patch) {
	a.t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	next, err := p.ApplyTo(a.lease)
	if err != nil {
		a.t.Fatalf("another client's write: %v", err)
	}
	a.put(next)
}

func (a *fakeAPI) notFound() error {
	return apierrors.NewNotFound(coordinationv1.Resource("leases"), testLock)
}

// react serves the Lease's gets and writes.
func (a *fakeAPI) react(action k8stesting.Action) (bool, runtime.Object, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if action.GetVerb() == "get" {
		if a.lease == nil {
			return true, nil, a.notFound()
		}
		return true, a.lease.DeepCopy(), nil
	}
	var verb string
	switch act := action.(type) {
	case k8stesting.UpdateActionImpl:
		verb = "update"
	case k8stesting.PatchActionImpl:
		verb = "json-patch"
		if act.GetPatchType() == types.MergePatchType {
			verb = "merge-patch"
		}
	default:
		return false, nil, nil
	}
	a.writes = append(a.writes, verb)
	f, ok := a.faults[len(a.writes)]
	if !ok && a.always != nil {
		f = *a.always
	}
	if f.first != nil {
		a.mu.Unlock()
		f.first(a)
		a.mu.Lock()
	}
	switch {
	case f.conflict:
		return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), testLock, nil)
	case f.refused != nil:
		return true, nil, f.refused
	case a.lease == nil:
		return true, nil, a.notFound()
	}
	next, err := a.write(action)
	if err != nil {
		return true, nil, err
	}
	a.put(next)
	if f.lost != nil {
		return true, nil, f.lost
	}
	if f.late > 0 {
		a.clock.Step(f.late)
	}
	return true, a.lease.DeepCopy(), nil
}

// write is the Lease as stored with action's write applied, or the
// apiserver's refusal.
func (a *fakeAPI) write(action k8stesting.Action) (*coordinationv1.Lease, error) {
	switch act := action.(type) {
	case k8stesting.UpdateActionImpl:
		l := act.GetObject().(*coordinationv1.Lease).DeepCopy()
		if l.ResourceVersion != a.lease.ResourceVersion {
			return nil, apierrors.NewConflict(coordinationv1.Resource("leases"), testLock, nil)
		}
		return l, nil
	case k8stesting.PatchActionImpl:
		old, err := json.Marshal(a.lease)
		if err != nil {
			return nil, err
		}
		var patched []byte
		if act.GetPatchType() == types.MergePatchType {
			patched, err = jsonpatch.MergePatch(old, act.GetPatch())
		} else {
			var p jsonpatch.Patch
			if p, err = jsonpatch.DecodePatch(act.GetPatch()); err == nil {
				patched, err = p.Apply(old)
			}
		}
		if err != nil {
			// As the apiserver answers a JSON patch whose tests failed:
			// 422, with no details.
			return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure,
				Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid, Message: err.Error()}}
		}
		l := &coordinationv1.Lease{}
		if err := json.Unmarshal(patched, l); err != nil {
			return nil, err
		}
		return l, nil
	}
	return nil, nil
}

// watch opens a watch of the Lease. One from a resourceVersion older than
// the Lease's brings the Lease as it is first, as a watch brings what
// changed since.
func (a *fakeAPI) watch(action k8stesting.Action) (bool, watch.Interface, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := watch.NewRaceFreeFake()
	a.watches = append(a.watches, w)
	from := action.(k8stesting.WatchActionImpl).WatchRestrictions.ResourceVersion
	if a.lease != nil && from != a.lease.ResourceVersion {
		w.Modify(a.lease.DeepCopy())
	}
	return true, w, nil
}

// servedLease is the lock's Lease in service (controlled by the lock with
// uid, with the token finalizer) with the given token, free.
func servedLease(uid types.UID, token int32) *leasetest.LeaseBuilder {
	return leasetest.MakeLease(testLock, testNamespace).Token(token).Duration(leaseSeconds).
		Label(locksv1alpha1.LockNameLabel, testLock).Annotation(locksv1alpha1.LockUIDAnnotation, string(uid))
}

// obj is b's Lease with the token finalizer.
func obj(b *leasetest.LeaseBuilder) *coordinationv1.Lease {
	l := b.Obj()
	l.Finalizers = append(l.Finalizers, locksv1alpha1.LeaseTokenFinalizer)
	return l
}

// heldBy is the served Lease granted to holder (bound to principal) with
// token, renewed at t0.
func heldBy(holder, principal string, token int32) *coordinationv1.Lease {
	return obj(servedLease(testUID, token).Held(holder, t0, t0).Annotation(locksv1alpha1.HolderPrincipalAnnotation, principal))
}

// queued is l with w registered in its queue.
func queued(t *testing.T, l *coordinationv1.Lease, w lease.Waiter) *coordinationv1.Lease {
	t.Helper()
	p, _, err := lease.ExactRegistration(l, w)
	if err != nil {
		t.Fatal(err)
	}
	next, err := p.ApplyTo(l)
	if err != nil {
		t.Fatal(err)
	}
	return next
}

// within runs until cond holds, failing the test after a few seconds.
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within 5s", what)
		case <-time.After(time.Millisecond):
		}
	}
}
