package cli

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

func TestPrintableEscapesAllButPrintableASCII(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"alice", "alice"},
		{`job-7_1a2b !"#$%&'()*+,-./:;<=>?@[\]^_{|}~`, `job-7_1a2b !"#$%&'()*+,-./:;<=>?@[\]^_{|}~`},
		{"", ""},
		{"a\nFencing token: 999", `a\nFencing token: 999`},
		{"a\r\n\t\v\f\a\b", `a\r\n\t\v\f\a\b`},
		{"\x1b[2J\x1b]0;pwned\x07", `\x1b[2J\x1b]0;pwned\a`},
		{"\x00\x7f", `\x00\x7f`},
		{"caf\u00e9", `caf\u00e9`},
		{"\u202eevil\u2066", `\u202eevil\u2066`},
		{"\xff\xfe ok \xc3", `\xff\xfe ok \xc3`},
		{"\U0001F512", `\U0001f512`},
		{"\ufeff\u200b", `\ufeff\u200b`},
	} {
		if got := printable(tc.in); got != tc.want {
			t.Errorf("printable(%q) = %s, want %s", tc.in, got, tc.want)
		}
		if again := printable(printable(tc.in)); again != printable(tc.in) {
			t.Errorf("printable is not idempotent on %q: %s", tc.in, again)
		}
	}
	// Every byte, alone and in a string: only printable ASCII comes out.
	for b := range 256 {
		if out := printable(string([]byte{'x', byte(b), 'y'})); !onlyPrintable(out) {
			t.Errorf("printable(byte %#x) = %q", b, out)
		}
	}
}

// onlyPrintable reports whether s holds printable ASCII and line feeds only.
func onlyPrintable(s string) bool {
	for i := 0; i < len(s); i++ {
		if (s[i] < ' ' && s[i] != '\n') || s[i] > '~' {
			return false
		}
	}
	return true
}

// hostile forges lines and moves the cursor: what a holder identity
// written before the lease-guard policy (or by an admin) may hold.
const hostile = "mallory\nFencing token:\t999\nHeld:\tFalse\x1b[1A\x1b[2K\r\u202e\x7f\xff\tbilling   eve   999   True"

// expectSafe checks that out is printable ASCII and line feeds only, and
// that no line starts with one of the labels a hostile string forges
// more than once.
func expectSafe(t *testing.T, what, out string, labels ...string) {
	t.Helper()
	if !onlyPrintable(out) {
		t.Errorf("%s: a raw control or non-ASCII byte reaches the output:\n%q", what, out)
	}
	for _, label := range labels {
		n := 0
		for line := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(line, label) {
				n++
			}
		}
		if n > 1 {
			t.Errorf("%s: %d lines start with %q (forged):\n%s", what, n, label, out)
		}
	}
}

// hostileView is a lock whose Lease, status, conditions and queue all
// carry hostile strings.
func hostileView() *lockView {
	l := testutil.MakeLock("billing", "ns").Status(locksv1alpha1.DistributedLockStatus{
		Holder: hostile, FencingToken: 2, HolderPod: hostile, LeaseName: "billing", GatedPods: 1, OldestGatedPod: hostile,
	}).Obj()
	l.UID = "0c0c0c0c-0000-4000-8000-000000000001"
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{Type: locksv1alpha1.ConditionReady,
		Status: metav1.ConditionFalse, Reason: "Bad\x1b[31m", Message: hostile})
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{Type: locksv1alpha1.ConditionHeld,
		Status: metav1.ConditionTrue, Reason: "Held", Message: hostile})
	le := testutil.MakeLease("billing", "ns").Token(3).Holder(hostile).Duration(15).Obj()
	lease.SetController(le, l.UID)
	le = lease.SetQueue(le, []lease.Waiter{
		{Identity: "bob", Ticket: "t1", Principal: "user=bob"},
		{Identity: "job_0c0c0c0c-0000-4000-8000-000000000002", Ticket: "pod-0c0c0c0c-0000-4000-8000-000000000002",
			Principal: "user=system:serviceaccount:frontdesk-system:frontdesk-controller-manager"},
	})
	return &lockView{lock: l, leaseName: "billing", lease: le}
}

