package guard

import (
	"maps"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The edges of the grammar, with what it says of each: the table tests
// check both readers against these verdicts, and the fuzz targets start
// from them (with the corpus under testdata/fuzz).

var (
	identity253 = "a" + strings.Repeat("~ ", 125) + "~z"
	username340 = "system:serviceaccount:" + strings.Repeat("n", 63) + ":" + strings.Repeat("s", 254)
)

var placeEdges = []struct {
	ticket, value string
	ok            bool
}{
	{"t-1", "0,1,me", true},
	{"t-1", "-1,1,me", true},
	{"t-1", "1,1,me", true},
	{"t-1", "-0,1,me", false},
	{"t-1", "00,1,me", false},
	{"t-1", "01,1,me", false},
	{"t-1", "+1,1,me", false},
	{"t-1", " 1,1,me", false},
	{"t-1", "1 ,1,me", false},
	{"t-1", "2147483647,1,me", true},
	{"t-1", "2147483648,1,me", false},
	{"t-1", "-2147483648,1,me", true},
	{"t-1", "-2147483649,1,me", false},
	{"t-1", "9999999999,1,me", false},
	{"t-1", "-9999999999,1,me", false},
	{"t-1", "10000000000,1,me", false},
	{"t-1", "9223372036854775807,1,me", false},
	{"t-1", "9223372036854775808,1,me", false},
	{"t-1", "-9223372036854775809,1,me", false},
	{"t-1", "1e3,1,me", false},
	{"t-1", "0x10,1,me", false},
	{"t-1", "١,1,me", false},
	{"t-1", "0,0,me", false},
	{"t-1", "0,-1,me", false},
	{"t-1", "0,01,me", false},
	{"t-1", "0,+2,me", false},
	{"t-1", "0,2,me", true},
	{"t-1", "0,999999999999999,me", true},
	{"t-1", "0,999999999999998,me", true},
	{"t-1", "0,1000000000000000,me", false},
	{"t-1", "0,9223372036854775807,me", false},
	{"t-1", "0,9223372036854775808,me", false},
	{"t-1", "0,18446744073709551617,me", false},
	{"t-1", "0,١,me", false},
	{"t-1", "0,1,", false},
	{"t-1", "0,1", false},
	{"t-1", "0,,me", false},
	{"t-1", ",1,me", false},
	{"t-1", "", false},
	{"t-1", "0,1,a,b", true},
	{"t-1", "0,1,a b", true},
	{"t-1", "0,1, me", false},
	{"t-1", "0,1,me ", false},
	{"t-1", "0,1,me\n", false},
	{"t-1", "0,1,me\t", false},
	{"t-1", "0,1,m\x00e", false},
	{"t-1", "0,1,m\x7fe", false},
	{"t-1", "0,1,é", false},
	{"t-1", "0,1,\u00a0me", false},
	{"t-1", "0,1,\xff", false},
	{"t-1", "0,1," + identity253, true},
	{"t-1", "0,1," + identity253 + "z", false},
	{"t-1", "0,1,~", true},
	{"t-1", "0,1,,", true},
	{"a", "0,1,me", true},
	{"0", "0,1,me", true},
	{"a-b", "0,1,me", true},
	{strings.Repeat("a", 40), "0,1,me", true},
	{strings.Repeat("a", 41), "0,1,me", false},
	{"-a", "0,1,me", false},
	{"a-", "0,1,me", false},
	{"A", "0,1,me", false},
	{"a.b", "0,1,me", false},
	{"a_b", "0,1,me", false},
	{"", "0,1,me", false},
	{"é", "0,1,me", false},
	{"pod-0b8d3e4a-5f6c-4d7e-8f90-a1b2c3d4e5f6", "0,1,me", true}, // Go reads it; the guard refuses it to participants
}

var identityEdges = []struct {
	identity string
	ok       bool
}{
	{"me", true},
	{"a", true},
	{"~", true},
	{"a b", true},
	{"worker-0_7f3a/x:y@z", true},
	{"a,b,c", true},
	{identity253, true},
	{identity253 + "z", false},
	{"", false},
	{" ", false},
	{" me", false},
	{"me ", false},
	{"m\x00e", false},
	{"m\x7fe", false},
	{"me\n", false},
	{"é", false},
	{"\xff", false},
	{"ｍｅ", false},
}

var nonceEdges = []struct {
	nonce string
	ok    bool
}{
	{"n", true},
	{"A-z-09", true},
	{"0b8d3e4a-5f6c-4d7e-8f90-a1b2c3d4e5f6", true},
	{strings.Repeat("n", 64), true},
	{strings.Repeat("n", 65), false},
	{"", false},
	{"a_b", false},
	{"a b", false},
	{"a.b", false},
	{"é", false},
	{"n\n", false},
}

var principalEdges = []struct {
	username string
	uids     []string
	ok       bool
}{
	{username, []string{podUID}, true},
	{username, nil, true},
	{username, []string{}, true},
	{username, []string{podUID, "7c9e6679-7425-40de-944b-e07fc1f90ae7"}, true},
	{"alice", nil, true},
	{"alice@example.com", nil, true},
	{username340, nil, true},
	{username340 + "s", nil, false},
	{username340, []string{podUID}, true},
	{"alice smith", nil, false},
	{"alice\tsmith", nil, false},
	{"", nil, false},
	{"ålice", nil, false},
	{"alice\x00", nil, false},
	{"alice\n", nil, false},
	{username, []string{strings.ToUpper(podUID)}, false},
	{username, []string{"0b8d3e4a"}, false},
	{username, []string{""}, false},
	{username, []string{podUID + " "}, false},
	{username, []string{podUID + " user=x"}, false},
	{"x user=y", nil, false},
	{"user=alice", nil, true},
}

var numberEdges = []struct {
	s  string
	ok bool
}{
	{"0", true},
	{"1", true},
	{"15", true},
	{"2147483647", true},
	{"2147483648", true},
	{"999999999999999999", true},
	{"1000000000000000000", false},
	{"9223372036854775807", false},
	{"9223372036854775808", false},
	{"007", false},
	{"00", false},
	{"-0", false},
	{"-1", false},
	{"+1", false},
	{" 1", false},
	{"1 ", false},
	{"", false},
	{"1e3", false},
	{"١", false},
	{"0x1", false},
}

func TestGuardCompiles(t *testing.T) {
	for _, g := range mustGuards(t) {
		var names []string
		for _, p := range g.Policies {
			names = append(names, p.Spec.Name)
		}
		t.Logf("%s: compiled %v", g.Target.Name, names)
		if len(g.Policies) != 4 {
			t.Errorf("%s: %d policies, want lease-guard, lease-token-guard, lease-delete-guard, lease-create-guard", g.Target.Name, len(g.Policies))
		}
	}
}

func TestPlaceEdges(t *testing.T) {
	for _, e := range placeEdges {
		if _, ok := lease.ParsePlace(e.ticket, e.value); ok != e.ok {
			t.Errorf("ParsePlace(%q, %q) = %v, want %v", e.ticket, e.value, ok, e.ok)
		}
		checkRegistration(t, e.ticket, e.value)
		checkReading(t, withPlace(lockLease(), e.ticket, e.value, new(other)))
	}
}

// TestQueueEdges hands a lock on to each place of queues whose order
// turns on the edges of the numbers: the head as Go orders it, and no
// other, may be handed the lock.
func TestQueueEdges(t *testing.T) {
	for _, q := range queueEdges {
		l := heldBy(lockLease(), "holder", principalOf(worker()))
		for i := 0; i+1 < len(q); i += 2 {
			l = withPlace(l, q[i], q[i+1], new(other))
		}
		checkReading(t, l)
		checkHandOff(t, l)
	}
}

// queueEdges are queues, as ticket and value pairs.
var queueEdges = [][]string{
	{"a", "0,1,a", "b", "0,2,b"},
	{"a", "0,2,a", "b", "0,1,b"},
	{"a", "0,1,a", "b", "0,1,b"},
	{"b", "0,1,b", "a", "0,1,a"},
	{"a", "-1,1,a", "b", "0,2,b"},
	{"a", "2147483647,9,a", "b", "-2147483648,1,b"},
	{"a", "2147483648,1,a", "b", "0,2,b"},
	{"a", "10,1,a", "b", "9,1,b"},
	{"a", "-10,1,a", "b", "-9,1,b"},
	{"a", "0,10,a", "b", "0,9,b"},
	{"a", "0,999999999999999,a", "b", "0,1000000000000000,b"},
	{"a", "01,1,a", "b", "0,2,b"},
	{"a", "-0,1,a", "b", "0,2,b"},
	{"a", "0,1,a", "a-1", "0,1,b", "a0", "0,1,c"},
	{"pod-x", "5,1,p", "b", "0,2,b"},
	{"a", "0,1,a,b,c", "b", "0,2,b"},
	{"a", "0,1, a", "b", "0,2,b"},
}

func TestIdentityEdges(t *testing.T) {
	for _, e := range identityEdges {
		if lease.ValidIdentity(e.identity) != e.ok {
			t.Errorf("ValidIdentity(%q) = %v, want %v", e.identity, !e.ok, e.ok)
		}
		checkGrant(t, e.identity, "n-2", worker())
		checkRegistration(t, "t-1", "0,1,"+e.identity)
	}
}

func TestNonceEdges(t *testing.T) {
	for _, e := range nonceEdges {
		if lease.ValidNonce(e.nonce) != e.ok {
			t.Errorf("ValidNonce(%q) = %v, want %v", e.nonce, !e.ok, e.ok)
		}
		checkGrant(t, "me", e.nonce, worker())
	}
}

func TestPrincipalEdges(t *testing.T) {
	for _, e := range principalEdges {
		u := podUser(e.username, e.uids)
		if lease.ValidPrincipal(principalOf(u)) != e.ok {
			t.Errorf("ValidPrincipal(%q) = %v, want %v", principalOf(u), !e.ok, e.ok)
		}
		checkPrincipal(t, u)
	}
}

func TestNumberEdges(t *testing.T) {
	for _, e := range numberEdges {
		if _, ok := lease.ParseNumber(e.s); ok != e.ok {
			t.Errorf("ParseNumber(%q) = %v, want %v", e.s, ok, e.ok)
		}
		checkNumber(t, e.s)
	}
}

// TestQueuedByKeys: the principal a place records is the writer's own,
// written with the place, never alone, never changed.
func TestQueuedByKeys(t *testing.T) {
	me := worker()
	mine := principalOf(me)
	old := withPlace(lockLease(), "base", "0,1,base", new(other))
	cases := []struct {
		what string
		adds func() map[string]string
		ok   bool
	}{
		{"a place in the writer's name", func() map[string]string {
			return map[string]string{lease.EntryKey("t-1"): "0,2,me", lease.QueuedByKey("t-1"): mine}
		}, true},
		{"a place in another's name", func() map[string]string {
			return map[string]string{lease.EntryKey("t-1"): "0,2,me", lease.QueuedByKey("t-1"): other}
		}, false},
		{"a place in the writer's user's name, without its pod", func() map[string]string {
			return map[string]string{lease.EntryKey("t-1"): "0,2,me", lease.QueuedByKey("t-1"): "user=" + username}
		}, false},
		{"a place without queued-by", func() map[string]string {
			return map[string]string{lease.EntryKey("t-1"): "0,2,me"}
		}, false},
		{"queued-by without a place", func() map[string]string {
			return map[string]string{lease.QueuedByKey("t-1"): mine}
		}, false},
		{"queued-by of another's place changed to the writer", func() map[string]string {
			return map[string]string{lease.QueuedByKey("base"): mine}
		}, false},
		{"queued-by for another ticket", func() map[string]string {
			return map[string]string{lease.EntryKey("t-1"): "0,2,me", lease.QueuedByKey("t-2"): mine}
		}, false},
		{"a place of the manager's pod-<uid> form", func() map[string]string {
			return map[string]string{lease.EntryKey(locksv1alpha1.PodTicketPrefix + podUID): "0,2,me", lease.QueuedByKey(locksv1alpha1.PodTicketPrefix + podUID): mine}
		}, false},
		{"a seq equal to the highest, with a ticket sorting after it", func() map[string]string {
			return map[string]string{lease.EntryKey("c"): "0,1,me", lease.QueuedByKey("c"): mine}
		}, true},
		{"a seq equal to the highest, with a ticket sorting before it", func() map[string]string {
			return map[string]string{lease.EntryKey("a"): "0,1,me", lease.QueuedByKey("a"): mine}
		}, false},
		{"a seq two above the highest", func() map[string]string {
			return map[string]string{lease.EntryKey("t-1"): "0,3,me", lease.QueuedByKey("t-1"): mine}
		}, false},
	}
	for _, c := range cases {
		written := old.DeepCopy()
		maps.Copy(written.Annotations, c.adds())
		expect(t, update(old, written, me), c.ok, c.what)
	}
}

// fuzzUser is the user a principal fuzz input stands for: extra selects
// its pod UIDs (0: not bound to a pod, 1: uid, 2: uid and another, 3: an
// empty list).
func fuzzUser(name, uid string, extra uint8) user.Info {
	switch extra % 4 {
	case 1:
		return podUser(name, []string{uid})
	case 2:
		return podUser(name, []string{uid, podUID})
	case 3:
		return podUser(name, []string{})
	}
	return podUser(name, nil)
}

// TestMessageExpressionErrorKeepsTheRefusal checks what the apiserver does
// with a messageExpression that fails (here: one that indexes a place that
// is not there), and that Review reports it: the write is still refused,
// with the validation's expression as the message instead.
func TestMessageExpressionErrorKeepsTheRefusal(t *testing.T) {
	specs, err := LoadPolicies()
	if err != nil {
		t.Fatal(err)
	}
	spec := specs[slices.IndexFunc(specs, func(p *admissionregistrationv1.ValidatingAdmissionPolicy) bool { return p.Name == "lease-guard" })]
	i := slices.IndexFunc(spec.Spec.Validations, func(v admissionregistrationv1.Validation) bool {
		return strings.Contains(v.MessageExpression, "takes the seq one more")
	})
	spec.Spec.Validations[i].MessageExpression = "'seq ' + variables.ann[variables.newPlaceKeys[1]]"
	me := worker()
	old := withPlace(lockLease(), "base", "0,1,base", new(other))
	written := withPlace(old, "t-1", "0,3,me", new(principalOf(me)))
	for _, target := range Targets() {
		g, err := New(target, []*admissionregistrationv1.ValidatingAdmissionPolicy{spec})
		if err != nil {
			t.Fatal(err)
		}
		r := g.Review(update(old, written, me))
		if r.Admitted() || len(r.MessageErrors) != 1 || !strings.HasPrefix(r.Denials[0].Message, "failed expression: ") {
			t.Errorf("%s: %s; message errors %q", target.Name, r, r.MessageErrors)
		}
	}
	// The shipped message says so.
	for _, g := range mustGuards(t) {
		r := g.Review(update(old, written, me))
		if r.Admitted() || !strings.Contains(r.Denials[0].Message, lease.StaleQueueRefusal) {
			t.Errorf("%s: %s", g.Target.Name, r)
		}
	}
}

// TestMatchConditionsAndTheOtherPolicies checks the harness on what the
// grammar does not decide: who the guard judges (the manager and cluster
// admins it does not, lease-token-guard aside), deletes, and that each
// refusal's message evaluates.
func TestMatchConditionsAndTheOtherPolicies(t *testing.T) {
	old := heldBy(lockLease(), "holder", other)
	lowered := old.DeepCopy()
	lowered.Spec.LeaseTransitions = new(int32(token - 1))
	manager := &user.DefaultInfo{Name: managerUser, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	admin := &user.DefaultInfo{Name: "kubernetes-admin", Groups: []string{"system:masters", "system:authenticated"}}
	stranger := &user.DefaultInfo{Name: "example.com:lease-writer", Groups: []string{"system:authenticated"}}
	unrelated := lockLease()
	unrelated.Labels, unrelated.Finalizers = nil, nil
	renamed := unrelated.DeepCopy()
	renamed.Annotations["example.com/note"] = "anything"
	cases := []struct {
		what string
		req  Request
		ok   bool
	}{
		{"the manager lowering the token", update(old, lowered, manager), false},
		{"an admin lowering the token", update(old, lowered, admin), false},
		{"the manager writing its annotations", update(old, withPlace(old, locksv1alpha1.PodTicketPrefix+podUID, "0,1,x", new("user=x")), manager), true},
		{"a participant lowering the token", update(old, lowered, worker()), false},
		{"anyone writing a Lease that backs no lock", update(unrelated, renamed, stranger), true},
		{"a participant tying a Lease to a lock", update(unrelated, lockLease(), worker()), false},
		{"a participant creating a lock's Lease", Request{Operation: admission.Create, New: lockLease(), User: worker()}, false},
		{"a participant deleting a lock's Lease", Request{Operation: admission.Delete, Old: old, User: worker()}, false},
		{"a participant allowed to break deleting it", Request{Operation: admission.Delete, Old: old, User: worker(), Allowed: []string{"break"}}, true},
		{"anyone deleting it with its namespace", Request{Operation: admission.Delete, Old: old, User: stranger, NamespaceDeleting: true}, true},
		{"a participant breaking without the verb", update(old, breakOf(t, old), worker()), false},
		{"a participant breaking with the verb", update(old, breakOf(t, old), worker(), "break"), true},
	}
	for _, c := range cases {
		expect(t, c.req, c.ok, c.what)
	}
}

// breakOf is Go's break of l.
func breakOf(t *testing.T, l *coordinationv1.Lease) *coordinationv1.Lease {
	t.Helper()
	p, err := lease.BreakPatch(l)
	if err != nil {
		t.Fatal(err)
	}
	return apply(t, l, p)
}
