package integration

// Attacks on failover on proof (controllers/proof.go), made as a
// participant would make them: with a real token bound to a pod
// (podParticipant) or through impersonation of a user bound to the
// namespace's aggregated edit role (editConfig), with config/default
// installed, in namespaces the lease guard applies to. Each asserts the
// refusal, or that the victim still holds (expectStillHeld); the honest
// path is beside it where it makes sense.

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// kubeletPhaseEntry is a managed-fields entry that says the kubelet set
// status.phase through pods/status, as the apiserver records the kubelet's
// own status writes.
func kubeletPhaseEntry() metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		Time: new(metav1.Now()), FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`),
		Subresource: "status"}
}

// phaseManagersOf lists the managers the apiserver stores as owning pod's
// status.phase.
func phaseManagersOf(g Gomega, ns, name string) []string {
	pod, err := clientset.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, e := range pod.ManagedFields {
		if e.FieldsV1 == nil {
			continue
		}
		var f struct {
			Status map[string]json.RawMessage `json:"f:status"`
		}
		if json.Unmarshal(e.FieldsV1.GetRawBytes(), &f) == nil {
			if _, ok := f.Status["f:phase"]; ok {
				out = append(out, e.Manager+"/"+e.Subresource)
			}
		}
	}
	return out
}

// The victim's pod was marked Failed by another manager than the kubelet
// (the pod garbage collector on an out-of-service node, over a container
// its cut-off kubelet last reported terminated: not proof,
// TestWhatIsNotProofWaitsOutTheLease). An editor, who may update and
// patch pods, then writes metadata.managedFields on the pod's main
// resource to say the kubelet set status.phase. Participants cannot write
// pods/status, but the apiserver takes managedFields from any writer of
// the main resource: the forgery must not make the controller take the
// phase for the kubelet's.
func TestProofAttackEditorForgesTheKubeletsOwnershipOfThePhase(t *testing.T) {
	for _, tc := range []struct {
		name  string
		forge func(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) error
	}{
		{"update with managedFields naming the kubelet", func(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) error {
			cur, err := cs.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.ManagedFields = append(cur.ManagedFields, kubeletPhaseEntry())
			_, err = cs.CoreV1().Pods(pod.Namespace).Update(context.Background(), cur, metav1.UpdateOptions{})
			return err
		}},
		{"JSON patch adding a managedFields entry of the kubelet", func(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) error {
			entry, err := json.Marshal(kubeletPhaseEntry())
			if err != nil {
				return err
			}
			patch := []byte(`[{"op":"add","path":"/metadata/managedFields/-","value":` + string(entry) + `}]`)
			_, err = cs.CoreV1().Pods(pod.Namespace).Patch(context.Background(), pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
			return err
		}},
		{"server-side apply of status.phase on the main resource as field manager kubelet", func(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) error {
			body := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + pod.Name + `"},"status":{"phase":"Failed"}}`)
			_, err := cs.CoreV1().Pods(pod.Namespace).Patch(context.Background(), pod.Name, types.ApplyPatchType, body,
				metav1.PatchOptions{FieldManager: "kubelet", Force: new(true)})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := proofLock(t, "")
			victim := podParticipant(t, ns, "victim", "victim")
			held := frozenPodHolder(t, victim, "billing")
			next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")

			// Not proof: Failed, as another manager than the kubelet set it.
			writePodStatus(t, victim.pod, corev1.PodRunning, killed)
			writePodStatusAs(t, "kube-controller-manager", victim.pod, corev1.PodFailed, killed)
			g := NewWithT(t)
			g.Expect(phaseManagersOf(g, ns, victim.pod.Name)).NotTo(ContainElement(HavePrefix("kubelet/")),
				"the kubelet lost status.phase to the other manager")

			editor := kubernetes.NewForConfigOrDie(editConfig(t, ns, "editor"))
			eventually(t, 5*time.Second, func(g Gomega) { // the apiserver admits the editor's write (once RBAC caught up)
				g.Expect(tc.forge(t, editor, victim.pod)).To(Succeed())
			})
			t.Logf("the editor's write was admitted; status.phase is now owned by %v", phaseManagersOf(g, ns, victim.pod.Name))
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("the lock's events: %v; HolderProvenDead: %q", eventReasons(g, ns, "billing"),
						eventMessages(g, ns, "billing", EventHolderProvenDead))
				}
			})
			expectStillHeld(t, ns, "billing", held, next)
		})
	}
}