func TestEveryHumanOutputEscapesClusterStrings(t *testing.T) {
	v := hostileView()
	now := time.Now()
	events := []corev1.Event{{Type: "Normal\n", Reason: "Acquired\x1b[2J", Message: hostile, LastTimestamp: metav1.NewTime(now)}}

	var out bytes.Buffer
	q := queueView{known: true, places: []queuedPlace{
		{Waiter: lease.Waiter{Identity: hostile, Principal: "user=" + hostile, Seq: 1}},
		{Waiter: lease.Waiter{Identity: "job_x", Seq: 2}, pod: hostile, created: &metav1.Time{Time: now}},
	}, podErr: errors.New(hostile)}
	if err := describe(&out, v, q, eventList{items: events}, now); err != nil {
		t.Fatal(err)
	}
	expectSafe(t, "describe", out.String(), "Fencing token:", "Held:", "Holder:")
	if !strings.Contains(out.String(), `mallory\nFencing token:\t999`) {
		t.Errorf("describe does not show the identity escaped:\n%s", out.String())
	}

	for _, wide := range []bool{false, true} {
		out.Reset()
		if err := printTable(&out, []lockView{*v}, wide); err != nil {
			t.Fatal(err)
		}
		expectSafe(t, fmt.Sprintf("get (wide %v)", wide), out.String(), "billing")
		if lines := strings.Count(out.String(), "\n"); lines != 2 {
			t.Errorf("get prints %d lines for one lock, want the header and one row:\n%s", lines, out.String())
		}
	}

	// The Lease and the status disagree: get's warning names both holders.
	out.Reset()
	printWarnings(&out, []lockView{*v})
	expectSafe(t, "get's warning", out.String(), "warning:")
	if !strings.Contains(out.String(), "warning: lock billing: status stale") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("want one warning line on the stale status:\n%s", out.String())
	}
	// A Lease with a holder and no token.
	malformed := hostileView()
	malformed.lease.Spec.LeaseTransitions = nil
	out.Reset()
	printWarnings(&out, []lockView{*malformed})
	expectSafe(t, "get's warning (malformed Lease)", out.String(), "warning:")

	out.Reset()
	if err := printGrant(&out, grantInfo{Lock: "ns/billing", Holder: hostile, FencingToken: 3}, "", "billing"); err != nil {
		t.Fatal(err)
	}
	expectSafe(t, "acquire", out.String(), "acquired")

	// An error that quotes the Lease (as lock.HeldError does).
	out.Reset()
	o := &options{config: genericclioptions.NewConfigFlags(true)}
	printError(&out, fmt.Errorf("lock ns/billing is held by %s (fencing token 3)", hostile), nil, o)
	expectSafe(t, "an error", out.String(), "error:", "Fencing token:")
}

func TestWaitersAreListedHeadFirstWithGatedPods(t *testing.T) {
	v := hostileView()
	created := metav1.NewTime(time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC))
	q := queueView{known: true}
	for _, w := range lease.Queue(v.lease) {
		p := queuedPlace{Waiter: w}
		if name, _ := gatedPodOf(w); name != "" {
			p.pod, p.created = name, &created
		}
		q.places = append(q.places, p)
	}
	var out bytes.Buffer
	if err := describeQueue(&out, q, created.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`Waiters:  2, in the order they get the lock`,
		`#  IDENTITY +PRINCIPAL +PRIORITY +SEQ +POD +WAITING SINCE`,
		`1  bob +user=bob +0 +1 +<none> +<not recorded>`,
		`2  job_0c0c0c0c-0000-4000-8000-000000000002 +user=system:serviceaccount:frontdesk-system:frontdesk-controller-manager +0 +2 +job +2026-05-01T10:00:00Z \(pod created 3m ago\)`,
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		if !matches(w, strings.TrimSpace(lines[i])) {
			t.Errorf("line %d = %q, want /%s/", i, lines[i], w)
		}
	}
	if got := v.waiting(); got != "2" {
		t.Errorf("WAITING = %s, want 2", got)
	}
	if got := (&lockView{lock: v.lock, leaseName: "billing"}).waiting(); got != "<unknown>" {
		t.Errorf("WAITING without a Lease = %s, want <unknown>", got)
	}

	out.Reset()
	_ = describeQueue(&out, queueView{known: true}, time.Now())
	if out.String() != "Waiters:  <none>\n" {
		t.Errorf("empty queue: %q", out.String())
	}
	out.Reset()
	_ = describeQueue(&out, queueView{}, time.Now())
	if out.String() != "Waiters:  <unknown> (the Lease cannot be used)\n" {
		t.Errorf("unusable Lease: %q", out.String())
	}
}

func TestGatedPodOfNeedsTheControllersTicket(t *testing.T) {
	uid := "0c0c0c0c-0000-4000-8000-000000000002"
	for _, tc := range []struct {
		w    lease.Waiter
		want string
	}{
		{lease.Waiter{Identity: "job_" + uid, Ticket: locksv1alpha1.PodTicketPrefix + uid}, "job"},
		{lease.Waiter{Identity: "job_" + uid, Ticket: "t1"}, ""},                                       // a client under a pod's identity
		{lease.Waiter{Identity: "job_" + uid, Ticket: "pod-0c0c0c0c-0000-4000-8000-000000000003"}, ""}, // another pod's ticket
		{lease.Waiter{Identity: "job", Ticket: locksv1alpha1.PodTicketPrefix + uid}, ""},               // no UID in the identity
	} {
		if got, _ := gatedPodOf(tc.w); got != tc.want {
			t.Errorf("gatedPodOf(%+v) = %q, want %q", tc.w, got, tc.want)
		}
	}
}

