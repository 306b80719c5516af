package lease

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

func tickets(l *coordinationv1.Lease) []string {
	var out []string
	for _, w := range Queue(l) {
		out = append(out, w.Ticket)
	}
	return out
}

func mustEnqueue(t *testing.T, l *coordinationv1.Lease, ws ...Waiter) *coordinationv1.Lease {
	t.Helper()
	for _, w := range ws {
		var err error
		if l, err = Enqueue(l, w); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func TestQueueOrderAndRemoval(t *testing.T) {
	l := mustEnqueue(t, heldLease("a", 4),
		Waiter{Identity: "b", Ticket: "tb"}, Waiter{Identity: "c", Ticket: "tc"},
		Waiter{Identity: "vip", Ticket: "tv", Priority: 5}, Waiter{Identity: "d", Ticket: "td"},
		Waiter{Identity: "vip2", Ticket: "tv2", Priority: 5}, Waiter{Identity: "b", Ticket: "tb"})
	if got, want := tickets(l), []string{"tv", "tv2", "tb", "tc", "td"}; !slices.Equal(got, want) {
		t.Fatalf("queue %v, want %v (priority first, then arrival; a ticket once)", got, want)
	}
	if Position(l, "tc") != 3 || Position(l, "nope") != -1 {
		t.Errorf("positions %d %d", Position(l, "tc"), Position(l, "nope"))
	}
	out, err := Dequeue(l, "tv2", "td")
	if err != nil || !slices.Equal(tickets(out), []string{"tv", "tb", "tc"}) {
		t.Errorf("dequeue: %v %v", tickets(out), err)
	}
	out, err = DequeueThrough(l, "tb")
	if err != nil || !slices.Equal(tickets(out), []string{"tc", "td"}) {
		t.Errorf("dequeue through tb: %v %v", tickets(out), err)
	}
	out, _ = Dequeue(l, "tv", "tv2", "tb", "tc", "td")
	if _, ok := out.Annotations[QueueAnnotation]; ok {
		t.Errorf("an empty queue leaves its annotation behind")
	}
	if len(Queue(heldLease("a", 1))) != 0 {
		t.Errorf("a Lease without a queue has waiters")
	}
}

func TestQueueIsBoundedAndToleratesGarbage(t *testing.T) {
	l := heldLease("a", 1)
	for i := range MaxQueue {
		l = mustEnqueue(t, l, Waiter{Identity: "w", Ticket: fmt.Sprint(i)})
	}
	if _, err := Enqueue(l, Waiter{Identity: "late", Ticket: "late"}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("enqueue into a full queue: %v", err)
	}
	l.Annotations[QueueAnnotation] = "not json"
	if q := Queue(l); len(q) != 0 {
		t.Errorf("malformed queue parsed as %v", q)
	}
	if l, err := Enqueue(l, Waiter{Identity: "x", Ticket: "tx"}); err != nil || !slices.Equal(tickets(l), []string{"tx"}) {
		t.Errorf("enqueue over a malformed queue: %v %v", tickets(l), err)
	}
}

func TestHandOffGivesTheHeadTheNextToken(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 9, 0, time.UTC)
	l := mustEnqueue(t, heldLease("a", 4), Waiter{Identity: "b", Ticket: "tb"}, Waiter{Identity: "c", Ticket: "tc"})
	out, head, ok, err := HandOff(l, "a", 20*time.Second, now)
	if err != nil || !ok || head.Ticket != "tb" {
		t.Fatalf("hand-off: %v %v %v", head, ok, err)
	}
	if Holder(out) != "b" || Token(out) != 5 || !out.Spec.AcquireTime.Time.Equal(now) || *out.Spec.LeaseDurationSeconds != 20 {
		t.Errorf("handed-off lease: holder %q token %d spec %+v", Holder(out), Token(out), out.Spec)
	}
	if out.Annotations[TicketAnnotation] != "tb" || out.Annotations[HandedOffByAnnotation] != "a" || !slices.Equal(tickets(out), []string{"tc"}) {
		t.Errorf("annotations %v", out.Annotations)
	}
	if out.ResourceVersion != l.ResourceVersion {
		t.Errorf("the hand-off must be a compare-and-swap on the version read")
	}
	// The next grant, whatever it is, forgets the hand-off marks.
	for name, next := range map[string]*coordinationv1.Lease{
		"renew keeps them": Renew(out, 20*time.Second, now),
		"release":          Release(out),
	} {
		_, kept := next.Annotations[TicketAnnotation]
		if kept != (name == "renew keeps them") {
			t.Errorf("%s: ticket annotation kept = %v", name, kept)
		}
	}
	if g, _ := Grant(out, "c", time.Second, now); g.Annotations[TicketAnnotation] != "" {
		t.Errorf("a grant kept the ticket of the hand-off before it")
	}
	if _, _, ok, _ := HandOff(heldLease("a", 4), "a", time.Second, now); ok {
		t.Errorf("a hand-off with nobody queued")
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
			out = append(out, strings.TrimPrefix(key, FrontLabelPrefix))
		}
	}
	slices.Sort(out)
	return out
}

