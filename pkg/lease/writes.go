package lease

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// The patches below are the writes of a grant: grant, renew, release, hand
// off and break, which clients send (the queue's own writes are in
// queue.go), and lapse and the removal of passed-over places, which the
// controller sends. (The controller also builds the grant, release and
// hand-off of a lock-admitted pod from them, applied to its copy and written
// with an Update.) Each is built from the copy of the Lease its writer
// judged and tests, first, exactly what that judgement rests on (the token
// and the holder, and what else each one names), so it lands only if those
// still hold when the apiserver applies it; the rest of the Lease (the
// queue, above all) may have changed meanwhile. Two grants judged on the
// same token cannot both land: the first moves the token, and the second's
// test fails. None of them does I/O.

var (
	pathHolder      = "/spec/holderIdentity"
	pathTransitions = "/spec/leaseTransitions"
	pathDuration    = "/spec/leaseDurationSeconds"
	pathAcquire     = "/spec/acquireTime"
	pathRenew       = "/spec/renewTime"
	pathDeletion    = "/metadata/deletionTimestamp"
)

// GrantDuration is the lease duration a grant on l must carry: the
// manager's LeaseDurationAnnotation (read as the lease-guard policy reads
// it, ParseDurationSeconds), else the Lease's own leaseDurationSeconds,
// else fallback.
func GrantDuration(l *coordinationv1.Lease, fallback time.Duration) time.Duration {
	if s, ok := ParseDurationSeconds(l.Annotations[locksv1alpha1.LeaseDurationAnnotation]); ok {
		return time.Duration(s) * time.Second
	}
	return RecordOf(l).Duration(fallback)
}

// Lapsed reports whether l is free because the controller ended its last
// grant as lapsed (LapsedAnnotation names its token).
func Lapsed(l *coordinationv1.Lease) bool {
	return Holder(l) == "" && l.Annotations[locksv1alpha1.LapsedAnnotation] == strconv.FormatInt(int64(ptr.Deref(l.Spec.LeaseTransitions, 0)), 10)
}

// testGrant makes p apply only to the grant current records: its token, and
// its holder (none, when it is free).
func testGrant(p *Patch, current *coordinationv1.Lease) {
	p.Test(pathTransitions, current.Spec.LeaseTransitions)
	if h := Holder(current); h != "" {
		p.Test(pathHolder, h)
	} else {
		p.Test(pathHolder, current.Spec.HolderIdentity)
	}
}

// setGrant sets a new grant of current to identity in p: the next token,
// fresh times, the duration every grant carries, and none of the previous
// grant's marks.
func setGrant(p *Patch, current *coordinationv1.Lease, identity string, duration time.Duration, now time.Time) error {
	next, err := nextToken(current)
	if err != nil {
		return err
	}
	t := metav1.NewMicroTime(now)
	p.Set(pathHolder, identity)
	p.Set(pathTransitions, next)
	p.Set(pathDuration, durationSeconds(GrantDuration(current, duration)))
	p.Set(pathAcquire, t)
	p.Set(pathRenew, t)
	for _, key := range locksv1alpha1.GrantAnnotations {
		p.RemoveAnnotationIf(current.Annotations, key)
	}
	return nil
}

// GrantPatch takes the lock for identity on current, a free Lease (a grant
// ends by release, break, or the controller ending it as lapsed: nobody
// takes a held lock over). It tests that the Lease still records that (same
// token, no holder), that it is still controlled by the same lock and not
// being deleted, and sets the next token and the grant's principal (the
// writer's own: the lease-guard policy refuses any other). ticket, when not
// "", is the caller's place in the queue, which leaves it in the same
// write; nonce names the attempt (GrantNonceAnnotation). duration is used
// only when the Lease names none.
func GrantPatch(current *coordinationv1.Lease, identity, principal, ticket, nonce string, duration time.Duration, now time.Time) (*Patch, error) {
	if h := Holder(current); h != "" {
		return nil, fmt.Errorf("lease %s is held by %s: a grant is made only on a free Lease", current.Name, h)
	}
	p := &Patch{}
	testGrant(p, current)
	p.Test(pathDeletion, nil)
	p.Test(AnnotationPath(locksv1alpha1.LockUIDAnnotation), current.Annotations[locksv1alpha1.LockUIDAnnotation])
	if err := setGrant(p, current, identity, duration, now); err != nil {
		return nil, err
	}
	p.Set(AnnotationPath(locksv1alpha1.GrantNonceAnnotation), nonce)
	p.Set(AnnotationPath(locksv1alpha1.HolderPrincipalAnnotation), principal)
	if ticket != "" {
		removePlace(p, current, ticket)
	}
	labelFront(p, current, ticket)
	return p, nil
}

