package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
	fencedelection "github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// A participant is a workload allowed to use locks: a ServiceAccount bound
// to the shipped ClusterRoles, its requests made through impersonation, with
// config/default (and so the lease-guard, lease-principal and
// lease-create-guard policies) installed.
type participant struct {
	name string
	cfg  *rest.Config
	// principal is what the policies record for its requests.
	principal string
	// pod is the pod its token is bound to (podParticipant), or nil.
	pod *corev1.Pod
}

// newParticipant creates ServiceAccount name in ns, binds it to roles
// (frontdesk-lock-user when none are given), and returns a client config
// that impersonates it; podUID, when not "", makes its requests carry a
// token bound to that pod (the user extra a projected token gives).
func newParticipant(t *testing.T, ns, name, podUID string, roles ...string) participant {
	t.Helper()
	deployDefault(t)
	ctx := context.Background()
	g := NewWithT(t)
	if len(roles) == 0 {
		roles = []string{"frontdesk-lock-user"}
	}
	err := k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})
	g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "creating ServiceAccount %s: %v", name, err)
	for _, role := range roles {
		err := k8sClient.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
		})
		g.Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "binding %s: %v", role, err)
	}
	username := "system:serviceaccount:" + ns + ":" + name
	cfg := restConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: username,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	principal := "user=" + username
	if podUID != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/pod-uid": {podUID}}
		principal = "pod=" + podUID + " " + principal
	}
	eventually(t, 5*time.Second, func(g Gomega) { // RBAC caches catch up with the new bindings
		can, err := canI(ctx, cfg, ns, "patch", "leases.coordination.k8s.io")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	return participant{name: name, cfg: cfg, principal: principal}
}

func (p participant) clientset() kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(p.cfg)
}

func (p participant) lockClient(t *testing.T, ns, lockName, identity string) *lock.Client {
	t.Helper()
	c, err := lock.New(p.cfg, lock.Config{Namespace: ns, Name: lockName, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// guardedLock creates a lock in a namespace the lease policies guard and
// waits until they are enforced there (a dry-run write that lowers the
// token is refused).
func guardedLock(t *testing.T, name string, leaseSeconds int32) string {
	t.Helper()
	return guardedLockIn(t, guardedNamespace(t), name, leaseSeconds)
}

// guardedLockIn is guardedLock in namespace ns.
func guardedLockIn(t *testing.T, ns, name string, leaseSeconds int32) string {
	t.Helper()
	return guardedLockOf(t, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: leaseSeconds}})
}

// guardedLockOf creates lock, in a namespace of guardedNamespace, and
// waits until the lease guard is enforced on its Lease; it returns the
// namespace.
func guardedLockOf(t *testing.T, lock *locksv1alpha1.DistributedLock) string {
	t.Helper()
	ns, name := lock.Namespace, lock.Name
	createReadyLock(t, lock)
	probe := newParticipant(t, ns, "probe", "")
	leases := probe.clientset().CoordinationV1().Leases(ns)
	eventually(t, 15*time.Second, func(g Gomega) {
		l := getLease(g, ns, name)
		l.Spec.LeaseTransitions = new(*l.Spec.LeaseTransitions + 5)
		_, err := leases.Update(context.Background(), l, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the lease guard is not enforced yet: %v", err)
	})
	return ns
}

// forge writes edit's version of the Lease as p, with a plain Update of a
// fresh read (what `kubectl get lease -o json | jq ... | kubectl replace`
// does), and returns the apiserver's answer.
func (p participant) forge(ns, name string, edit func(l *coordinationv1.Lease)) error {
	leases := p.clientset().CoordinationV1().Leases(ns)
	l, err := leases.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	edit(l)
	_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
	return err
}

// refused expects err to be the apiserver's refusal, saying want.
func refused(g Gomega, err error, want string) {
	g.ExpectWithOffset(1, apierrors.IsForbidden(err)).To(BeTrue(), "want a refusal saying %q, got %v", want, err)
	g.ExpectWithOffset(1, err.Error()).To(ContainSubstring(want))
}

// stillHolds expects gr to keep its grant: a renewal lands after now (the
// Lease's renewTime moves), and its Context stays live.
func stillHolds(g Gomega, ns, name string, gr *lock.Grant, since time.Time) {
	g.EventuallyWithOffset(1, func(g Gomega) {
		l := getLease(g, ns, name)
		g.Expect(lease.Holder(l)).To(Equal(gr.Holder()))
		g.Expect(lease.Token(l)).To(Equal(gr.Token()))
		g.Expect(l.Spec.RenewTime.Time).To(BeTemporally(">", since))
	}).WithTimeout(15 * time.Second).Should(Succeed())
	g.ExpectWithOffset(1, gr.Err()).NotTo(HaveOccurred())
	g.ExpectWithOffset(1, gr.Context().Err()).NotTo(HaveOccurred())
}

// Attack: a participant writes itself in as holder, the token raised by
// one, over another's live grant. The apiserver refuses it; the holder
// keeps renewing.
func TestParticipantCannotWriteItselfInAsHolder(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = ga.Release(context.Background()) }()
	g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(alice.principal))

	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = new("mallory"), new(*l.Spec.LeaseTransitions+1)
		l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	})
	refused(g, err, "only its holder renews, releases or hands it on")
	_, err = mallory.lockClient(t, ns, "billing", "mallory-1").TryAcquire(context.Background())
	g.Expect(err).To(MatchError(lock.ErrHeld), "the honest path for mallory: wait its turn")
	stillHolds(g, ns, "billing", ga, time.Now())
}