func TestAdmittedPodIsTheGrantTheManagerMarked(t *testing.T) {
	uid := "0c0c0c0c-0000-4000-8000-000000000002"
	identity := "job_" + uid
	v := hostileView()
	v.lease.Spec.HolderIdentity = new(identity)
	if _, _, ok := v.admittedPod(); ok {
		t.Errorf("a grant without the mark is not an admitted pod's")
	}
	v.lease.Annotations[locksv1alpha1.AdmittedGrantAnnotation] = identity + ",2" // an earlier grant's
	if _, _, ok := v.admittedPod(); ok {
		t.Errorf("a mark of another token is not this grant's")
	}
	v.lease.Annotations[locksv1alpha1.AdmittedGrantAnnotation] = identity + ",3"
	pod, gotUID, ok := v.admittedPod()
	if !ok || pod != "job" || gotUID != uid {
		t.Errorf("admittedPod = %q, %q, %v; want job, %s, true", pod, gotUID, ok, uid)
	}
	var out bytes.Buffer
	if err := describe(&out, v, queueView{known: true}, eventList{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "the holder is pod job (uid "+uid+"), admitted by the frontdesk controller") {
		t.Errorf("describe does not say the holder is an admitted pod:\n%s", out.String())
	}
}

func TestForbiddenHintNamesTheRoleAndTheCommand(t *testing.T) {
	rbac := func(user, verb, resource, group, ns string) error {
		msg := fmt.Sprintf("User %q cannot %s resource %q in API group %q in the namespace %q", user, verb, resource, group, ns)
		return fmt.Errorf("reading distributedlock %s/billing: %w", ns,
			apierrors.NewForbidden(schema.GroupResource{Group: group, Resource: resource}, "billing", errors.New(msg)))
	}
	for _, tc := range []struct {
		name string
		err  error
		verb string
		want string
	}{
		{"a ServiceAccount", rbac("system:serviceaccount:team:nobody", "get", "distributedlocks", "locks.frontdesk.dev", "team"), "run",
			"bind ClusterRole frontdesk-lock-user to system:serviceaccount:team:nobody in namespace team: " +
				"kubectl create rolebinding frontdesk-lock-user-nobody --clusterrole=frontdesk-lock-user --serviceaccount=team:nobody -n team"},
		{"a user, breaking", rbac("alice@example.com", "get", "distributedlocks", "locks.frontdesk.dev", "team"), "break",
			"bind ClusterRole frontdesk-lock-admin to alice@example.com in namespace team: " +
				"kubectl create rolebinding frontdesk-lock-admin-alice-example.com --clusterrole=frontdesk-lock-admin --user=alice@example.com -n team"},
		{"a Lease update", rbac("bob", "update", "leases", "coordination.k8s.io", "team"), "release",
			"bind ClusterRole frontdesk-lock-user to bob in namespace team: " +
				"kubectl create rolebinding frontdesk-lock-user-bob --clusterrole=frontdesk-lock-user --user=bob -n team"},
		{"a user with a space", rbac("Jane Doe", "list", "events", "", "team"), "describe",
			"--user='Jane Doe' -n team"},
		{"the lease guard's refusal", apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "billing",
			errors.New(`ValidatingAdmissionPolicy 'frontdesk-lease-guard' with binding 'frontdesk-lease-guard' denied request: ending another's grant needs the verb "break"`)),
			"break", ""},
		{"impersonation", apierrors.NewForbidden(schema.GroupResource{Resource: "users"}, "alice",
			errors.New(`User "bob" cannot impersonate resource "users" in API group "" at the cluster scope`)), "get", ""},
		{"not forbidden", apierrors.NewNotFound(schema.GroupResource{Resource: "distributedlocks"}, "billing"), "get", ""},
		{"no error", nil, "get", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := forbiddenHint(tc.err, tc.verb, "default")
			switch {
			case tc.want == "" && got != "":
				t.Errorf("want no hint, got %q", got)
			case !strings.Contains(got, tc.want):
				t.Errorf("hint = %q, want it to contain %q", got, tc.want)
			}
		})
	}
}

// matches reports whether s matches the regular expression re, whole.
func matches(re, s string) bool {
	return regexp.MustCompile("^" + re + "$").MatchString(s)
}
