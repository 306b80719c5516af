package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// The attacks of issue 35 ("one grammar for the Lease, a guard that allows
// only what it names"), each made as the attacker would: with a real token
// bound to a pod (TokenRequest), everything config/default installs in
// force, and beside it the honest path.

// patchAs sends a JSON patch of the Lease as p.
func (p participant) patchAs(ns, name string, patch string) error {
	_, err := p.clientset().CoordinationV1().Leases(ns).Patch(context.Background(), name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// place is a place's two annotations for p, as a JSON patch adds them.
func (p participant) place(ticket, value string) string {
	return fmt.Sprintf(`{"op":"add","path":"/metadata/annotations/queue.locks.frontdesk.dev~1%s","value":%s},`+
		`{"op":"add","path":"/metadata/annotations/queued-by.locks.frontdesk.dev~1%s","value":%s}`, ticket, jsonString(value), ticket, jsonString(p.principal))
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a string always encodes
	}
	return string(b)
}

// A place the guard accepted and Go read another way stopped every
// hand-off: one grammar now. Every number of a place is canonical, within
// its range; the guard refuses the rest, so Go never skips a place the
// guard let in.
func TestPlacesOutsideTheGrammarAreRefused(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	g := NewWithT(t)
	for _, value := range []string{
		"00,1,x",                  // a leading zero in the priority
		"-0,1,x",                  // minus zero
		"0,01,x",                  // a leading zero in the seq
		"2147483648,1,x",          // a priority past int32
		"-2147483649,1,x",         // and below it
		"0,9223372036854775807,x", // a seq at int64's end
		"0,1000000000000000,x",    // 16 digits: past the grammar's seq
		"0,1,",                    // no identity
		"0,1, x",                  // an identity with a leading space
		"0,1,x\ny",                // a control character
		"0,1,\u00e9",              // not ASCII
		"0,1," + strings.Repeat("x", 254),
		"+1,1,x", "0,+1,x", "0x1,1,x", "\u0661,1,x",
	} {
		err := mallory.patchAs(ns, "billing", "["+mallory.place("t1", value)+"]")
		refused(g, err, "added in your own name only")
	}
	for _, ticket := range []string{"UPPER", strings.Repeat("a", 41), "pod-0f3c9a6e-5b1d-4c1e-9d55-6f0e2b7a9c11", "a_b"} {
		err := mallory.patchAs(ns, "billing", "["+mallory.place(ticket, "0,1,x")+"]")
		g.Expect(err).To(HaveOccurred(), "ticket %q", ticket)
	}
	// The honest path: a place of the grammar, at the default priority.
	g.Expect(mallory.patchAs(ns, "billing", "["+mallory.place("t1", "0,1,"+strings.Repeat("x", 253))+"]")).To(Succeed())
	g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(HaveLen(1))
}

// A seq at the top of the grammar made every honest waiter compute one past
// it, which the guard refused: a new place takes the seq one above the
// highest in the queue (or equal to it), so seqs grow by one per
// registration at most.
func TestASeqFarAheadIsRefusedAndWaitersStillRegister(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := podParticipant(t, ns, "alice", "alice-0")
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	bob := podParticipant(t, ns, "bob", "bob-0")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	refused(g, mallory.patchAs(ns, "billing", "["+mallory.place("far", "0,999999999999999,x")+"]"), lease.StaleQueueRefusal)
	refused(g, mallory.patchAs(ns, "billing", "["+mallory.place("far", "0,3,x")+"]"), lease.StaleQueueRefusal)
	g.Expect(mallory.patchAs(ns, "billing", "["+mallory.place("near", "0,1,x")+"]")).To(Succeed())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	bobTicket := queuedTicket(t, ns, "billing", "bob-1")
	for _, w := range lease.Queue(getLease(g, ns, "billing")) {
		if w.Ticket == bobTicket {
			g.Expect(w.Seq).To(BeEquivalentTo(2), "bob queues behind mallory's place")
		}
	}
	// mallory's place heads the queue: alice hands the lock to it, bob is
	// next once mallory releases.
	g.Expect(ga.Release(ctx)).To(Succeed())
	g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(mallory.principal))
	g.Expect(mallory.patchAs(ns, "billing", `[{"op":"remove","path":"/spec/holderIdentity"}]`)).To(Succeed(), "mallory releases")
	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.grant.Release(ctx)).To(Succeed())
}