// Attack: shortening the Lease's duration so that waiters judge the holder
// lapsed sooner. Refused on a live grant, and on a grant: every grant
// carries the lock's duration.
func TestParticipantCannotChangeTheLeaseDuration(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = new(int32(1)) })
	refused(g, err, "only its holder renews")
	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[locksv1alpha1.LeaseDurationAnnotation] = "1"
	})
	refused(g, err, "only the frontdesk manager changes what ties Lease")
	stillHolds(g, ns, "billing", ga, time.Now())
	// Its own holder cannot change it either.
	err = alice.forge(ns, "billing", func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = new(int32(60)) })
	refused(g, err, "nothing else of the grant changes")
	g.Expect(ga.Release(context.Background())).To(Succeed())

	// On a free lock: a grant with a duration of its own choosing.
	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = new("mallory"), new(*l.Spec.LeaseTransitions+1)
		l.Spec.AcquireTime, l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &now, &now, new(int32(1))
	})
	refused(g, err, "carries the lock's lease duration")
	gm, err := mallory.lockClient(t, ns, "billing", "mallory-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred(), "the honest path: a grant carrying the lock's duration")
	g.Expect(gm.Timing().LeaseDuration).To(Equal(3 * time.Second))
	g.Expect(gm.Release(context.Background())).To(Succeed())
}

// Attack: releasing another's grant by claiming its identity (kubectl dlock
// release --identity <the holder's>). Identities are strings anyone can
// claim; the grant is bound to the principal that made it.
func TestParticipantCannotReleaseAnothersGrant(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	err = mallory.lockClient(t, ns, "billing", "alice-1").Release(context.Background())
	refused(g, err, "and you are "+mallory.principal)
	run := runPlugin(t, ns, "--as", "system:serviceaccount:"+ns+":mallory", "release", "billing", "--identity", "alice-1")
	g.Expect(run.code).NotTo(BeZero())
	g.Expect(run.stderr).To(ContainSubstring(`the verb "break"`))
	stillHolds(g, ns, "billing", ga, time.Now())
	g.Expect(ga.Release(context.Background())).To(Succeed(), "the honest path: the holder releases")
	g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(BeEmpty())
}

