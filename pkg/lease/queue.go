package lease

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
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
	// MaxQueue bounds the queue, to keep the Lease small: a waiter that
	// finds it full waits unregistered, behind everyone registered.
	MaxQueue = 1000
)

// ErrQueueFull means the queue already has MaxQueue waiters.
var ErrQueueFull = errors.New("the lock's queue of waiters is full")

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
	// Principal is who registered the place, as the apiserver's admission
	// policy recorded it ("" on a cluster without the policy).
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

// parseEntry reads the place with ticket from its annotation value.
func parseEntry(ticket, value string) (Waiter, bool) {
	parts := strings.SplitN(value, ",", 3)
	if len(parts) != 3 || ticket == "" {
		return Waiter{}, false
	}
	priority, err1 := strconv.ParseInt(parts[0], 10, 32)
	seq, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return Waiter{}, false
	}
	return Waiter{Identity: parts[2], Ticket: ticket, Priority: int32(priority), Seq: seq}, true
}

// Queue is the Lease's queue of waiters, head first: higher priority
// first, then lower Seq, then ticket. A place whose annotation does not
// parse is left out: the lock then works as if it were not queued, never
// worse.
func Queue(l *coordinationv1.Lease) []Waiter {
	var q []Waiter
	for key, value := range l.Annotations {
		ticket, ok := strings.CutPrefix(key, locksv1alpha1.QueueEntryPrefix)
		if !ok {
			continue
		}
		if w, ok := parseEntry(ticket, value); ok {
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
// current, and its front label when it would be among the first
// FrontLength there. It never conflicts with another write: the apiserver
// merges it into whatever the Lease holds when it lands. The ticket must be
// a valid label name (NewTicket makes such tickets). It also returns w with
// its Seq.
func Registration(current *coordinationv1.Lease, w Waiter) ([]byte, Waiter, error) {
	w, front, err := placeIn(current, w)
	if err != nil {
		return nil, w, err
	}
	labels := map[string]any{}
	if front {
		labels[locksv1alpha1.FrontLabelPrefix+w.Ticket] = "true"
	}
	patch, err := mergePatch(map[string]any{EntryKey(w.Ticket): entryValue(w)}, labels)
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
	if front && current.Labels != nil {
		p.Set(LabelPath(locksv1alpha1.FrontLabelPrefix+w.Ticket), "true")
	}
	return p, w, nil
}

// placeIn is w as it registers in current's queue (its Seq), and whether it
// lands among the first FrontLength.
func placeIn(current *coordinationv1.Lease, w Waiter) (Waiter, bool, error) {
	if errs := validation.IsQualifiedName(locksv1alpha1.FrontLabelPrefix + w.Ticket); len(errs) > 0 {
		return w, false, fmt.Errorf("ticket %q: %s", w.Ticket, strings.Join(errs, "; "))
	}
	q := Queue(current)
	if len(q) >= MaxQueue {
		return w, false, ErrQueueFull
	}
	for _, o := range q {
		w.Seq = max(w.Seq, o.Seq)
	}
	w.Seq++
	position := slices.IndexFunc(q, func(o Waiter) bool { return o.Priority < w.Priority })
	if position < 0 {
		position = len(q)
	}
	return w, position < FrontLength, nil
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