// Whoever may create pods cannot create one that looks finished (the
// apiserver resets a new pod's status and gives it a UID of its own), nor
// one that shares the victim pod's UID: a pod created with the victim's
// ServiceAccount, its name's twin and its UID, Failed, every container
// terminated and the kubelet named as the phase's manager, is Pending with
// a UID of its own, and the victim keeps its grant.
func TestProofAttackCreatedPodCannotPresetAFinishedStatusOrTheVictimsUID(t *testing.T) {
	ns := proofLock(t, "")
	victim := podParticipant(t, ns, "victim", "victim")
	held := frozenPodHolder(t, victim, "billing")
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
	editor := kubernetes.NewForConfigOrDie(editConfig(t, ns, "editor"))
	g := NewWithT(t)

	forged := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "victim-twin", UID: victim.pod.UID, ManagedFields: []metav1.ManagedFieldsEntry{kubeletPhaseEntry()}},
		Spec: corev1.PodSpec{ServiceAccountName: "victim", AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "main", Image: "frontdesk.invalid/participant:never-pulled"}}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Image: "frontdesk.invalid/participant:never-pulled", State: killed}}},
	}
	got, err := editor.CoreV1().Pods(ns).Create(context.Background(), forged, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.UID).NotTo(Equal(victim.pod.UID), "the apiserver gives a new pod its own UID")
	g.Expect(got.Status.Phase).To(Equal(corev1.PodPending), "the apiserver resets a new pod's status")
	t.Logf("the created pod's phase managers: %v", phaseManagersOf(g, ns, got.Name))
	expectStillHeld(t, ns, "billing", held, next)
}

// A participant cannot make the victim's grant name another pod (its own,
// finished, as its kubelet reported): the guard lets nobody but the grant's
// principal write a live grant, and that principal only its renewTime.
func TestProofAttackVictimsGrantCannotBePointedAtADeadPod(t *testing.T) {
	ns := proofLock(t, "")
	victim := podParticipant(t, ns, "victim", "victim")
	held := frozenPodHolder(t, victim, "billing")
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
	attacker := podParticipant(t, ns, "attacker", "attacker")
	writePodStatus(t, attacker.pod, corev1.PodFailed, killed) // the attacker's own pod, proven dead

	g := NewWithT(t)
	leases := attacker.clientset().CoordinationV1().Leases(ns)
	patch := []byte(`{"metadata":{"annotations":{"` + locksv1alpha1.HolderPrincipalAnnotation + `":"` + attacker.principal + `"}}}`)
	_, err := leases.Patch(context.Background(), "billing", types.MergePatchType, patch, metav1.PatchOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the attacker rewrote the victim's principal: %v", err)
	err = attacker.forge(ns, "billing", func(l *coordinationv1.Lease) {
		l.Annotations[locksv1alpha1.HolderPrincipalAnnotation] = attacker.principal
	})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the attacker rewrote the victim's principal: %v", err)
	g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(victim.principal))
	expectStillHeld(t, ns, "billing", held, next)
}

