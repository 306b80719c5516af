package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// The attacks below are made by a participant (a ServiceAccount bound to
// frontdesk-lock-user) under the shipped lease policies. Each test states
// the promise it checks; where the promise breaks, the test goes on to
// show what the attacker gains, reporting every broken step.

// queuedTicket waits until identity has a place in the lock's queue and
// returns its ticket.
func queuedTicket(t *testing.T, ns, name, identity string) string {
	t.Helper()
	var ticket string
	eventually(t, 10*time.Second, func(g Gomega) {
		ticket = ""
		for _, w := range lease.Queue(getLease(g, ns, name)) {
			if w.Identity == identity {
				ticket = w.Ticket
			}
		}
		g.Expect(ticket).NotTo(BeEmpty(), "%s is not queued", identity)
	})
	return ticket
}

// clearHolder is a plain release of whatever grant the Lease records.
func clearHolder(l *coordinationv1.Lease) {
	l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil, nil
}

// Promise: a participant cannot change another's place in the queue. The
// place rule accepts a changed queued-by annotation when its new value is
// the requester's own principal, so mallory can make bob's place hers:
// then remove it, or have the holder's hand-off to it bound to her, and
// end bob's grant at will.
func TestParticipantCannotRewriteThePrincipalOfAnothersPlace(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	bob := newParticipant(t, ns, "bob", "")
	carol := newParticipant(t, ns, "carol", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	bobDone := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	bobTicket := queuedTicket(t, ns, "billing", "bob-1")
	carolCtx, carolCancel := context.WithCancel(ctx)
	defer carolCancel()
	acquireInBackground(carolCtx, carol.lockClient(t, ns, "billing", "carol-1"))
	carolTicket := queuedTicket(t, ns, "billing", "carol-1")

	// 1. Carol's place: made mallory's, then removed by her.
	if err := mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.QueuedByKey(carolTicket)] = mallory.principal
	}); err == nil {
		t.Errorf("BROKEN: mallory rewrote the principal of carol's place to her own")
		if err := mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
			delete(l.Annotations, lease.EntryKey(carolTicket))
			delete(l.Annotations, lease.QueuedByKey(carolTicket))
		}); err == nil {
			t.Errorf("BROKEN: mallory then removed carol's place")
		}
	}

	// 2. Bob's place: made mallory's; alice's release hands the lock to it.
	if err := mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.QueuedByKey(bobTicket)] = mallory.principal
	}); err == nil {
		t.Errorf("BROKEN: mallory rewrote the principal of bob's place to her own")
	}
	g.Expect(ga.Release(ctx)).To(Succeed())
	r := <-bobDone
	g.Expect(r.err).NotTo(HaveOccurred())
	if p := getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]; p != bob.principal {
		t.Errorf("BROKEN: bob was handed a grant bound to %q, not to bob (%q)", p, bob.principal)
	}
	// 3. Mallory ends bob's live grant, in her own name.
	if err := mallory.forge(ns, "billing", clearHolder); err == nil {
		t.Errorf("BROKEN: mallory released bob's live grant (fencing token %d)", r.grant.Token())
	}
	select {
	case <-r.grant.Lost():
		t.Errorf("BROKEN: bob's grant was lost: %v", r.grant.Err())
	case <-time.After(3 * time.Second):
	}
}

// Promise: a grant names a waiter's ticket only when its holder hands the
// lock to that waiter. The holder can instead write a grant of its own
// that names the head's identity and ticket (the place stays, so the
// policy does not take it for a hand-off and binds it to the holder's
// principal); the head's client takes it up at once as a hand-off, and
// the holder, whose grant it is, ends it whenever it likes.
func TestHolderCannotForgeAHandOff(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := newParticipant(t, ns, "mallory", "")
	bob := newParticipant(t, ns, "bob", "")
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gm, err := mallory.lockClient(t, ns, "billing", "mallory-1").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	bobDone := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	bobTicket := queuedTicket(t, ns, "billing", "bob-1")

	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = new("bob-1"), new(*l.Spec.LeaseTransitions+1)
		l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
		l.Annotations[locksv1alpha1.TicketAnnotation] = bobTicket
		l.Annotations[locksv1alpha1.HandedOffByAnnotation] = "mallory-1"
	})
	if err != nil {
		refused(g, err, "") // the promise holds: nothing more to show
		return
	}
	t.Errorf("BROKEN: mallory wrote a grant naming bob's identity and ticket that is not a hand-off")
	_ = gm.Release(ctx) // her own grant is gone anyway; stop its heartbeat
	select {
	case r := <-bobDone:
		if r.err == nil {
			p := getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]
			t.Errorf("BROKEN: bob's Acquire handed out fencing token %d, a grant bound to %q (bob is %q)", r.grant.Token(), p, bob.principal)
			if err := mallory.forge(ns, "billing", clearHolder); err == nil {
				t.Errorf("BROKEN: mallory ended the grant bob holds (its Context was live: %v)", r.grant.Context().Err() == nil)
			}
		} else {
			t.Errorf("bob's Acquire failed: %v", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("bob's Acquire neither took the forged grant up nor gave up")
	}
}