// Two pods of one ServiceAccount are two principals: one cannot end the
// other's grant either.
func TestPodsOfOneServiceAccountCannotEndEachOthersGrants(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	pod1 := newParticipant(t, ns, "worker", "11111111-1111-1111-1111-111111111111")
	pod2 := newParticipant(t, ns, "worker", "22222222-2222-2222-2222-222222222222")
	g := NewWithT(t)
	g1, err := pod1.lockClient(t, ns, "billing", "worker-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(pod1.principal))
	refused(g, pod2.lockClient(t, ns, "billing", "worker-1").Release(context.Background()), "only its holder")
	stillHolds(g, ns, "billing", g1, time.Now())
	g.Expect(g1.Release(context.Background())).To(Succeed())
}

// Attack: setting the token to the end of its range, which made every
// later acquire fail. The token rises by exactly one per grant.
func TestParticipantCannotJumpTheToken(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	err := mallory.forge(ns, "billing", func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = new(int32(2147483647)) })
	refused(g, err, "take it by raising spec.leaseTransitions from 0 to 1 and naming a holder in the same write")
	err = mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = new("mallory"), new(int32(2147483647))
		l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	})
	refused(g, err, "take it by raising spec.leaseTransitions from 0 to 1 and naming a holder in the same write")
	gm, err := mallory.lockClient(t, ns, "billing", "mallory-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred(), "the honest path: the next token")
	g.Expect(gm.Token()).To(BeEquivalentTo(1))
	g.Expect(gm.Release(context.Background())).To(Succeed())
}

// Places in the queue are bound to whoever took them: a participant cannot
// register one in another's name (the apiserver refuses a place whose
// principal is not the request's), nor change or remove another's.
// The honest path: the holder hands the lock to the waiter, which then
// holds it in its own name.
func TestQueuePlacesAreBoundToWhoTookThem(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	bob := newParticipant(t, ns, "bob", "")
	mallory := newParticipant(t, ns, "mallory", "")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	var bobTicket string
	eventually(t, 10*time.Second, func(g Gomega) {
		q := lease.Queue(getLease(g, ns, "billing"))
		g.Expect(q).To(HaveLen(1))
		g.Expect(q[0].Principal).To(Equal(bob.principal))
		bobTicket = q[0].Ticket
	})

	// Registering in bob's name, or with no principal at all: refused.
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.EntryKey("forged")] = "0,1,bob-1"
		l.Annotations[lease.QueuedByKey("forged")] = bob.principal
	}), "added in your own name only")
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.EntryKey("forged")] = "0,1,bob-1"
	}), "added in your own name only")
	// In its own name, behind bob: allowed.
	g.Expect(mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.EntryKey("forged")] = "0,2,bob-1"
		l.Annotations[lease.QueuedByKey("forged")] = mallory.principal
	})).To(Succeed())
	// Changing or removing bob's place.
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[lease.EntryKey(bobTicket)] = "0,1,mallory-1"
	}), "added in your own name only")
	refused(g, mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		delete(l.Annotations, lease.EntryKey(bobTicket))
		delete(l.Annotations, lease.QueuedByKey(bobTicket))
	}), "only by the principal that took it")
	// mallory may remove its own place.
	g.Expect(mallory.forge(ns, "billing", func(l *coordinationv1.Lease) {
		delete(l.Annotations, lease.EntryKey("forged"))
		delete(l.Annotations, lease.QueuedByKey("forged"))
	})).To(Succeed())

	g.Expect(ga.Release(context.Background())).To(Succeed())
	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	handed := getLease(g, ns, "billing")
	g.Expect(handed.Annotations[locksv1alpha1.TicketAnnotation]).To(Equal(bobTicket), "alice's release handed the lock to bob")
	g.Expect(handed.Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(bob.principal))
	stillHolds(g, ns, "billing", r.grant, time.Now())
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}