// An editor evicts the victim's running pod, or deletes it at once (a
// force deletion): neither is proof (the pod may run on); the victim
// keeps its grant for its lease. A pod of the same name and
// ServiceAccount, created after, and then finished as its kubelet
// reported, is another pod (another UID): its death is not the victim's.
func TestProofAttackDeletingAndRecreatingTheVictimsPodIsNoProof(t *testing.T) {
	for _, how := range []string{"eviction", "force deletion"} {
		t.Run(how, func(t *testing.T) {
			ns := proofLock(t, "")
			victim := podParticipant(t, ns, "victim", "victim")
			held := frozenPodHolder(t, victim, "billing")
			next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
			writePodStatus(t, victim.pod, corev1.PodRunning, stillRunning)
			editor := kubernetes.NewForConfigOrDie(editConfig(t, ns, "editor"))
			ctx := context.Background()
			g := NewWithT(t)

			switch how {
			case "eviction":
				g.Expect(editor.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{
					ObjectMeta: metav1.ObjectMeta{Name: victim.pod.Name, Namespace: ns}})).To(Succeed())
			default:
				g.Expect(editor.CoreV1().Pods(ns).Delete(ctx, victim.pod.Name,
					metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})).To(Succeed())
			}
			eventually(t, 10*time.Second, func(g Gomega) {
				_, err := clientset.CoreV1().Pods(ns).Get(ctx, victim.pod.Name, metav1.GetOptions{})
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the victim's pod is still there: %v", err)
			})
			twin, err := editor.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: victim.pod.Name},
				Spec: corev1.PodSpec{ServiceAccountName: "victim", AutomountServiceAccountToken: new(false),
					Containers: []corev1.Container{{Name: "main", Image: "frontdesk.invalid/participant:never-pulled"}}},
			}, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(twin.UID).NotTo(Equal(victim.pod.UID))
			writePodStatus(t, twin, corev1.PodFailed, killed)
			expectStillHeld(t, ns, "billing", held, next)
		})
	}
}

// An ephemeral container added by an editor to the victim's pod would be
// a container the proof waits for (it has no terminated status once the
// pod's other containers stop): the grant would then fail over by its
// lease, not at once, and not never. The aggregated edit role may not
// update pods/ephemeralcontainers: refused by RBAC; the admin's write
// shows the rest.
func TestProofAttackEphemeralContainerDelaysTheProofToTheLeaseOnly(t *testing.T) {
	ns := proofLock(t, "")
	victim := podParticipant(t, ns, "victim", "victim")
	held := frozenPodHolder(t, victim, "billing")
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
	ctx := context.Background()
	g := NewWithT(t)
	add := func(cs kubernetes.Interface) error {
		cur, err := cs.CoreV1().Pods(ns).Get(ctx, victim.pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "frontdesk.invalid/debug:never-pulled"}})
		_, err = cs.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, victim.pod.Name, cur, metav1.UpdateOptions{})
		return err
	}
	err := add(kubernetes.NewForConfigOrDie(editConfig(t, ns, "editor")))
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the editor added an ephemeral container: %v", err)
	g.Expect(add(clientset)).To(Succeed())

	// The kubelet reports the pod Failed, its main container terminated;
	// the ephemeral container has no status.
	writePodStatus(t, victim.pod, corev1.PodFailed, killed)
	expectStillHeld(t, ns, "billing", held, next)
	var gr *lock.Grant
	select {
	case gr = <-next:
	case <-time.After(proofLease + 10*time.Second):
	}
	g.Expect(gr).NotTo(BeNil(), "the lock did not fail over by its lease")
	g.Expect(gr.Token()).To(Equal(held.Token() + 1))
}

// A grant made with a pod's token after the controller saw the pod
// finished came from outside the pod: it is not ended at once, even
// though its pod is dead; it lasts its lease.
func TestProofAttackGrantWithAFinishedPodsTokenWaitsItsLease(t *testing.T) {
	ns := proofLock(t, "")
	attacker := podParticipant(t, ns, "attacker", "attacker")
	writePodStatus(t, attacker.pod, corev1.PodSucceeded, killed)
	time.Sleep(2 * time.Second) // the controller's pod watch has seen it finished
	held := frozenPodHolder(t, attacker, "billing")
	g := NewWithT(t)
	g.Expect(getLease(g, ns, "billing").Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(attacker.principal))
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
	expectStillHeld(t, ns, "billing", held, next)
}