// Promise: a participant cannot make the lock unusable for another. A
// place in the queue under alice's identity, registered by mallory, makes
// every Acquire and TryAcquire of alice fail with ErrIdentityInUse, even
// on a free lock, for as long as mallory keeps the place.
func TestForgedPlaceDoesNotLockAnIdentityOut(t *testing.T) {
	ns := guardedLock(t, "billing", 2)
	alice := newParticipant(t, ns, "alice", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	g.Expect(mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.EntryKey("squat")] = "0,1,alice-1"
		l.Annotations[lease.QueuedByKey("squat")] = mallory.principal
	})).To(Succeed(), "mallory registers a place, in her own name, under alice's identity")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").Acquire(ctx)
	if errors.Is(err, lock.ErrIdentityInUse) {
		t.Fatalf("BROKEN: alice cannot even wait for a free lock under her own identity (after %s): %v",
			time.Since(start).Round(time.Millisecond), err)
	}
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ga.Release(context.Background())).To(Succeed())
}

// Promise: a participant cannot make the lock unusable. The policy leaves
// annotations outside frontdesk's keys to anyone; mallory fills the
// Lease's annotations to the apiserver's 256 KiB limit while the lock is
// free, and every grant (which adds its nonce and principal) is then
// refused as invalid.
func TestJunkAnnotationsDoNotMakeTheLockUnusable(t *testing.T) {
	ns := guardedLock(t, "billing", 2)
	alice := newParticipant(t, ns, "alice", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	const limit = 256 * 1024
	const key = "example.com/filler"
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		used := 0
		for k, v := range l.Annotations {
			used += len(k) + len(v)
		}
		l.Annotations[key] = strings.Repeat("x", limit-used-len(key))
	}), "a participant writes only a grant and its marks")

	var lastErr error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
		if err == nil {
			g.Expect(ga.Release(context.Background())).To(Succeed())
			return
		}
		lastErr = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("BROKEN: alice could not take the free lock for 10 s after mallory's filler: %v", lastErr)
}

// Promise: a participant cannot make the lock unusable. Places are capped
// per principal (16), per user (64) and per queue (256), a new place goes
// behind the queue, and a priority above the default needs the verb
// "prioritize": mallory fills what she may with dead places. An honest
// release hands the lock to her first dead place (a lease duration lost),
// and the waiters behind then wait a turn for each of her places that the
// controller has not removed yet: bob, waiting on a 1 s lock, still gets it.
func TestQueueFloodDoesNotStarveOthers(t *testing.T) {
	ns := guardedLock(t, "billing", 1)
	alice := newParticipant(t, ns, "alice", "")
	bob := newParticipant(t, ns, "bob", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	flood := func(n int, priority string) func(l *coordinationv1.Lease) {
		return func(l *coordinationv1.Lease) {
			for i := range n {
				l.Annotations[lease.EntryKey(fmt.Sprintf("flood%04d", i))] = fmt.Sprintf("%s,1,dead-%d", priority, i)
				l.Annotations[lease.QueuedByKey(fmt.Sprintf("flood%04d", i))] = mallory.principal
			}
		}
	}
	refused(g, mallory.forge(ns, "billing", flood(lease.MaxPlaces, "0")), "at most 16 of one principal")
	refused(g, mallory.forge(ns, "billing", flood(16, "2147483647")), `needs the verb "prioritize"`)
	// As many dead places as one principal may hold.
	g.Expect(mallory.forge(ns, "billing", flood(16, "0"))).To(Succeed(), "mallory queues 16 dead places")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bobDone := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	time.Sleep(200 * time.Millisecond) // bob is waiting (unregistered: the queue is full)
	g.Expect(ga.Release(context.Background())).To(Succeed())
	start := time.Now()
	r := <-bobDone
	if r.err != nil {
		t.Fatalf("BROKEN: bob, waiting on a free lock with a 1 s lease, did not get it in %s: %v",
			time.Since(start).Round(time.Second), r.err)
	}
	t.Logf("bob got the lock %s after alice's release", r.at.Sub(start).Round(time.Millisecond))
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}

// Promise: a participant cannot end another principal's live grant. The
// policy leaves labels outside frontdesk's to anyone, and front labels to
// anyone: mallory removes the front label of the waiter at the head and
// fills the Lease with labels to just under etcd's request limit. The
// holder's next renewal adds the head's front label back (labelFront),
// does not fit ("etcdserver: request is too large"), and fails until the
// holder's grant is lost.
func TestBloatedLeaseDoesNotEndAnothersGrant(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	bob := newParticipant(t, ns, "bob", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	bobTicket := queuedTicket(t, ns, "billing", "bob-1")

	// fill writes b bytes of filler label values (63 to a label) and
	// removes bob's front label.
	fill := func(b int) (err error) {
		for err = errConflictOnce; apierrors.IsConflict(err); {
			err = mallory.forge(ns, "billing", fillEdit(b, bobTicket))
		}
		return err
	}
	refused(g, fill(64<<10), "a participant writes only a grant and its marks")
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) { l.Labels["example.com/probe"] = "x" }),
		"a participant writes only a grant and its marks")
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Labels[locksv1alpha1.FrontLabelPrefix+"no-such-ticket"] = "true"
	}), "is set only for a ticket in the queue")
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		delete(l.Labels, locksv1alpha1.FrontLabelPrefix+bobTicket)
	}), "goes when its place goes")

	select {
	case <-ga.Lost():
		t.Errorf("BROKEN: alice lost her live grant to mallory's filler: %v", ga.Err())
	case <-time.After(10 * time.Second):
	}
}