// Thirty pods of one ServiceAccount, sixteen places each, filled the
// Lease's annotations to the apiserver's limit and the lock stayed bricked
// after they were deleted: one user (all the pods of a ServiceAccount)
// holds at most 64 places, and the controller removes the places of pods
// that no longer exist.
func TestPodsOfOneServiceAccountCannotFillTheQueue(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := podParticipant(t, ns, "alice", "alice-0")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	pods := make([]participant, 0, 5)
	for i := range 5 {
		pods = append(pods, podParticipant(t, ns, "flood", fmt.Sprintf("flood-%d", i)))
	}
	seq := 0
	fill := func(p participant, n int) error {
		ops := make([]string, 0, n)
		for i := range n {
			ops = append(ops, p.place(fmt.Sprintf("%s-%02d", p.pod.Name, i), fmt.Sprintf("0,%d,%s", max(seq, 1), strings.Repeat("x", 253))))
		}
		return p.patchAs(ns, "billing", "["+strings.Join(ops, ",")+"]")
	}
	refused(g, fill(pods[0], 17), "at most 16 of one principal")
	for _, p := range pods[:4] {
		g.Expect(fill(p, 16)).To(Succeed(), "pod %s's 16 places", p.pod.Name)
		seq = 1
	}
	refused(g, fill(pods[4], 1), "at most 64 of one user")
	g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(HaveLen(64))

	// The pods go; their places go with them.
	for _, p := range pods {
		p.deletePod(t)
	}
	// Looked up again within 30 s of the last time they were seen alive.
	eventually(t, 45*time.Second, func(g Gomega) {
		g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(BeEmpty())
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("QueueRepaired"))
	})
	stillHolds(g, ns, "billing", ga, time.Now())
	g.Expect(ga.Release(context.Background())).To(Succeed())
}

// Places nobody can read (written around the guard: by a cluster admin, or
// before the guard was installed) are removed by the controller, with an
// event, and never stop a hand-off.
func TestUnreadablePlacesAreRemoved(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := podParticipant(t, ns, "alice", "alice-0")
	bob := podParticipant(t, ns, "bob", "bob-0")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	editLease(g, ns, "billing", func(l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		l.Annotations[lease.EntryKey("zero")] = "00,1,legacy"
		l.Annotations[lease.QueuedByKey("zero")] = "user=legacy"
		l.Annotations[lease.EntryKey("noprincipal")] = "0,1,legacy"
		l.Annotations[lease.QueuedByKey("orphan")] = "user=legacy"
		l.Labels[locksv1alpha1.FrontLabelPrefix+"zero"] = "true"
		return l, nil
	})
	eventually(t, 10*time.Second, func(g Gomega) {
		l := getLease(g, ns, "billing")
		for key := range l.Annotations {
			g.Expect(lease.IsQueueKey(key)).To(BeFalse(), "%s is still there", key)
		}
		g.Expect(l.Labels).NotTo(HaveKey(locksv1alpha1.FrontLabelPrefix + "zero"))
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("QueueRepaired"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	queuedTicket(t, ns, "billing", "bob-1")
	g.Expect(ga.Release(ctx)).To(Succeed())
	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred(), "the hand-off to bob")
	g.Expect(r.grant.Token()).To(Equal(ga.Token() + 1))
	g.Expect(r.grant.Release(ctx)).To(Succeed())
}

// The guard allowed what it did not name: a finalizer of a participant's
// own, labels and annotations of its own, spec fields it does not name.
func TestParticipantWritesNothingTheGuardDoesNotName(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := podParticipant(t, ns, "alice", "alice-0")
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	for name, edit := range map[string]func(l *coordinationv1.Lease){
		"a finalizer": func(l *coordinationv1.Lease) { l.Finalizers = append(l.Finalizers, "example.com/stuck") },
		"an owner": func(l *coordinationv1.Lease) {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "x", UID: "u"}}
		},
		"a label": func(l *coordinationv1.Lease) { l.Labels["example.com/x"] = "y" },
		"an annotation": func(l *coordinationv1.Lease) {
			l.Annotations["example.com/x"] = strings.Repeat("y", 200<<10)
		},
	} {
		err := mallory.forge(ns, "billing", edit)
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: want refused, got %v", name, err)
	}
	// spec.preferredHolder and spec.strategy: refused, or dropped by the
	// apiserver where coordinated leader election is off.
	if err := mallory.forge(ns, "billing", func(l *coordinationv1.Lease) { l.Spec.PreferredHolder = new("mallory-1") }); err == nil {
		g.Expect(getLease(g, ns, "billing").Spec.PreferredHolder).To(BeNil())
	} else {
		refused(g, err, "only the frontdesk manager changes what ties")
	}
	// Alice, the holder, may not either: her grant is hers, the Lease is
	// the lock's.
	err = alice.forge(ns, "billing", func(l *coordinationv1.Lease) { l.Finalizers = append(l.Finalizers, "example.com/stuck") })
	refused(g, err, "only the frontdesk manager changes what ties")
	stillHolds(g, ns, "billing", ga, time.Now())
	g.Expect(ga.Release(context.Background())).To(Succeed())
}