// RenewPatch moves the renew time of current's grant to now, if the Lease
// still records that grant (holder and token). It changes nothing else: a
// renewal never makes the Lease bigger.
func RenewPatch(current *coordinationv1.Lease, now time.Time) *Patch {
	p := &Patch{}
	testGrant(p, current)
	p.Set(pathRenew, metav1.NewMicroTime(now))
	return p
}

// ReleasePatch ends current's grant, if the Lease still records it: no
// holder, no times, the token unchanged (the next grant gets the next one).
func ReleasePatch(current *coordinationv1.Lease) *Patch {
	p := &Patch{}
	testGrant(p, current)
	clearGrant(p, current)
	return p
}

// clearGrant removes current's grant in p: holder, times and marks.
func clearGrant(p *Patch, current *coordinationv1.Lease) {
	if current.Spec.HolderIdentity != nil {
		p.Remove(pathHolder)
	}
	if current.Spec.AcquireTime != nil {
		p.Remove(pathAcquire)
	}
	if current.Spec.RenewTime != nil {
		p.Remove(pathRenew)
	}
	for _, key := range locksv1alpha1.GrantAnnotations {
		p.RemoveAnnotationIf(current.Annotations, key)
	}
}

// HandOffPatch ends current's grant, held by releaser, and grants the lock
// to the head of the queue in the same write: the holder becomes the head's
// identity, with the next token and fresh times, the grant names the head's
// ticket and is bound to the principal that took the head's place, and the
// head leaves the queue. It tests the grant (holder, token) and that the
// head's place is still there as current shows it (its value as stored,
// never re-rendered). The lease-guard policy refuses a hand-off to any
// place but the head of the queue as stored when it lands
// (StaleQueueRefusal). The head must not trust a safe window it did not
// start: see the client library's claim of a hand-off. ok is false when
// nobody is queued.
func HandOffPatch(current *coordinationv1.Lease, releaser string, duration time.Duration, now time.Time) (p *Patch, head Waiter, ok bool, err error) {
	q := Queue(current)
	if len(q) == 0 {
		return nil, Waiter{}, false, nil
	}
	head = q[0]
	p = &Patch{}
	testGrant(p, current)
	p.Test(AnnotationPath(EntryKey(head.Ticket)), current.Annotations[EntryKey(head.Ticket)])
	if err := setGrant(p, current, head.Identity, duration, now); err != nil {
		return nil, Waiter{}, false, err
	}
	if head.Principal != "" {
		p.Set(AnnotationPath(locksv1alpha1.HolderPrincipalAnnotation), head.Principal)
	}
	p.Set(AnnotationPath(locksv1alpha1.TicketAnnotation), head.Ticket)
	p.Set(AnnotationPath(locksv1alpha1.HandedOffByAnnotation), releaser)
	removePlace(p, current, head.Ticket)
	labelFront(p, current, head.Ticket)
	return p, head, true, nil
}

// BreakPatch ends current's grant whoever holds it and raises the token by
// one in the same write, so the previous holder is fenced by every later
// grant; it tests the token and holder it was judged on.
func BreakPatch(current *coordinationv1.Lease) (*Patch, error) {
	next, err := nextToken(current)
	if err != nil {
		return nil, err
	}
	p := &Patch{}
	testGrant(p, current)
	clearGrant(p, current)
	p.Set(pathTransitions, next)
	if current.Annotations != nil {
		p.Set(AnnotationPath(locksv1alpha1.BrokenAtAnnotation), strconv.FormatInt(Token(current)+1, 10))
	}
	return p, nil
}

