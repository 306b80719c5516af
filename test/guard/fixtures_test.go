package guard

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The lock, and who writes its Lease: a pod-bound ServiceAccount token (the
// request's userInfo as kube-apiserver gives it), and the principal of
// another pod that queued before.
const (
	namespace   = "team"
	lockName    = "demo"
	username    = "system:serviceaccount:team:worker"
	podUID      = "0b8d3e4a-5f6c-4d7e-8f90-a1b2c3d4e5f6"
	other       = "pod=7c9e6679-7425-40de-944b-e07fc1f90ae7 user=system:serviceaccount:team:worker"
	managerUser = "system:serviceaccount:frontdesk-system:frontdesk-controller-manager"
	duration    = 15 // the lock's lease duration, in seconds
	token       = 7  // the Lease's leaseTransitions
)

// now is the time of every write.
var now = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

// worker is the pod-bound ServiceAccount that writes.
func worker() user.Info {
	return podUser(username, []string{podUID})
}

// podUser is a ServiceAccount user with the given pod UIDs in its extra
// (none: not bound to a pod).
func podUser(name string, uids []string) user.Info {
	u := &user.DefaultInfo{Name: name, UID: "5f1e0c42-0d7c-4a5a-9a59-2f0e8e1f9a10",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	if uids != nil {
		u.Extra = map[string][]string{
			lease.PodUIDExtra:                        uids,
			"authentication.kubernetes.io/pod-name":  {"worker-0"},
			"authentication.kubernetes.io/node-name": {"node-a"},
		}
	}
	return u
}

// principalOf is u's principal as Go forms it.
func principalOf(u user.Info) string { return lease.Principal(u.GetName(), u.GetExtra()) }

// lockLease is the Lease of the lock as the manager keeps it: free, at
// token, with the lock's duration.
func lockLease() *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: lockName, Namespace: namespace, UID: "9d5bf4c3-68a3-4c57-9f0e-2c1c1a8f2b11", ResourceVersion: "100",
			Labels: map[string]string{locksv1alpha1.LockNameLabel: lockName},
			Annotations: map[string]string{
				locksv1alpha1.LockUIDAnnotation:       "3f0e5a5e-1f55-4bd6-b6a4-3a3b0f1c2d3e",
				locksv1alpha1.LeaseOriginAnnotation:   locksv1alpha1.LeaseOriginCreated,
				locksv1alpha1.LeaseDurationAnnotation: strconv.Itoa(duration),
			},
			Finalizers: []string{locksv1alpha1.LeaseTokenFinalizer},
		},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: new(int32(duration)), LeaseTransitions: new(int32(token))},
	}
}

// heldBy is l granted to identity, bound to principal, a while ago.
func heldBy(l *coordinationv1.Lease, identity, principal string) *coordinationv1.Lease {
	l = l.DeepCopy()
	t := metav1.NewMicroTime(now.Add(-5 * time.Second))
	l.Spec.HolderIdentity = new(identity)
	l.Spec.AcquireTime, l.Spec.RenewTime = &t, &t
	l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = principal
	l.Annotations[locksv1alpha1.GrantNonceAnnotation] = "n-1"
	return l
}

// withPlace is l with a place: its value and queued-by (none when
// queuedBy is nil).
func withPlace(l *coordinationv1.Lease, ticket, value string, queuedBy *string) *coordinationv1.Lease {
	l = l.DeepCopy()
	l.Annotations[lease.EntryKey(ticket)] = value
	if queuedBy != nil {
		l.Annotations[lease.QueuedByKey(ticket)] = *queuedBy
	}
	return l
}

// apply is l with p applied, as the apiserver applies it.
func apply(t testing.TB, l *coordinationv1.Lease, p *lease.Patch) *coordinationv1.Lease {
	t.Helper()
	out, err := p.ApplyTo(l)
	if err != nil {
		t.Fatalf("applying %s: %v", p, err)
	}
	return out
}

// viaJSON is l as a client that reads it as JSON sees it (invalid UTF-8
// replaced), so that Go's writers, which apply their patches to JSON,
// change nothing else.
func viaJSON(t testing.TB, l *coordinationv1.Lease) *coordinationv1.Lease {
	t.Helper()
	raw, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	out := &coordinationv1.Lease{}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// storable is whether the apiserver's validation of the object takes l
// (it runs before validating admission): annotation and label keys and
// values.
func storable(l *coordinationv1.Lease) bool {
	return len(apivalidation.ValidateObjectMeta(&l.ObjectMeta, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))) == 0
}

// guards are the guard compiled for every target.
var guards = sync.OnceValues(func() ([]*Guard, error) {
	var out []*Guard
	for _, t := range Targets() {
		g, err := Compile(t)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		out = append(out, g)
	}
	return out, nil
})

func mustGuards(t testing.TB) []*Guard {
	t.Helper()
	gs, err := guards()
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

// update is u's UPDATE of old to written, with the verbs allowed it on the lock.
func update(old, written *coordinationv1.Lease, u user.Info, allowed ...string) Request {
	return Request{Operation: admission.Update, Old: old, New: written, User: u, Allowed: allowed}
}

// expect checks that every guard admits req exactly when want, that the
// apiserver would store the object at all when want, and that every
// refusal comes with its message. what describes the case.
func expect(t testing.TB, req Request, want bool, what string) {
	t.Helper()
	stored := req.New == nil || storable(req.New)
	if want && !stored {
		t.Errorf("%s: Go accepts a write the apiserver's object validation refuses", what)
	}
	for _, g := range mustGuards(t) {
		r := g.Review(req)
		if got := stored && r.Admitted(); got != want {
			t.Errorf("%s: DISAGREEMENT on %s: Go says %s, the guard %s\nwrite: %s", what, g.Target.Name, verdict(want), r, diff(req.Old, req.New))
		}
		for _, m := range r.MessageErrors {
			t.Errorf("%s: %s: %s", what, g.Target.Name, m)
		}
		if lease.ValidPrincipal(principalOf(req.User)) {
			for _, m := range r.MessagesDropped {
				t.Errorf("%s: %s: %s", what, g.Target.Name, m)
			}
		}
	}
}

func verdict(admit bool) string {
	if admit {
		return "admit"
	}
	return "refuse"
}

// diff shows what a write changes, for failures.
func diff(old, written *coordinationv1.Lease) string {
	if old == nil || written == nil {
		return "(create or delete)"
	}
	var b strings.Builder
	for k, v := range written.Annotations {
		if ov, ok := old.Annotations[k]; !ok || ov != v {
			fmt.Fprintf(&b, "\n  +annotation %q: %q", k, v)
		}
	}
	for k := range old.Annotations {
		if _, ok := written.Annotations[k]; !ok {
			fmt.Fprintf(&b, "\n  -annotation %q", k)
		}
	}
	for k, v := range written.Labels {
		if ov, ok := old.Labels[k]; !ok || ov != v {
			fmt.Fprintf(&b, "\n  +label %q: %q", k, v)
		}
	}
	for k := range old.Labels {
		if _, ok := written.Labels[k]; !ok {
			fmt.Fprintf(&b, "\n  -label %q", k)
		}
	}
	before, err1 := json.Marshal(old.Spec)
	after, err2 := json.Marshal(written.Spec)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintf(&b, "\n  spec: %v", err)
	} else if string(before) != string(after) {
		fmt.Fprintf(&b, "\n  spec %s\n    -> %s", before, after)
	}
	return b.String()
}