// On a free lock the guard let a participant burn tokens (+1 with no
// holder), write a 200 KB nonce or a holder-principal naming someone else,
// and `kubectl dlock break` worked without the verb "break".
func TestParticipantCannotTamperWithAFreeLock(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	alice := podParticipant(t, ns, "alice", "alice-0")
	g := NewWithT(t)
	refused(g, mallory.patchAs(ns, "billing", `[{"op":"replace","path":"/spec/leaseTransitions","value":1}]`), `which needs the verb "break"`)
	refused(g, mallory.patchAs(ns, "billing",
		fmt.Sprintf(`[{"op":"add","path":"/metadata/annotations/locks.frontdesk.dev~1grant-nonce","value":%q}]`, strings.Repeat("n", 200<<10))),
		"nothing else of a free grant changes")
	refused(g, mallory.patchAs(ns, "billing",
		fmt.Sprintf(`[{"op":"add","path":"/metadata/annotations/locks.frontdesk.dev~1holder-principal","value":%q}]`, alice.principal)),
		"nothing else of a free grant changes")
	_, err := mallory.lockClient(t, ns, "billing", "mallory-1").Break(context.Background())
	refused(g, err, `the verb "break"`)
	run := runPlugin(t, ns, "--as", "system:serviceaccount:"+ns+":mallory", "break", "billing")
	g.Expect(run.code).NotTo(BeZero(), "kubectl dlock break as a lock user: %s", run.stderr)
	// A grant with a 200 KB nonce, or bound to another principal.
	grant := func(principal, nonce string) string {
		now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
		return fmt.Sprintf(`[{"op":"test","path":"/spec/leaseTransitions","value":0},{"op":"replace","path":"/spec/leaseTransitions","value":1},`+
			`{"op":"add","path":"/spec/holderIdentity","value":"mallory-1"},{"op":"add","path":"/spec/acquireTime","value":%q},`+
			`{"op":"add","path":"/spec/renewTime","value":%q},{"op":"add","path":"/metadata/annotations/locks.frontdesk.dev~1holder-principal","value":%q},`+
			`{"op":"add","path":"/metadata/annotations/locks.frontdesk.dev~1grant-nonce","value":%q}]`, now, now, principal, nonce)
	}
	refused(g, mallory.patchAs(ns, "billing", grant(mallory.principal, strings.Repeat("n", 65))), "a grant-nonce of 1 to 64")
	// Bound to alice: refused, or, where config/mutating's lease-principal
	// policy binds grants to their writer, bound to mallory after all.
	if err := mallory.patchAs(ns, "billing", grant(alice.principal, "n1")); err != nil {
		refused(g, err, "is bound to your principal")
		g.Expect(lease.Token(getLease(g, ns, "billing"))).To(BeZero())
	} else {
		g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(mallory.principal))
		g.Expect(mallory.patchAs(ns, "billing", `[{"op":"remove","path":"/spec/holderIdentity"}]`)).To(Succeed())
	}
	// The honest path: the library's grant.
	gm, err := mallory.lockClient(t, ns, "billing", "mallory-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gm.Token()).To(Equal(lease.Token(getLease(g, ns, "billing"))))
	g.Expect(gm.Release(context.Background())).To(Succeed())
}

// A user who may delete Leases in the namespace (the aggregated "edit" role
// may) ended a live grant by deleting its Lease: a delete is a break, and
// needs the verb "break".
func TestDeletingALocksLeaseNeedsTheBreakVerb(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := podParticipant(t, ns, "alice", "alice-0")
	editor := leaseEditor(t, ns)
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	leases := editor.clientset().CoordinationV1().Leases(ns)
	refused(g, leases.Delete(context.Background(), "billing", metav1.DeleteOptions{}), `deleting it ends its grant, like a break`)
	refused(g, leases.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}), `deleting it ends its grant`)
	stillHolds(g, ns, "billing", ga, time.Now())
	g.Expect(ga.Release(context.Background())).To(Succeed())
}