// Where the lease guard does not apply, a principal is only what a client
// wrote: a participant that writes the victim's grant's principal to name
// a pod proven dead (its own, finished) does not get the grant ended on
// that proof. (Without the guard it can write anything else on the Lease
// too: nothing there is enforced.)
func TestProofAttackNoProofWhereTheGuardDoesNotApply(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(int32(proofLease/time.Second)).Obj())
	victim := podParticipant(t, ns, "victim", "victim")
	held := frozenPodHolder(t, victim, "billing")
	attacker := podParticipant(t, ns, "attacker", "attacker")
	writePodStatus(t, attacker.pod, corev1.PodFailed, killed)
	g := NewWithT(t)
	patch := []byte(`{"metadata":{"annotations":{"` + locksv1alpha1.HolderPrincipalAnnotation + `":"` + attacker.principal + `"}}}`)
	_, err := attacker.clientset().CoordinationV1().Leases(ns).Patch(context.Background(), "billing", types.MergePatchType, patch, metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "no guard here")
	g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(Equal(held.Holder()))
	expectStillHeld(t, ns, "billing", held, make(chan *lock.Grant))
}

// A lock user (frontdesk-lock-user only) may not mint a token bound to
// another's pod, so it cannot speak in that pod's name. The built-in edit
// role may (serviceaccounts/token), as it may create pods of any
// ServiceAccount and exec into them: whoever holds it acts as every
// workload of its namespace, and the security model counts it among those
// trusted there (docs/design.md, "Security model"). This test keeps that
// statement true: it fails if either side changes.
func TestProofAttackOnlyNamespaceEditorsMayMintAPodsToken(t *testing.T) {
	ns := proofLock(t, "")
	victim := podParticipant(t, ns, "victim", "victim")
	held := frozenPodHolder(t, victim, "billing")
	ctx := context.Background()
	g := NewWithT(t)
	request := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600)),
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: victim.pod.Name, UID: victim.pod.UID}}}

	attacker := podParticipant(t, ns, "attacker", "attacker")
	_, err := attacker.clientset().CoreV1().ServiceAccounts(ns).CreateToken(ctx, "victim", request, metav1.CreateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a lock user minted a token of the victim's pod: %v", err)
	expectStillHeld(t, ns, "billing", held, make(chan *lock.Grant))

	editor := kubernetes.NewForConfigOrDie(editConfig(t, ns, "editor"))
	_, err = editor.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "victim", request, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "the edit role no longer mints pod tokens: docs/design.md's security model says it does")
}

