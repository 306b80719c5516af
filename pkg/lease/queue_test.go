package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	coordinationv1 "k8s.io/api/coordination/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

func tickets(l *coordinationv1.Lease) []string {
	q := Queue(l)
	out := make([]string, 0, len(q))
	for _, w := range q {
		out = append(out, w.Ticket)
	}
	return out
}

// merge applies a merge patch to l as the apiserver would.
func merge(t *testing.T, l *coordinationv1.Lease, patch []byte) *coordinationv1.Lease {
	t.Helper()
	raw, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := jsonpatch.MergePatch(raw, patch)
	if err != nil {
		t.Fatalf("merge patch %s: %v", patch, err)
	}
	out := &coordinationv1.Lease{}
	if err := json.Unmarshal(merged, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// register registers each waiter in turn, each from the Lease as the
// previous registration left it.
func register(t *testing.T, l *coordinationv1.Lease, ws ...Waiter) *coordinationv1.Lease {
	t.Helper()
	for _, w := range ws {
		patch, _, err := Registration(l, w)
		if err != nil {
			t.Fatal(err)
		}
		l = merge(t, l, patch)
	}
	return l
}

func TestQueueOrder(t *testing.T) {
	l := register(t, heldLease("a", 4),
		Waiter{Principal: "user=b", Identity: "b", Ticket: "tb"}, Waiter{Principal: "user=c", Identity: "c", Ticket: "tc"},
		Waiter{Principal: "user=vip", Identity: "vip", Ticket: "tv", Priority: 5}, Waiter{Principal: "user=d", Identity: "d", Ticket: "td"},
		Waiter{Principal: "user=vip2", Identity: "vip2", Ticket: "tv2", Priority: 5}, Waiter{Principal: "user=low", Identity: "low", Ticket: "tl", Priority: -1})
	if got, want := tickets(l), []string{"tv", "tv2", "tb", "tc", "td", "tl"}; !slices.Equal(got, want) {
		t.Fatalf("queue %v, want %v (priority first, then arrival)", got, want)
	}
	if Position(l, "tc") != 3 || Position(l, "nope") != -1 {
		t.Errorf("positions %d %d", Position(l, "tc"), Position(l, "nope"))
	}
	// Two waiters registering from the same copy (at the same moment) get
	// the same Seq; the ticket orders them.
	from := heldLease("a", 4)
	p1, w1, _ := Registration(from, Waiter{Principal: "user=x", Identity: "x", Ticket: "t2"})
	p2, w2, _ := Registration(from, Waiter{Principal: "user=y", Identity: "y", Ticket: "t1"})
	both := merge(t, merge(t, from, p1), p2)
	if w1.Seq != w2.Seq || !slices.Equal(tickets(both), []string{"t1", "t2"}) {
		t.Errorf("concurrent registrations: seq %d %d, queue %v", w1.Seq, w2.Seq, tickets(both))
	}
	out := merge(t, l, mustWithdrawal(t, "tb"))
	if !slices.Equal(tickets(out), []string{"tv", "tv2", "tc", "td", "tl"}) {
		t.Errorf("after tb left: %v", tickets(out))
	}
	if !slices.Equal(tickets(merge(t, out, mustWithdrawal(t, "tb"))), tickets(out)) {
		t.Errorf("leaving twice changed the queue")
	}
}

func mustWithdrawal(t *testing.T, ticket string) []byte {
	t.Helper()
	p, err := Withdrawal(ticket)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestQueueKeepsWhoRegisteredAndIgnoresGarbage(t *testing.T) {
	l := register(t, heldLease("a", 1), Waiter{Principal: "user=id,with,commas", Identity: "id,with,commas", Ticket: "tb"})
	l.Annotations[QueuedByKey("tb")] = "user=alice"
	l.Annotations[EntryKey("bad")] = "not an entry"
	l.Annotations[EntryKey("bad2")] = "x,1,id"
	q := Queue(l)
	if len(q) != 1 || q[0].Identity != "id,with,commas" || q[0].Principal != "user=alice" || q[0].Seq != 1 {
		t.Errorf("queue %+v", q)
	}
}

func TestQueueIsBounded(t *testing.T) {
	l := heldLease("a", 1)
	l.Annotations = map[string]string{}
	for i := range MaxPlaces {
		l.Annotations[EntryKey(fmt.Sprint("t", i))] = fmt.Sprintf("0,%d,w", i+1)
		l.Annotations[QueuedByKey(fmt.Sprint("t", i))] = fmt.Sprint("user=u", i)
	}
	if _, _, err := Registration(l, Waiter{Principal: "user=late", Identity: "late", Ticket: "late"}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("registering in a full queue: %v", err)
	}
	if _, _, err := Registration(heldLease("a", 1), Waiter{Principal: "user=odd", Identity: "odd", Ticket: "not a label name!"}); err == nil {
		t.Errorf("a ticket that is no label name was registered")
	}
}

func TestTurnsLetTheHeadGoFirst(t *testing.T) {
	cases := []struct {
		position int
		lease    time.Duration
		want     time.Duration
	}{
		{0, 15 * time.Second, 0},
		{1, 15 * time.Second, 1500 * time.Millisecond},
		{3, 15 * time.Second, 4500 * time.Millisecond},
		{1, 2 * time.Second, 500 * time.Millisecond},
		{2, time.Second, time.Second},
	}
	for _, c := range cases {
		if got := Turn(c.position, c.lease); got != c.want {
			t.Errorf("Turn(%d, %s) = %s, want %s", c.position, c.lease, got, c.want)
		}
	}
}

// front is the tickets the Lease's front labels name, sorted.
func front(l *coordinationv1.Lease) []string {
	var out []string
	for key := range l.Labels {
		if IsFrontLabel(key) {
			out = append(out, strings.TrimPrefix(key, locksv1alpha1.FrontLabelPrefix))
		}
	}
	slices.Sort(out)
	return out
}

// A waiter registering labels itself when it joins the front of the queue,
// so that a waiter watching with FrontSelector hears of the Lease when it
// moves up.
func TestRegistrationLabelsTheFront(t *testing.T) {
	l := register(t, heldLease("a", 4), Waiter{Principal: "user=b", Identity: "b", Ticket: "tb"}, Waiter{Principal: "user=c", Identity: "c", Ticket: "tc"},
		Waiter{Principal: "user=d", Identity: "d", Ticket: "td"})
	if got := front(l); !slices.Equal(got, []string{"tb", "tc"}) {
		t.Errorf("front %v, want the first two", got)
	}
	vip := register(t, l, Waiter{Principal: "user=vip", Identity: "vip", Ticket: "tv", Priority: 9})
	if got := front(vip); !slices.Equal(got, []string{"tb", "tc", "tv"}) {
		t.Errorf("front %v: a waiter registering ahead labels itself and removes nobody's", got)
	}
	if got := front(merge(t, l, mustWithdrawal(t, "tb"))); !slices.Equal(got, []string{"tc"}) {
		t.Errorf("front %v: the waiter leaving takes its label along", got)
	}
	if sel := FrontSelector("tb"); sel != locksv1alpha1.FrontLabelPrefix+"tb" {
		t.Errorf("FrontSelector: %q", sel)
	}
}

func TestRegisteredKeepsOrderBehindExistingPlaces(t *testing.T) {
	l := &coordinationv1.Lease{}
	l.Labels = map[string]string{"locks.frontdesk.dev/lock": "billing"}
	l = SetQueue(l, []Waiter{{Principal: "user=cli", Identity: "cli", Ticket: "t0"}})
	out, err := Registered(l, []Waiter{{Principal: "user=a_1", Identity: "a_1", Ticket: "pod-1"}, {Principal: "user=b_2", Identity: "b_2", Ticket: "pod-2"}})
	if err != nil {
		t.Fatal(err)
	}
	q := Queue(out)
	got := make([]string, 0, len(q))
	for _, w := range q {
		got = append(got, w.Ticket)
	}
	if want := []string{"t0", "pod-1", "pod-2"}; !slices.Equal(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
	if len(Queue(l)) != 1 {
		t.Fatal("Registered modified its input")
	}
	if out.Labels[locksv1alpha1.FrontLabelPrefix+"pod-1"] != "true" || out.Labels[locksv1alpha1.FrontLabelPrefix+"pod-2"] != "" {
		t.Fatalf("front labels %v", out.Labels)
	}
}