// leaseEditor is a pod participant in ns that may also do all the
// aggregated "edit" role does on Leases (no controller manager aggregates it
// here): delete them, among others.
func leaseEditor(t *testing.T, ns string) participant {
	t.Helper()
	err := k8sClient.Create(context.Background(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "test-lease-editor"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}}},
	})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating ClusterRole test-lease-editor: %v", err)
	}
	editor := podParticipant(t, ns, "editor", "editor-0", "frontdesk-lock-user", "test-lease-editor")
	eventually(t, 5*time.Second, func(g Gomega) { // the edit binding in effect: it may delete Leases
		can, err := canI(context.Background(), editor.cfg, ns, "delete", "leases.coordination.k8s.io")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	return editor
}

// A namespace being deleted takes its locks' Leases with it: the namespace
// controller, which holds no break verb, deletes them, and the guard lets
// anyone do so there (nothing in such a namespace is kept). The suite runs
// no namespace controller, so the editor deletes in its place.
func TestLeasesOfANamespaceBeingDeletedMayBeDeleted(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	editor := leaseEditor(t, ns)
	g := NewWithT(t)
	leases := editor.clientset().CoordinationV1().Leases(ns)
	refused(g, leases.Delete(context.Background(), "billing", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}), `deleting it ends its grant, like a break`)
	g.Expect(clientset.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})).To(Succeed())
	eventually(t, 15*time.Second, func(g Gomega) {
		g.Expect(leases.Delete(context.Background(), "billing", metav1.DeleteOptions{})).To(Succeed())
	})
}

// Identities are bounded strings of printable ASCII: one with a newline and
// escape sequences, which forged lines in `kubectl dlock describe`, is
// refused at the grant and at the place.
func TestIdentitiesOutsideTheGrammarAreRefused(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	g := NewWithT(t)
	forged := "mallory\nFencing token: 999\n\x1b[2K\rHeld:          True"
	_, err := mallory.lockClient(t, ns, "billing", forged).TryAcquire(context.Background())
	g.Expect(err).To(HaveOccurred())
	now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
	refused(g, mallory.patchAs(ns, "billing", fmt.Sprintf(`[{"op":"replace","path":"/spec/leaseTransitions","value":1},`+
		`{"op":"add","path":"/spec/holderIdentity","value":%s},{"op":"add","path":"/spec/acquireTime","value":%q},`+
		`{"op":"add","path":"/spec/renewTime","value":%q},{"op":"add","path":"/metadata/annotations/locks.frontdesk.dev~1holder-principal","value":%q}]`,
		jsonString(forged), now, now, mallory.principal)), "names a holder of 1 to 253 printable ASCII characters")
	refused(g, mallory.patchAs(ns, "billing", "["+mallory.place("t1", "0,1,"+forged)+"]"), "added in your own name only")
}

// A principal outside the grammar (a username with a space, or longer than
// 340 characters) could grant and queue although Go cannot read it: its
// place sat outside both readers' queue, its grant bound to a principal
// frontdesk cannot parse. Only a principal of the grammar grants or queues.
func TestPrincipalsOutsideTheGrammarCannotGrantOrQueue(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	g := NewWithT(t)
	grant := func(p participant) string {
		now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
		return fmt.Sprintf(`[{"op":"replace","path":"/spec/leaseTransitions","value":1},`+
			`{"op":"add","path":"/spec/holderIdentity","value":"x"},{"op":"add","path":"/spec/acquireTime","value":%q},`+
			`{"op":"add","path":"/spec/renewTime","value":%q},{"op":"add","path":"/metadata/annotations/locks.frontdesk.dev~1holder-principal","value":%s}]`,
			now, now, jsonString(p.principal))
	}
	for i, username := range []string{"mallory smith", strings.Repeat("m", lease.MaxUsernameLength+1)} {
		p := userParticipant(t, ns, fmt.Sprintf("outside-%d", i), username)
		refused(g, p.patchAs(ns, "billing", grant(p)), "a username of 1 to 340 printable ASCII characters without spaces")
		refused(g, p.patchAs(ns, "billing", "["+p.place("t1", "0,1,x")+"]"), "a username of 1 to 340 printable ASCII characters without spaces")
	}
	// The honest path: a username of the grammar, as long as it may be.
	p := userParticipant(t, ns, "inside", strings.Repeat("m", lease.MaxUsernameLength))
	g.Expect(p.patchAs(ns, "billing", "["+p.place("t1", "0,1,x")+"]")).To(Succeed())
	g.Expect(p.patchAs(ns, "billing", grant(p))).To(Succeed())
}

