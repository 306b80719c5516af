package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The adversary's findings (TestAdversaryCannotMakeALockUnusable), each
// as the shortest sequence of writes that shows it, by a participant with
// a real pod-bound token, under the shipped policies, beside the honest
// path.

// mergeAnnotations sends a merge patch of annotations and labels (nil
// values remove) as p.
func (p adversaryPod) mergeAnnotations(ctx context.Context, name string, annotations, labels map[string]any) error {
	meta := map[string]any{"annotations": annotations}
	if labels != nil {
		meta["labels"] = labels
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	_, err = p.leases.Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}

// Promise: a front label is set only for a ticket in the queue and goes
// when its place goes. A participant registers a place with its front
// label, then removes the place with a write that leaves the labels
// alone: the front-label rule passes every write that changes no label
// (labelsSame), so the label stays, naming no place, and nobody removes it.
// Sixteen places a write, two writes a round: the Lease's labels grow
// without bound, towards etcd's request limit, where every write to the
// Lease (the holder's renewals first) fails.
func TestRemovedPlaceTakesItsFrontLabel(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newPodParticipant(t, ns, "alice", "alice-0")
	mallory := newAdversaryPods(t, ns, "mallory", 1)[0]
	g := NewWithT(t)
	ctx := context.Background()
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = ga.Release(ctx) }()

	// 1. One place and its label; the place removed, the label left.
	g.Expect(mallory.mergeAnnotations(ctx, "billing",
		map[string]any{lease.EntryKey("orphan"): "0,1,mallory-1", lease.QueuedByKey("orphan"): mallory.principal},
		map[string]any{locksv1alpha1.FrontLabelPrefix + "orphan": "true"})).To(Succeed(), "the honest path: a registration at the front")
	err = mallory.mergeAnnotations(ctx, "billing", map[string]any{lease.EntryKey("orphan"): nil, lease.QueuedByKey("orphan"): nil}, nil)
	if err != nil {
		refused(g, err, "goes when its place goes") // the promise holds
		return
	}
	t.Errorf("BROKEN: mallory removed her place and left its front label %s", locksv1alpha1.FrontLabelPrefix+"orphan")

	// 2. Sixteen at a time: how far the labels grow while alice holds
	//    (for 15 s, or FRONTDESK_BLOAT_SECONDS).
	const perRound = lease.MaxPlacesPerPrincipal
	bloatFor := 15 * time.Second
	if s := os.Getenv("FRONTDESK_BLOAT_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		g.Expect(err).NotTo(HaveOccurred())
		bloatFor = time.Duration(n) * time.Second
	}
	start := time.Now()
	labels := 1
	for round := 0; time.Since(start) < bloatFor; round++ {
		add, drop := map[string]any{}, map[string]any{}
		front := map[string]any{}
		for i := range perRound {
			ticket := fmt.Sprintf("%040d", round*perRound+i)
			add[lease.EntryKey(ticket)], add[lease.QueuedByKey(ticket)] = "0,1,mallory-1", mallory.principal
			drop[lease.EntryKey(ticket)], drop[lease.QueuedByKey(ticket)] = nil, nil
			front[locksv1alpha1.FrontLabelPrefix+ticket] = "true"
		}
		if err := mallory.mergeAnnotations(ctx, "billing", add, front); err != nil {
			t.Logf("after %d orphan labels (%s), registering 16 more: %v", labels, time.Since(start).Round(time.Second), err)
			break
		}
		if err := mallory.mergeAnnotations(ctx, "billing", drop, nil); err != nil {
			t.Logf("after %d orphan labels, removing the places: %v", labels, err)
			break
		}
		labels += perRound
		if round%100 == 0 {
			raw := mustJSON(getLease(g, ns, "billing"))
			t.Logf("%s: %d orphan front labels, the Lease %d bytes as JSON", time.Since(start).Round(time.Second), labels, len(raw))
		}
		select {
		case <-ga.Lost():
			t.Errorf("BROKEN: alice lost her live grant after mallory left %d orphan front labels (%s): %v", labels,
				time.Since(start).Round(time.Second), ga.Err())
			return
		default:
		}
	}
	l := getLease(g, ns, "billing")
	raw := mustJSON(l)
	t.Errorf("BROKEN: the Lease carries %d labels (%d bytes as JSON) after %s of mallory's writes", len(l.Labels), len(raw),
		time.Since(start).Round(time.Second))
	stillHolds(g, ns, "billing", ga, time.Now())
}

