package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The waiters of a lock queue up on its Lease, in an annotation, so that the
// queue changes atomically with the grants: a waiter registers with one
// compare-and-swap, a graceful release hands the lock to the head of the
// queue in the same write that ends the holder's grant, and when the lock
// falls free otherwise (the holder lapsed, or was broken) the head is the
// only waiter that tries at once; the others follow one turn after another
// (see Turn), so a waiter that died does not block the rest.

const (
	// QueueAnnotation holds the queue of waiters: a JSON array of Waiter,
	// head first.
	QueueAnnotation = "locks.frontdesk.dev/queue"
	// TicketAnnotation names the ticket of the waiter a release handed the
	// lock to. Only the waiter holding that ticket may take the grant up,
	// so two processes sharing an identity cannot both believe they hold it.
	TicketAnnotation = "locks.frontdesk.dev/granted-ticket"
	// HandedOffByAnnotation names the holder whose release handed the lock
	// to the current one (so status can say HandedOff, not TakenOver).
	HandedOffByAnnotation = "locks.frontdesk.dev/handed-off-by"
	// GrantNonceAnnotation names the attempt that wrote a client's own
	// grant (a random value per compare-and-swap). A client whose grant's
	// answer never came releases the grant only if it carries its nonce:
	// holder and token alone do not tell its grant from one that another
	// process sharing its identity wrote with the same next token.
	GrantNonceAnnotation = "locks.frontdesk.dev/grant-nonce"
	// FrontLabelPrefix starts the key of a label that every write of the
	// queue sets for each of its first FrontLength waiters: the prefix and
	// the waiter's ticket (none for a ticket that cannot be a label name).
	// A waiter further back watches the Lease with a selector on its own
	// key (FrontSelector) and hears of nothing until it moves up to the
	// front, instead of decoding every renewal and registration. The
	// labels only wake waiters: nobody judges a grant by them.
	FrontLabelPrefix = "front.locks.frontdesk.dev/"
	// FrontLength is how many waiters at the front of the queue watch every
	// change of the Lease: the head, which takes the lock up, and the one
	// behind it, whose turn comes next if the head is dead.
	FrontLength = 2
	// MaxQueue bounds the queue, to keep the Lease small: a waiter that
	// finds it full waits unregistered, behind everyone registered.
	MaxQueue = 1000
)

// ErrQueueFull: the queue already has MaxQueue waiters.
var ErrQueueFull = errors.New("the lock's queue of waiters is full")

// Waiter is one entry of the queue.
type Waiter struct {
	// Identity is the holder identity the waiter acquires as.
	Identity string `json:"id"`
	// Ticket is unique per registration; the grant handed to a waiter names
	// it.
	Ticket string `json:"t"`
	// Priority orders the queue: higher first, arrival order within one
	// priority.
	Priority int32 `json:"p,omitempty"`
}

// Queue is the Lease's queue of waiters, head first. A missing or
// malformed annotation is an empty queue: the lock then works as if nobody
// were queued (every waiter may try once it is free), never worse.
func Queue(l *coordinationv1.Lease) []Waiter {
	raw, ok := l.Annotations[QueueAnnotation]
	if !ok || raw == "" {
		return nil
	}
	q, ok := decodeQueue(raw)
	if !ok {
		return nil
	}
	return slices.DeleteFunc(q, func(w Waiter) bool { return w.Ticket == "" })
}

// Position is the index of the waiter with ticket in the queue, or -1.
func Position(l *coordinationv1.Lease, ticket string) int {
	position, _ := Place(l, ticket)
	return position
}

// Place is the index of the waiter with ticket in the queue (-1 if it is
// not queued) and the length of the queue, from one reading of it.
func Place(l *coordinationv1.Lease, ticket string) (position, length int) {
	q := Queue(l)
	return slices.IndexFunc(q, func(w Waiter) bool { return w.Ticket == ticket }), len(q)
}

// Enqueue is current with w added to the queue: after every waiter of the
// same or a higher priority, before the lower ones. A ticket already queued
// is not added twice.
func Enqueue(current *coordinationv1.Lease, w Waiter) (*coordinationv1.Lease, error) {
	q := Queue(current)
	if slices.ContainsFunc(q, func(o Waiter) bool { return o.Ticket == w.Ticket }) {
		return current.DeepCopy(), nil
	}
	if len(q) >= MaxQueue {
		return nil, ErrQueueFull
	}
	at := slices.IndexFunc(q, func(o Waiter) bool { return o.Priority < w.Priority })
	if at < 0 {
		at = len(q)
	}
	return withQueue(current, slices.Insert(q, at, w))
}