// A break ends another's live grant only with the permission to break
// locks, and always fences: the token rises by one.
func TestBreakNeedsThePermissionAndFences(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	mallory := newParticipant(t, ns, "mallory", "")
	admin := newParticipant(t, ns, "oncall", "", "frontdesk-lock-user", "frontdesk-lock-admin")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	_, err = mallory.lockClient(t, ns, "billing", "mallory").Break(context.Background())
	refused(g, err, `the verb "break" on distributedlocks.locks.frontdesk.dev billing (ClusterRole frontdesk-lock-admin)`)
	run := runPlugin(t, ns, "--as", "system:serviceaccount:"+ns+":mallory", "break", "billing")
	g.Expect(run.code).NotTo(BeZero())
	g.Expect(run.stderr).To(ContainSubstring(`the verb "break"`))
	stillHolds(g, ns, "billing", ga, time.Now())

	res, err := admin.lockClient(t, ns, "billing", "oncall").Break(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Token).To(Equal(ga.Token() + 1))
	g.Eventually(ga.Lost()).WithTimeout(5 * time.Second).Should(BeClosed())
	g.Expect(lease.Token(getLease(g, ns, "billing"))).To(Equal(ga.Token() + 1))
}

// Taking over a lapsed grant needs no admin: the controller marks the
// grant of a SIGKILLed holder lapsed, and a participant of another
// ServiceAccount then takes the lock over with the next token.
func TestKilledHoldersLockFailsOverToAnotherServiceAccount(t *testing.T) {
	ns := guardedLock(t, "billing", 2)
	newParticipant(t, ns, "alice", "")
	bob := newParticipant(t, ns, "bob", "")
	g := NewWithT(t)
	holder := pluginCommand(t, ns, "--as", "system:serviceaccount:"+ns+":alice", "run", "billing", "--identity", "alice-1", "--", "sleep", "60")
	var stderr strings.Builder
	holder.Stderr = &stderr
	g.Expect(holder.Start()).To(Succeed())
	var token int64
	eventually(t, 10*time.Second, func(g Gomega) {
		l := getLease(g, ns, "billing")
		g.Expect(lease.Holder(l)).To(Equal("alice-1"))
		token = lease.Token(l)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := acquireInBackground(ctx, bob.lockClient(t, ns, "billing", "bob-1"))
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(queueOf(g, ns, "billing")).To(Equal([]string{"bob-1"})) })
	g.Expect(holder.Process.Kill()).To(Succeed())
	_ = holder.Wait()
	g.Expect(holder.ProcessState.String()).To(Equal("signal: killed"), "the holder ended before it was killed: %s", stderr.String())

	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.grant.Token()).To(Equal(token + 1))
	g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(bob.principal))
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("Expired")) })
	g.Expect(r.grant.Release(context.Background())).To(Succeed())
}

// Only the manager creates a lock's Lease: a client that may create Leases
// and finds the Lease missing (a leader-election client starting while the
// controller is down, say) cannot create it at token 0.
func TestOnlyTheManagerCreatesALocksLease(t *testing.T) {
	ns := guardedNamespace(t)
	creator := newParticipant(t, ns, "creator", "")
	g := NewWithT(t)
	g.Expect(k8sClient.Create(context.Background(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "lease-creator", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}}},
	})).To(Succeed())
	g.Expect(k8sClient.Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "creator-creates", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lease-creator"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "creator", Namespace: ns}},
	})).To(Succeed())
	withManagerStopped(t)
	g.Expect(k8sClient.Create(context.Background(), &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "elector", Namespace: ns},
		Spec:       locksv1alpha1.DistributedLockSpec{LeaseName: "operator-lock"},
	})).To(Succeed())
	leases := creator.clientset().CoordinationV1().Leases(ns)
	eventually(t, 15*time.Second, func(g Gomega) {
		_, err := leases.Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "operator-lock"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: new("op-1"), LeaseTransitions: new(int32(0))}}, metav1.CreateOptions{})
		refused(g, err, "only the frontdesk manager creates it")
	})
	_, err := leases.Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "unrelated"}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "a Lease no lock names is anyone's to create")
}