// Promise: a place is removed whole ("both its keys"). A participant
// removes the entry of its own place and keeps its queued-by: the removal
// rule checks who may remove an entry, not that its queued-by goes with
// it. The queued-by left names no place (lease.Queue does not read it),
// nobody removes it (the controller removes places, not orphan keys), and
// it still counts against its user's bound of 64 places: four pods of a
// ServiceAccount leave 64 and no pod of that ServiceAccount can queue
// again.
func TestRemovedPlaceTakesItsQueuedBy(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := newAdversaryPods(t, ns, "mallory", 1)[0]
	g := NewWithT(t)
	ctx := context.Background()
	g.Expect(mallory.mergeAnnotations(ctx, "billing",
		map[string]any{lease.EntryKey("half"): "0,1,mallory-1", lease.QueuedByKey("half"): mallory.principal}, nil)).To(Succeed())
	err := mallory.mergeAnnotations(ctx, "billing", map[string]any{lease.EntryKey("half"): nil}, nil)
	if err != nil {
		refused(g, err, "both its keys") // the promise holds
		return
	}
	l := getLease(g, ns, "billing")
	t.Errorf("BROKEN: mallory removed the entry of her place and kept its queued-by: %s=%q, with no place lease.Queue reads (%d places)",
		lease.QueuedByKey("half"), l.Annotations[lease.QueuedByKey("half")], len(lease.Queue(l)))
	// Nobody removes it: the lock is free, the queue empty.
	time.Sleep(3 * lease.TurnLength(3*time.Second))
	if _, ok := getLease(g, ns, "billing").Annotations[lease.QueuedByKey("half")]; ok {
		t.Errorf("BROKEN: %s is still there %s later", lease.QueuedByKey("half"), 3*lease.TurnLength(3*time.Second))
	}
}

// Promise: no participant ends another's grant early or keeps an honest
// release from landing. A release hands the lock on with a JSON patch that
// tests the grant and the head's place, and adds the front labels its copy
// of the queue calls for (lease.HandOffPatch): one for a place behind the
// head that has none. If that place was withdrawn between the holder's
// read and its write (the adversary registers a place without a front
// label right behind the head, and withdraws it), the patch adds a label
// for a ticket no longer queued, and the front-label rule refuses the
// whole release: the holder's Release fails, its grant stays on the Lease
// until the controller ends it as lapsed, and the head waits that long.
// The same goes for a grant of a free lock (lease.GrantPatch).
func TestWithdrawnPlaceDoesNotFailAnHonestHandOff(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newPodParticipant(t, ns, "alice", "alice-0")
	bob := newPodParticipant(t, ns, "bob", "bob-0")
	mallory := newAdversaryPods(t, ns, "mallory", 1)[0]
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	bobDone := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	bobTicket := queuedTicket(t, ns, "billing", "bob-1")

	// 1. mallory queues right behind bob, without a front label; alice
	//    reads the Lease (her copy shows the place); mallory withdraws it.
	seq := lease.Queue(getLease(g, ns, "billing"))[0].Seq + 1
	g.Expect(mallory.mergeAnnotations(ctx, "billing",
		map[string]any{lease.EntryKey("behind"): fmt.Sprintf("0,%d,mallory-1", seq), lease.QueuedByKey("behind"): mallory.principal},
		nil)).To(Succeed(), "a registration behind the queue, without a front label")
	aliceLeases := alice.clientset().CoordinationV1().Leases(ns)
	copyOfAlice, err := aliceLeases.Get(ctx, "billing", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mallory.mergeAnnotations(ctx, "billing",
		map[string]any{lease.EntryKey("behind"): nil, lease.QueuedByKey("behind"): nil}, nil)).To(Succeed(), "mallory withdraws her place")

	// 2. alice's release as her client sends it once the Lease changed
	//    since her copy (a JSON patch judged on that copy).
	handOff, head, ok, err := lease.HandOffPatch(copyOfAlice, "alice-1", 3*time.Second, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeTrue())
	g.Expect(head.Ticket).To(Equal(bobTicket))
	_, err = aliceLeases.Patch(ctx, "billing", types.JSONPatchType, handOff.Bytes(), metav1.PatchOptions{})
	if err == nil {
		r := <-bobDone
		g.Expect(r.err).NotTo(HaveOccurred(), "the honest path: bob takes the hand-off up")
		g.Expect(r.grant.Release(ctx)).To(Succeed())
		return
	}
	// The patch tests that each place it labels is still there: it fails
	// as a lost race (the client reads again and retries), never as a
	// refusal that leaves the grant in place.
	if !lease.PatchDidNotApply(err) {
		t.Errorf("BROKEN: alice's hand-off to bob, judged on a copy that showed mallory's place, was refused after mallory withdrew it:\n%s\n%v",
			handOff, err)
	}
	// What alice's client then does: its release fails, the grant stays.
	releasedAt := time.Now()
	if err := ga.Release(ctx); err != nil {
		t.Errorf("alice's Release failed: %v", err)
	}
	r := <-bobDone
	g.Expect(r.err).NotTo(HaveOccurred())
	t.Logf("bob got the lock %s after alice's release", r.at.Sub(releasedAt).Round(time.Millisecond))
	g.Expect(r.grant.Release(ctx)).To(Succeed())
}

