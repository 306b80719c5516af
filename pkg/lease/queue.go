package lease

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// The waiters of a lock queue up on its Lease, one pair of annotations per
// place in the queue (its ticket), so that the queue changes atomically with
// the grants and so that the apiserver can tell whose each place is: a
// waiter registers by adding its own pair (first exactly, ExactRegistration;
// after a lost race as a merge patch, Registration, which conflicts with no
// other registration nor with the holder's writes), a graceful
// release hands the lock to the head of the queue in the same write that
// ends the holder's grant, and when the lock falls free otherwise (the
// holder lapsed, or was broken) the head is the only waiter that tries at
// once; the others follow one turn after another (see Turn), so a waiter
// that died does not block the rest. The keys (QueueEntryPrefix,
// QueuedByPrefix, the grant marks) are defined with the other protocol keys
// in api/v1alpha1.

const (
	// FrontLength is how many waiters at the front of the queue watch every
	// change of the Lease: the head, which takes the lock up, and the one
	// behind it, whose turn comes next if the head is dead.
	FrontLength = 2
)

// ErrQueueFull means the queue already has MaxPlaces waiters (or its
// highest seq is MaxSeq).
var ErrQueueFull = errors.New("the lock's queue of waiters is full")

// StaleQueueRefusal is part of the message with which the lease-guard
// policy refuses a registration whose seq is not one more than the
// highest in the queue (or equal to it), and a hand-off to a place that
// is no longer the head: the write was judged on a copy of the queue that
// changed since. A writer reads the Lease again and judges afresh, as
// after a lost compare-and-swap race.
const StaleQueueRefusal = "the queue changed since the copy this write was judged on"

// Waiter is one place in the queue.
type Waiter struct {
	// Identity is the holder identity the waiter acquires as.
	Identity string
	// Ticket is unique per registration; the grant handed to a waiter names
	// it.
	Ticket string
	// Priority orders the queue: higher first.
	Priority int32
	// Seq orders the queue within a priority: one more than the highest
	// the registering waiter saw, so a waiter that registered after another
	// one's registration was visible comes after it.
	Seq int64
	// Principal is who registered the place (QueuedByPrefix): the
	// registering client writes its own, and the lease-guard policy refuses
	// any other ("" on a place written without it).
	Principal string
}

// EntryKey is the annotation key of the place with ticket.
func EntryKey(ticket string) string { return locksv1alpha1.QueueEntryPrefix + ticket }

// QueuedByKey is the annotation key naming who registered ticket.
func QueuedByKey(ticket string) string { return locksv1alpha1.QueuedByPrefix + ticket }

// entryValue is the annotation value of w's place.
func entryValue(w Waiter) string {
	return fmt.Sprintf("%d,%d,%s", w.Priority, w.Seq, w.Identity)
}

// Queue is the Lease's queue of waiters, head first: higher priority
// first, then lower Seq, then ticket. A place outside the grammar (see
// ParsePlace; its queued-by a principal of the grammar) is left out, as the lease-guard policy leaves it out when it
// orders the queue: the lock then works as if it were not queued, and the
// controller removes it.
func Queue(l *coordinationv1.Lease) []Waiter {
	var q []Waiter
	for key, value := range l.Annotations {
		ticket, ok := strings.CutPrefix(key, locksv1alpha1.QueueEntryPrefix)
		if !ok {
			continue
		}
		if w, ok := ParsePlace(ticket, value); ok && ValidPrincipal(l.Annotations[QueuedByKey(ticket)]) {
			w.Principal = l.Annotations[QueuedByKey(ticket)]
			q = append(q, w)
		}
	}
	slices.SortFunc(q, func(a, b Waiter) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.Seq, b.Seq), strings.Compare(a.Ticket, b.Ticket))
	})
	return q
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

// Registration is the merge patch that puts w in the queue of current (the
// copy the waiter judged): its place, with Seq one more than the highest in
// current, the principal that takes it (w.Principal, which the lease-guard
// policy checks is the request's), and its front label when it would be
// among the first FrontLength there. It conflicts with no other write: the
// apiserver merges it into whatever the Lease holds when it lands, and the
// policy refuses it (StaleQueueRefusal) only when the queue's highest seq
// moved past what current showed. The ticket must be of the grammar
// (NewTicket makes such tickets). It also returns w with its Seq.
func Registration(current *coordinationv1.Lease, w Waiter) ([]byte, Waiter, error) {
	w, front, err := placeIn(current, w)
	if err != nil {
		return nil, w, err
	}
	labels := map[string]any{}
	if front {
		labels[locksv1alpha1.FrontLabelPrefix+w.Ticket] = "true"
	}
	patch, err := mergePatch(map[string]any{EntryKey(w.Ticket): entryValue(w), QueuedByKey(w.Ticket): w.Principal}, labels)
	return patch, w, err
}

// ExactRegistration is the registration of w in current's queue as a
// patch, to be written exactly (Patch.ApplyTo and an Update: it fails at
// once, instead of being merged, when anything wrote the Lease since
// current). A waiter tries this first, and falls back to Registration,
// spread out, once it fails (a crowd is registering).
func ExactRegistration(current *coordinationv1.Lease, w Waiter) (*Patch, Waiter, error) {
	w, front, err := placeIn(current, w)
	if err != nil {
		return nil, w, err
	}
	p := &Patch{}
	if current.Annotations == nil {
		p.Set("/metadata/annotations", map[string]string{})
	}
	p.Set(AnnotationPath(EntryKey(w.Ticket)), entryValue(w))
	p.Set(AnnotationPath(QueuedByKey(w.Ticket)), w.Principal)
	if front && current.Labels != nil {
		p.Set(LabelPath(locksv1alpha1.FrontLabelPrefix+w.Ticket), "true")
	}
	return p, w, nil
}