// LapsePatch ends current's grant as lapsed, if the Lease still holds
// exactly the record of current that the controller saw go unrenewed
// (holder, token and renew time): the grant is cleared as by a release, the
// token kept, and LapsedAnnotation names the token whose grant lapsed.
func LapsePatch(current *coordinationv1.Lease) *Patch {
	p := &Patch{}
	lapse(p, current)
	return p
}

// ProvenDeadPatch is LapsePatch for a grant the controller ends because the
// pod its principal names is proven dead: it also tests that principal
// (HolderPrincipalAnnotation), the one the proof is of.
func ProvenDeadPatch(current *coordinationv1.Lease) *Patch {
	p := &Patch{}
	p.Test(AnnotationPath(locksv1alpha1.HolderPrincipalAnnotation), current.Annotations[locksv1alpha1.HolderPrincipalAnnotation])
	lapse(p, current)
	return p
}

// lapse adds to p the tests and writes of LapsePatch.
func lapse(p *Patch, current *coordinationv1.Lease) {
	testGrant(p, current)
	p.Test(pathRenew, current.Spec.RenewTime)
	clearGrant(p, current)
	p.Set(AnnotationPath(locksv1alpha1.LapsedAnnotation), strconv.FormatInt(int64(ptr.Deref(current.Spec.LeaseTransitions, 0)), 10))
}

// RemovePlacesPatch removes the places with the given tickets (those the
// copy current shows), each only if it is still the place current shows
// (its value tested: a place re-registered under the same ticket meanwhile
// is another), and labels the front of what remains. The controller
// removes places passed over this way; nil when none of them is in current.
func RemovePlacesPatch(current *coordinationv1.Lease, tickets []string) *Patch {
	p := &Patch{}
	var removed []string
	for _, t := range tickets {
		value, ok := current.Annotations[EntryKey(t)]
		if !ok {
			continue
		}
		p.Test(AnnotationPath(EntryKey(t)), value)
		removePlace(p, current, t)
		removed = append(removed, t)
	}
	if len(removed) == 0 {
		return nil
	}
	rest := slices.DeleteFunc(Queue(current), func(w Waiter) bool { return slices.Contains(removed, w.Ticket) })
	if current.Labels != nil {
		for _, t := range frontTickets(rest) {
			if _, ok := current.Labels[locksv1alpha1.FrontLabelPrefix+t]; !ok {
				p.Test(AnnotationPath(EntryKey(t)), current.Annotations[EntryKey(t)])
				p.Set(LabelPath(locksv1alpha1.FrontLabelPrefix+t), "true")
			}
		}
	}
	return p
}

// removePlace removes the place with ticket, as the copy current shows it.
func removePlace(p *Patch, current *coordinationv1.Lease, ticket string) {
	p.RemoveAnnotationIf(current.Annotations, EntryKey(ticket))
	p.RemoveAnnotationIf(current.Annotations, QueuedByKey(ticket))
	if _, ok := current.Labels[locksv1alpha1.FrontLabelPrefix+ticket]; ok {
		p.Remove(LabelPath(locksv1alpha1.FrontLabelPrefix + ticket))
	}
}

// labelFront adds, in p, the front labels that current's queue (without
// the place with leaving, when not "") calls for and current lacks, each
// with a test that its place is still there as current shows it: the
// lease-guard policy refuses a front label of a ticket that is not queued,
// so a label of a place withdrawn meanwhile must fail the patch (a lost
// race: the writer reads again) rather than have the guard refuse the
// whole write. It removes none: a label left on a waiter that was pushed
// back only makes it hear more, and its owner removes it when it leaves or
// takes the lock.
func labelFront(p *Patch, current *coordinationv1.Lease, leaving string) {
	if current.Labels == nil {
		return // a lock's Lease always carries the lock label; this one has none to add to
	}
	q := slices.DeleteFunc(Queue(current), func(w Waiter) bool { return w.Ticket == leaving })
	for _, t := range frontTickets(q) {
		if _, ok := current.Labels[locksv1alpha1.FrontLabelPrefix+t]; !ok {
			p.Test(AnnotationPath(EntryKey(t)), current.Annotations[EntryKey(t)])
			p.Set(LabelPath(locksv1alpha1.FrontLabelPrefix+t), "true")
		}
	}
}