// Real exhaustion: 2^31 grants (248 days at 100 grants/s). A lock at the
// last token of its epoch says so (Ready=False, TokensExhausted, never
// Ready=True) while its holder holds; once the holder releases, the
// controller starts the next token epoch, and the next grant's token is
// above every token of the epoch that ended, as the resource sees it. Run
// under the shipped policies: the manager's epoch start is the one write
// that takes leaseTransitions back to 0, and only the manager may make it.
func TestExhaustedTokensContinueInANewEpoch(t *testing.T) {
	ns := guardedLock(t, "billing", 3)
	alice := newParticipant(t, ns, "alice", "")
	bob := newParticipant(t, ns, "bob", "")
	g := NewWithT(t)
	// Two grants short of the end, as a cluster admin can set it.
	l := getLease(g, ns, "billing")
	l.Spec.LeaseTransitions = new(int32(2147483646))
	_, err := clientset.CoordinationV1().Leases(ns).Update(context.Background(), l, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	refused(g, alice.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[locksv1alpha1.TokenEpochAnnotation] = "1"
	}), "only the frontdesk manager changes what ties Lease")

	last, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(last.Token()).To(BeEquivalentTo(2147483647))
	eventually(t, 5*time.Second, func(g Gomega) {
		ready := meta.FindStatusCondition(getLock(g, ns, "billing").Status.Conditions, locksv1alpha1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(ready.Reason).To(Equal(locksv1alpha1.ReasonTokensExhausted))
		g.Expect(ready.Message).To(ContainSubstring("tokens continue from 2147483649"))
	})
	guard := fencing.NewMemoryGuard()
	write := func(token int64) error {
		return guard.Fence(context.Background(), last.FencingKey(), token, func(context.Context) error { return nil })
	}
	g.Expect(write(last.Token())).To(Succeed())
	g.Expect(last.Release(context.Background())).To(Succeed())

	var next *lock.Grant
	eventually(t, 10*time.Second, func(g Gomega) {
		next, err = bob.lockClient(t, ns, "billing", "bob-1").TryAcquire(context.Background())
		g.Expect(err).NotTo(HaveOccurred())
	})
	g.Expect(next.Token()).To(BeEquivalentTo(2147483649), "epoch 1, leaseTransitions 1")
	g.Expect(write(next.Token())).To(Succeed())
	g.Expect(write(last.Token())).To(MatchError(fencing.ErrStaleToken), "the old epoch's token is stale")
	eventually(t, 5*time.Second, func(g Gomega) {
		lk := getLock(g, ns, "billing")
		g.Expect(lk.Status.FencingToken).To(BeEquivalentTo(2147483649))
		g.Expect(meta.IsStatusConditionTrue(lk.Status.Conditions, locksv1alpha1.ConditionReady)).To(BeTrue())
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("TokenEpochStarted"))
	})
	g.Expect(next.Release(context.Background())).To(Succeed())
}

// Stock client-go leader election keeps working on a lock's Lease under
// the shipped policies, between electors of two ServiceAccounts whose
// LeaseDuration is the lock's: a leader that stops renewing (it dies
// without releasing) is taken over once the controller marks its grant
// lapsed, with the next token; the new leader's grant is bound to it.
func TestStockClientGoElectorsOfTwoServiceAccountsTakeTurns(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stock: client-go's own LeaseLock, whose grants carry a principal
		// only where config/mutating's lease-principal policy writes it;
		// otherwise pkg/leaderelection's Lock, which writes its own.
		stock bool
	}{{"pkg/leaderelection", false}, {"client-go LeaseLock", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.stock && !servesMutatingPolicies() {
				stockElectorIsRefusedWithoutThePrincipalPolicy(t)
				return
			}
			electorsTakeTurns(t, tc.stock)
		})
	}
}