// Promise: a participant queues only behind the waiters already queued
// (a new place takes the seq one more than the highest, and a priority
// above 0 needs the verb "prioritize"). The seq rule also lets a new
// place take the highest seq itself (for a crowd registering from the
// same copy), and the queue orders equal seqs by ticket: a place
// registered after bob's, with bob's seq and the ticket "0" (below every
// ticket a client draws, 16 hex digits), goes ahead of bob. alice's
// release then hands the lock to mallory's place, and bob waits as long
// as mallory keeps it (a dead place: a lease and the controller's lapse).
func TestNewPlaceQueuesBehindAnEarlierOne(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newPodParticipant(t, ns, "alice", "alice-0")
	bob := newPodParticipant(t, ns, "bob", "bob-0")
	mallory := newAdversaryPods(t, ns, "mallory", 1)[0]
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	bobDone := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	bobTicket := queuedTicket(t, ns, "billing", "bob-1")
	bobSeq := lease.Queue(getLease(g, ns, "billing"))[0].Seq

	err = mallory.mergeAnnotations(ctx, "billing",
		map[string]any{lease.EntryKey("0"): fmt.Sprintf("0,%d,mallory-1", bobSeq), lease.QueuedByKey("0"): mallory.principal}, nil)
	if err == nil {
		if q := lease.Queue(getLease(g, ns, "billing")); q[0].Ticket != bobTicket {
			t.Errorf("BROKEN: mallory's place, registered after bob's (seq %d, ticket %s), is ahead of it: %+v", bobSeq, bobTicket, q)
		}
	}
	releasedAt := time.Now()
	g.Expect(ga.Release(ctx)).To(Succeed())
	// If the lock went to her place, mallory holds it (renewing, as any
	// holder may) for two leases, then releases it.
	if l := getLease(g, ns, "billing"); l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] == mallory.principal {
		t.Errorf("BROKEN: alice's release handed the lock to mallory's place (fencing token %d), not to bob", lease.Token(l))
		for time.Since(releasedAt) < 6*time.Second {
			time.Sleep(time.Second)
			cur, err := mallory.leases.Get(ctx, "billing", metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			_, err = mallory.leases.Patch(ctx, "billing", types.JSONPatchType, lease.RenewPatch(cur, time.Now()).Bytes(), metav1.PatchOptions{})
			g.Expect(err).NotTo(HaveOccurred(), "mallory renews the grant handed to her place")
		}
		cur, err := mallory.leases.Get(ctx, "billing", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		p, _, _, err := lease.HandOffPatch(cur, "mallory-1", 3*time.Second, time.Now())
		g.Expect(err).NotTo(HaveOccurred())
		_, err = mallory.leases.Patch(ctx, "billing", types.JSONPatchType, p.Bytes(), metav1.PatchOptions{})
		g.Expect(err).NotTo(HaveOccurred(), "mallory hands the lock on to bob")
	}
	r := <-bobDone
	g.Expect(r.err).NotTo(HaveOccurred())
	if took := r.at.Sub(releasedAt); took > 4*time.Second {
		t.Errorf("BROKEN: bob, who queued first, got the lock %s after alice released it (a lease is 3 s)", took.Round(time.Millisecond))
	}
	g.Expect(r.grant.Release(ctx)).To(Succeed())
}