// userParticipant is a user (not a ServiceAccount) bound to the shipped
// frontdesk-lock-user ClusterRole in ns by a RoleBinding named binding,
// its requests made through impersonation.
func userParticipant(t *testing.T, ns, binding, username string) participant {
	t.Helper()
	deployDefault(t)
	ctx := context.Background()
	g := NewWithT(t)
	g.Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "frontdesk-lock-user"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: username}},
	})).To(Succeed())
	cfg := restConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: username}
	eventually(t, 5*time.Second, func(g Gomega) { // RBAC caches catch up with the new binding
		can, err := canI(ctx, cfg, ns, "patch", "leases.coordination.k8s.io")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	return participant{name: binding, cfg: cfg, principal: "user=" + username}
}

// The attacks of issue 36 on the controller ("the controller trusts
// principals, not names").

// A participant took a free lock under an identity that names another
// workload's pod (one that opted in to marks for that lock): the controller
// labelled that pod as the holder and wrote the participant's token into
// it. Marks follow the grant's principal now: no marks, and a warning.
func TestMarksFollowThePrincipalNotTheIdentity(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	victim := createPodWith(t, ns, "victim", nil, mayHold("billing"), true)
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	g := NewWithT(t)
	ctx := context.Background()
	gm, err := mallory.lockClient(t, ns, "billing", podIdentity(victim, "x")).TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("PodNotMarked"))
	})
	g.Consistently(func(g Gomega) {
		expectMarked(g, ns, "billing", "", 0, "victim")
		g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(BeEmpty())
	}).WithTimeout(2 * time.Second).Should(Succeed())
	g.Expect(gm.Release(ctx)).To(Succeed())

	// The honest path: the pod's own token, its own identity.
	gv, err := podLockClient(t, victim, "billing", podIdentity(victim, "self")).TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 5*time.Second, func(g Gomega) {
		expectMarked(g, ns, "billing", "victim", gv.Token(), "victim")
		g.Expect(getLock(g, ns, "billing").Status.HolderPod).To(Equal("victim"))
	})
	g.Expect(gv.Release(ctx)).To(Succeed())
}

// After an admin's break, a participant acquired a candidates-mode lock under
// a candidate pod's identity and went away: the controller took the grant
// for its own candidate's, renewed it for ever and marked the candidate, two
// holders of one token. The controller's own grants are bound to its
// principal now: the participant's grant is respected as any holder's and
// never renewed by the controller; once it ended (here its own client
// released it when its window ran out) the candidate is granted anew, with
// the next token.
func TestCandidatesModeTrustsPrincipalsNotIdentities(t *testing.T) {
	ns := guardedNamespace(t)
	web := map[string]string{"app": "web"}
	c0 := createPod(t, ns, "web-0", web, true)
	createReadyLock(t, testutil.MakeLock("leader", ns).LeaseDuration(2).Candidates(web).HandOffDelay(3).Obj())
	mallory := podParticipant(t, ns, "mallory", "mallory-0")
	admin := newParticipant(t, ns, "oncall", "", "frontdesk-lock-user", "frontdesk-lock-admin")
	g := NewWithT(t)
	ctx := context.Background()
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "leader").Status.HolderPod).To(Equal("web-0"))
	})
	_, err := admin.lockClient(t, ns, "leader", "oncall").Break(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	// Within the hand-off delay, mallory takes the free lock as the
	// candidate, and stops renewing at once.
	candidate := locksv1alpha1.PodIdentity(c0.Name, string(c0.UID), "")
	mc, err := lock.New(mallory.cfg, lock.Config{Namespace: ns, Name: "leader", Identity: candidate, RenewInterval: time.Hour})
	g.Expect(err).NotTo(HaveOccurred())
	gm, err := mc.TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	stolen := gm.Token()
	g.Consistently(func(g Gomega) {
		l := getLease(g, ns, "leader")
		if lease.Token(l) == stolen && lease.Holder(l) != "" {
			g.Expect(l.Spec.RenewTime.Time).To(BeTemporally("==", l.Spec.AcquireTime.Time), "the controller renewed mallory's grant")
			expectMarked(g, ns, "leader", "", 0, "web-0")
		}
	}).WithTimeout(3 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	eventually(t, 10*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "leader")
		g.Expect(lk.Status.HolderPod).To(Equal("web-0"))
		g.Expect(lk.Status.FencingToken).To(BeNumerically(">", stolen), "the candidate is granted anew, fenced above mallory's grant")
		expectMarked(g, ns, "leader", "web-0", lk.Status.FencingToken, "web-0")
	})
}