// electorResourceLock is the resourcelock.Interface an elector of p uses:
// client-go's LeaseLock (stock), or pkg/leaderelection's Lock over it.
func electorResourceLock(t *testing.T, ns string, p participant, stock bool) resourcelock.Interface {
	if stock {
		return &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: "billing"},
			Client:     p.clientset().CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: p.name},
		}
	}
	lk, err := fencedelection.NewForConfig(p.cfg, fencedelection.Config{Namespace: ns, Name: "billing", Identity: p.name, RenewDeadline: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

// runLeaderUntil runs a client-go elector on lk until ctx ends, telling
// leaders when it leads; its LeaseDuration is 2s, the lock's.
func runLeaderUntil(ctx context.Context, t *testing.T, lk resourcelock.Interface, leaders chan<- string, name string) {
	runLeaderFor(ctx, t, lk, 2*time.Second, leaders, name)
}

// runLeaderFor is runLeaderUntil with the elector's LeaseDuration (the
// guard refuses a grant whose duration is not the lock's).
func runLeaderFor(ctx context.Context, t *testing.T, lk resourcelock.Interface, leaseDuration time.Duration, leaders chan<- string, name string) {
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lk,
		LeaseDuration: leaseDuration, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { leaders <- name },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Error(err)
		return
	}
	le.Run(ctx)
}

// electorsTakeTurns: a leads, stops renewing as if it died, and b takes
// over with the next token once the controller marked a's grant lapsed;
// each grant is bound to its elector's principal.
func electorsTakeTurns(t *testing.T, stock bool) {
	ns := guardedLock(t, "billing", 2)
	a := newParticipant(t, ns, "elector-a", "")
	b := newParticipant(t, ns, "elector-b", "")
	g := NewWithT(t)
	leaders := make(chan string, 8)
	var wg sync.WaitGroup
	ctxA, stopA := context.WithCancel(context.Background())
	wg.Go(func() { runLeaderUntil(ctxA, t, electorResourceLock(t, ns, a, stock), leaders, a.name) })
	g.Eventually(leaders).WithTimeout(5 * time.Second).Should(Receive(Equal("elector-a")))
	first := getLease(g, ns, "billing")
	g.Expect(first.Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(a.principal))
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	wg.Go(func() { runLeaderUntil(ctxB, t, electorResourceLock(t, ns, b, stock), leaders, b.name) })
	stopA() // no ReleaseOnCancel: a stops renewing, as if it died
	g.Eventually(leaders).WithTimeout(10 * time.Second).Should(Receive(Equal("elector-b")))
	taken := getLease(g, ns, "billing")
	g.Expect(lease.Token(taken)).To(Equal(lease.Token(first) + 1))
	g.Expect(taken.Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(b.principal))
	g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("Expired"), "b took over after the controller's lapse mark")
	stopB()
	wg.Wait()
}

// stockElectorIsRefusedWithoutThePrincipalPolicy: where the cluster serves
// no MutatingAdmissionPolicy, a stock client-go elector's grants carry no
// principal, and the guard refuses them: it never leads, and the lock
// stays free (nothing weaker for its absence).
func stockElectorIsRefusedWithoutThePrincipalPolicy(t *testing.T) {
	ns := guardedLock(t, "billing", 2)
	a := newParticipant(t, ns, "elector-a", "")
	g := NewWithT(t)
	leaders := make(chan string, 1)
	ctx, stop := context.WithTimeout(context.Background(), 3*time.Second)
	defer stop()
	runLeaderUntil(ctx, t, electorResourceLock(t, ns, a, true), leaders, a.name)
	g.Expect(leaders).NotTo(Receive(), "a stock elector led without a principal on its grant")
	g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(BeEmpty())
}