// Every edit of the queue, and every grant, renewal and release, leaves
// front labels on exactly the first FrontLength waiters, so a waiter
// watching with FrontSelector hears of the Lease when it moves up to the
// front; a ticket that cannot be a label name gets none.
func TestEveryEditLabelsTheFrontOfTheQueue(t *testing.T) {
	now := time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC)
	queued := mustEnqueue(t, heldLease("a", 4), Waiter{Identity: "b", Ticket: "tb"}, Waiter{Identity: "c", Ticket: "tc"},
		Waiter{Identity: "d", Ticket: "td"})
	// stale: the queue as a client that does not set the labels left it
	// (the head and the next were dequeued, the labels kept).
	stale := queued.DeepCopy()
	stale.Annotations[QueueAnnotation] = `[{"id":"d","t":"td"}]`
	for _, tc := range []struct {
		name      string
		from      *coordinationv1.Lease
		edit      func(*coordinationv1.Lease) (*coordinationv1.Lease, error)
		wantFront []string
	}{
		{"registering at the back", queued, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
			return Enqueue(l, Waiter{Identity: "e", Ticket: "te"})
		}, []string{"tb", "tc"}},
		{"registering ahead of everyone", queued, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
			return Enqueue(l, Waiter{Identity: "vip", Ticket: "tv", Priority: 9})
		}, []string{"tb", "tv"}},
		{"the head leaving", queued, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) { return Dequeue(l, "tb") }, []string{"tc", "td"}},
		{"a grant skipping the head", queued, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) { return DequeueThrough(l, "tc") }, []string{"td"}},
		{"a hand-off to the head", queued, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
			out, _, _, err := HandOff(l, "a", time.Second, now)
			return out, err
		}, []string{"tc", "td"}},
		{"everyone leaving", queued, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) { return Dequeue(l, "tb", "tc", "td") }, nil},
		{"a ticket that is no label name", queued, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
			return Enqueue(l, Waiter{Identity: "odd", Ticket: "not a label name!", Priority: 9})
		}, []string{"tb"}},
		{"a renewal repairs stale labels", stale, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
			return Renew(l, time.Second, now), nil
		}, []string{"td"}},
		{"a grant repairs stale labels", stale, func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
			return Grant(Release(l), "x", time.Second, now)
		}, []string{"td"}},
		{"a break repairs stale labels", stale, Break, []string{"td"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := front(tc.from)
			out, err := tc.edit(tc.from)
			if err != nil {
				t.Fatal(err)
			}
			if got := front(out); !slices.Equal(got, tc.wantFront) {
				t.Errorf("front labels %v, want %v", got, tc.wantFront)
			}
			if !slices.Equal(front(tc.from), before) {
				t.Errorf("the edit changed the Lease it started from: %v", tc.from.Labels)
			}
		})
	}
	if sel := FrontSelector("tb"); sel != FrontLabelPrefix+"tb" {
		t.Errorf("FrontSelector: %q", sel)
	}
}