// Admitted pods (runs-holding) end their grant on the same kubelet report
// (containersStopped), which reads the same managed fields: the victim's
// admitted pod is Failed as another manager than the kubelet set it (not
// proof: the next pod stays gated); an editor then writes the kubelet into
// the pod's managedFields as the phase's manager. The next pod must stay
// gated still.
func TestProofAttackAdmittedPodForgedKubeletPhase(t *testing.T) {
	ns, _, _ := admittedRunningPod(t, 30)
	g := NewWithT(t)
	ctx := context.Background()
	g.Eventually(func() error {
		fresh, err := clientset.CoreV1().Pods(ns).Get(ctx, "first", metav1.GetOptions{})
		if err != nil {
			return err
		}
		fresh.Status.Phase = corev1.PodFailed
		stopContainers(fresh)
		_, err = clientset.CoreV1().Pods(ns).UpdateStatus(ctx, fresh, metav1.UpdateOptions{FieldManager: "kube-controller-manager"})
		return err
	}).Should(Succeed())
	g.Consistently(func(g Gomega) { expectGated(g, ns, "next", "billing") }).
		WithTimeout(2*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "admitted on another manager's Failed")

	editor := kubernetes.NewForConfigOrDie(editConfig(t, ns, "editor"))
	eventually(t, 5*time.Second, func(g Gomega) {
		cur, err := editor.CoreV1().Pods(ns).Get(ctx, "first", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		cur.ManagedFields = append(cur.ManagedFields, kubeletPhaseEntry())
		_, err = editor.CoreV1().Pods(ns).Update(ctx, cur, metav1.UpdateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	})
	t.Logf("status.phase is now owned by %v", phaseManagersOf(g, ns, "first"))
	g.Consistently(func(g Gomega) { expectGated(g, ns, "next", "billing") }).
		WithTimeout(3*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "admitted on the editor's forged managedFields")
}

// An admitted pod whose kubelet last reported its container terminated
// while the pod is still Running (a restart may follow: a cut-off kubelet
// restarts it without reporting) is deleted by an editor gracefully, then
// at once (what `kubectl delete --force` does to a pod stuck terminating).
// Its final state shows a graceful deletion and every container
// terminated, but the report came before the deletion, so it is not the
// kubelet's confirmation that the deletion stopped the pod: the failover
// on proof treats "a container terminated in a pod still Running" as no
// proof, and the admitted grant must not be ended at once on it either.
func TestProofAttackAdmittedPodStaleTerminatedReportThenForceDeletion(t *testing.T) {
	ns, _, _ := admittedRunningPod(t, 30)
	containersStoppedByKubelet(t, ns, "first") // Running, its container terminated, before any deletion
	g := NewWithT(t)
	ctx := context.Background()
	g.Consistently(func(g Gomega) { expectGated(g, ns, "next", "billing") }).
		WithTimeout(2*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "admitted on a terminated container of a Running pod")

	editor := kubernetes.NewForConfigOrDie(editConfig(t, ns, "editor"))
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(editor.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: new(int64(30))})).To(Succeed())
	})
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(getPod(g, ns, "first").DeletionTimestamp).NotTo(BeNil()) })
	time.Sleep(500 * time.Millisecond) // the controller's watch sees the graceful deletion
	g.Expect(editor.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})).To(Succeed())
	g.Consistently(func(g Gomega) { expectGated(g, ns, "next", "billing") }).
		WithTimeout(3*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "admitted on a stale report and a force deletion")
}

// A lock user (frontdesk-lock-user only, a pod-bound token) may not write
// a pod at all: the managed-fields forgery needs pods update or patch
// (edit, or whoever else may write pods).
func TestProofAttackLockUserCannotForgeThePhasesManager(t *testing.T) {
	ns := proofLock(t, "")
	victim := podParticipant(t, ns, "victim", "victim")
	held := frozenPodHolder(t, victim, "billing")
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
	writePodStatus(t, victim.pod, corev1.PodRunning, killed)
	writePodStatusAs(t, "kube-controller-manager", victim.pod, corev1.PodFailed, killed)
	attacker := podParticipant(t, ns, "attacker", "attacker")
	ctx := context.Background()
	g := NewWithT(t)
	cur, err := clientset.CoreV1().Pods(ns).Get(ctx, victim.pod.Name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	cur.ManagedFields = append(cur.ManagedFields, kubeletPhaseEntry())
	_, err = attacker.clientset().CoreV1().Pods(ns).Update(ctx, cur, metav1.UpdateOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a lock user updated a pod: %v", err)
	entry, err := json.Marshal(kubeletPhaseEntry())
	g.Expect(err).NotTo(HaveOccurred())
	_, err = attacker.clientset().CoreV1().Pods(ns).Patch(ctx, victim.pod.Name, types.JSONPatchType,
		[]byte(`[{"op":"add","path":"/metadata/managedFields/-","value":`+string(entry)+`}]`), metav1.PatchOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a lock user patched a pod: %v", err)
	expectStillHeld(t, ns, "billing", held, next)
}