// errConflictOnce starts a retry loop on conflicts.
var errConflictOnce = apierrors.NewConflict(coordinationv1.Resource("leases"), "", errors.New("not tried yet"))

// fillEdit replaces the filler labels of a Lease with b bytes of label
// values (63 to a label) and removes the front label of ticket.
func fillEdit(b int, ticket string) func(l *coordinationv1.Lease) {
	return func(l *coordinationv1.Lease) {
		for k := range l.Labels {
			if strings.HasPrefix(k, "example.com/") {
				delete(l.Labels, k)
			}
		}
		delete(l.Labels, locksv1alpha1.FrontLabelPrefix+ticket)
		for i := range b / 63 {
			l.Labels[fmt.Sprintf("example.com/f%05d", i)] = strings.Repeat("x", 63)
		}
		l.Labels["example.com/pad"] = strings.Repeat("x", b%63)
	}
}

// Promise: places with tickets pod-<uid> are the manager's, for the pods it
// admits to a lock (controllers/admission.go trusts them as such). A
// participant that writes one, to have a gated pod jump the queue or to
// have the lock handed to a pod that never asked for it, is refused; an
// honest registration beside it lands.
func TestParticipantCannotRegisterAPodsPlace(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	const uid = "0f3c9a6e-5b1d-4c1e-9d55-6f0e2b7a9c11"
	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.EntryKey(locksv1alpha1.PodTicketPrefix+uid)] = "0,1,billing-job_" + uid
		l.Annotations[lease.QueuedByKey(locksv1alpha1.PodTicketPrefix+uid)] = mallory.principal
	})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "mallory registered a pod's place: %v", err)
	g.Expect(err).To(MatchError(ContainSubstring("pod-<uid>")))
	g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(BeEmpty())

	done := acquireInBackground(ctx, mallory.lockClient(t, ns, "billing", "mallory-1"))
	queuedTicket(t, ns, "billing", "mallory-1")
	g.Expect(ga.Release(ctx)).To(Succeed())
	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred(), "mallory's honest registration")
	g.Expect(r.grant.Token()).To(Equal(ga.Token() + 1))
	g.Expect(r.grant.Release(ctx)).To(Succeed())
}

// Promise: the hand-off marks (granted-ticket, handed-off-by) come only with
// a hand-off. A holder that adds them to its own grant later, in a plain
// renewal, naming a gated pod's place (pod-<uid>) and holding under that
// pod's identity, would have the controller take the grant for the pod's
// and ungate the pod with the holder's token: refused. Its honest renewal
// beside it lands.
func TestHolderCannotMarkItsGrantAHandOffLater(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	const uid = "0f3c9a6e-5b1d-4c1e-9d55-6f0e2b7a9c11"
	gm, err := mallory.lockClient(t, ns, "billing", "billing-job_"+uid).TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[locksv1alpha1.TicketAnnotation] = locksv1alpha1.PodTicketPrefix + uid
		l.Annotations[locksv1alpha1.HandedOffByAnnotation] = "someone"
	})
	refused(g, err, "nothing else of the grant changes")
	stillHolds(g, ns, "billing", gm, time.Now())
	g.Expect(gm.Release(context.Background())).To(Succeed())
}