// placeIn is w as it registers in current's queue (its Seq: one more than
// the highest there), and whether it lands among the first FrontLength. It
// refuses a ticket, identity or principal outside the grammar and a full
// queue (MaxPlaces); the bounds per principal and per user are the
// lease-guard policy's to enforce (a waiter it refuses waits unregistered).
func placeIn(current *coordinationv1.Lease, w Waiter) (Waiter, bool, error) {
	if err := validWaiter(w); err != nil {
		return w, false, err
	}
	q := Queue(current)
	if len(q) >= MaxPlaces {
		return w, false, fmt.Errorf("%w: it holds %d places, the most it may", ErrQueueFull, len(q))
	}
	for _, o := range q {
		w.Seq = max(w.Seq, o.Seq)
	}
	if w.Seq >= MaxSeq {
		return w, false, fmt.Errorf("%w: its highest seq is %d, the grammar's last", ErrQueueFull, w.Seq)
	}
	w.Seq++
	position := slices.IndexFunc(q, func(o Waiter) bool { return o.Priority < w.Priority })
	if position < 0 {
		position = len(q)
	}
	return w, position < FrontLength, nil
}

// validWaiter checks w's ticket, identity and principal against the
// grammar.
func validWaiter(w Waiter) error {
	switch {
	case !ValidTicket(w.Ticket):
		return fmt.Errorf("ticket %q is not of the grammar %s", w.Ticket, TicketPattern)
	case !ValidIdentity(w.Identity):
		return fmt.Errorf("identity %q is not of the grammar %s (1 to %d printable ASCII characters, no leading or trailing space)",
			w.Identity, IdentityPattern, MaxIdentityLength)
	case !ValidPrincipal(w.Principal):
		return fmt.Errorf("principal %q cannot queue: a principal is of the grammar %s (a username of printable ASCII, no spaces, at most %d characters)",
			w.Principal, PrincipalPattern, MaxUsernameLength)
	}
	return nil
}

// Withdrawal is the merge patch that takes the place with ticket out of the
// queue (its annotations and its front label). Applying it when the place
// is already gone changes nothing.
func Withdrawal(ticket string) ([]byte, error) {
	return mergePatch(map[string]any{EntryKey(ticket): nil, QueuedByKey(ticket): nil},
		map[string]any{locksv1alpha1.FrontLabelPrefix + ticket: nil})
}

// mergePatch is a JSON merge patch of the Lease's annotations and labels
// (a nil value removes a key).
func mergePatch(annotations, labels map[string]any) ([]byte, error) {
	meta := map[string]any{"annotations": annotations}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, fmt.Errorf("encoding a queue patch: %w", err)
	}
	return patch, nil
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
	return locksv1alpha1.FrontLabelPrefix + ticket
}

// IsFrontLabel reports whether a label key is one of the queue's front
// labels.
func IsFrontLabel(key string) bool {
	return strings.HasPrefix(key, locksv1alpha1.FrontLabelPrefix)
}

// IsQueueKey reports whether an annotation key belongs to the queue (a
// place or who registered it).
func IsQueueKey(key string) bool {
	return strings.HasPrefix(key, locksv1alpha1.QueueEntryPrefix) || strings.HasPrefix(key, locksv1alpha1.QueuedByPrefix)
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

// frontTickets are the tickets of q's first FrontLength waiters that can
// be label names.
func frontTickets(q []Waiter) []string {
	var out []string
	for _, w := range q[:min(len(q), FrontLength)] {
		if len(validation.IsQualifiedName(locksv1alpha1.FrontLabelPrefix+w.Ticket)) == 0 {
			out = append(out, w.Ticket)
		}
	}
	return out
}

// relabelFront is l with its front labels derived again from its queue.
func relabelFront(l *coordinationv1.Lease) *coordinationv1.Lease {
	DropFrontLabels(l)
	for _, t := range frontTickets(Queue(l)) {
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[locksv1alpha1.FrontLabelPrefix+t] = "true"
	}
	return l
}

// SetQueue is l (a copy the caller owns) with its queue replaced by q, in
// that order (Seq numbered afresh, Principal kept), and its front labels
// set accordingly: for the controller's own full writes, tools and tests.
func SetQueue(l *coordinationv1.Lease, q []Waiter) *coordinationv1.Lease {
	for key := range l.Annotations {
		if IsQueueKey(key) {
			delete(l.Annotations, key)
		}
	}
	for i, w := range q {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		w.Seq = int64(i + 1)
		l.Annotations[EntryKey(w.Ticket)] = entryValue(w)
		if w.Principal != "" {
			l.Annotations[QueuedByKey(w.Ticket)] = w.Principal
		}
	}
	return relabelFront(l)
}

// Registered is current (not modified) with each of ws registered in its
// queue, in that order, behind everyone already there: what an Update of
// the result writes exactly (a compare-and-swap on the copy current). The
// controller registers the pods it queues this way, oldest first.
func Registered(current *coordinationv1.Lease, ws []Waiter) (*coordinationv1.Lease, error) {
	out := current
	for _, w := range ws {
		p, _, err := ExactRegistration(out, w)
		if err != nil {
			return nil, err
		}
		if out, err = p.ApplyTo(out); err != nil {
			return nil, err
		}
	}
	if out == current {
		out = current.DeepCopy()
	}
	return out, nil
}