// Dequeue is current with the given tickets removed from the queue.
func Dequeue(current *coordinationv1.Lease, tickets ...string) (*coordinationv1.Lease, error) {
	q := slices.DeleteFunc(Queue(current), func(w Waiter) bool { return slices.Contains(tickets, w.Ticket) })
	return withQueue(current, q)
}

// DequeueThrough is current with the waiter holding ticket removed, and
// every waiter ahead of it (they had their turn and let it pass).
func DequeueThrough(current *coordinationv1.Lease, ticket string) (*coordinationv1.Lease, error) {
	q := Queue(current)
	at := slices.IndexFunc(q, func(w Waiter) bool { return w.Ticket == ticket })
	if at < 0 {
		return current.DeepCopy(), nil
	}
	return withQueue(current, q[at+1:])
}

// HandOff is current, held by releaser, given to the head of the queue in
// one write: the holder becomes the head's identity, with the next fencing
// token and fresh times, and the head leaves the queue; the grant names the
// head's ticket. The head must not trust a safe window it did not start:
// see the client library's claim of a hand-off. ok is false when nobody is
// queued.
func HandOff(current *coordinationv1.Lease, releaser string, duration time.Duration, now time.Time) (l *coordinationv1.Lease, head Waiter, ok bool, err error) {
	q := Queue(current)
	if len(q) == 0 {
		return nil, Waiter{}, false, nil
	}
	head = q[0]
	if l, err = Grant(current, head.Identity, duration, now); err != nil {
		return nil, Waiter{}, false, err
	}
	if l, err = withQueue(l, q[1:]); err != nil {
		return nil, Waiter{}, false, err
	}
	l.Annotations[TicketAnnotation] = head.Ticket
	l.Annotations[HandedOffByAnnotation] = releaser
	return l, head, true, nil
}

// Turn is how long a lock must have been free (as the waiter observed it)
// before the waiter at the given queue position may try for it: the head
// at once, each one behind it one turn later, so that a live head is not
// overtaken and a dead one delays the others by a turn only. A waiter not in
// the queue counts as the position after the last.
func Turn(position int, leaseDuration time.Duration) time.Duration {
	return time.Duration(position) * TurnLength(leaseDuration)
}

// TurnLength is how long each waiter ahead in the queue gets to take a free
// lock before the next may: a tenth of the lease, at least 500ms.
func TurnLength(leaseDuration time.Duration) time.Duration {
	return max(leaseDuration/10, 500*time.Millisecond)
}

// FrontSelector is the label selector that matches the Lease while the
// waiter with ticket is among the first FrontLength of its queue.
func FrontSelector(ticket string) string {
	return FrontLabelPrefix + ticket
}

// IsFrontLabel reports whether a label key is one of the queue's front
// labels.
func IsFrontLabel(key string) bool {
	return strings.HasPrefix(key, FrontLabelPrefix)
}

// withQueue is current with its queue annotation set to q (removed when q
// is empty), and the front labels naming q's first waiters.
func withQueue(current *coordinationv1.Lease, q []Waiter) (*coordinationv1.Lease, error) {
	l := current.DeepCopy()
	labelFront(l, q)
	if len(q) == 0 {
		delete(l.Annotations, QueueAnnotation)
		return l, nil
	}
	raw, err := json.Marshal(q)
	if err != nil {
		return nil, fmt.Errorf("encoding the queue of waiters: %w", err)
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[QueueAnnotation] = string(raw)
	return l, nil
}

// DropFrontLabels removes the queue's front labels from l (and leaves l
// with nil labels if none remain).
func DropFrontLabels(l *coordinationv1.Lease) {
	for key := range l.Labels {
		if IsFrontLabel(key) {
			delete(l.Labels, key)
		}
	}
	if len(l.Labels) == 0 {
		l.Labels = nil
	}
}

// labelFront sets on l the front labels of q's first FrontLength waiters,
// and removes any other.
func labelFront(l *coordinationv1.Lease, q []Waiter) {
	DropFrontLabels(l)
	for _, w := range q[:min(len(q), FrontLength)] {
		key := FrontLabelPrefix + w.Ticket
		if len(validation.IsQualifiedName(key)) > 0 {
			continue
		}
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[key] = "true"
	}
}

// relabelFront is l with its front labels derived again from its queue: a
// client that does not set them (an older version) may have written the
// queue last.
func relabelFront(l *coordinationv1.Lease) *coordinationv1.Lease {
	labelFront(l, Queue(l))
	return l
}
