package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// proofLease is the lease duration of the failover tests: long beside the
// failover they measure, so that a grant ended within proofBound was ended
// by a proof, not by its lease.
const (
	proofLease = 15 * time.Second
	proofBound = 5 * time.Second
)

// proofLock is the lock "billing" of the failover tests, with the given
// spec.failover, in a namespace where the lease guard is enforced; it
// returns the namespace.
func proofLock(t *testing.T, failover locksv1alpha1.Failover) string {
	t.Helper()
	return guardedLockOf(t, testutil.MakeLock("billing", guardedNamespace(t)).LeaseDuration(int32(proofLease/time.Second)).
		Failover(failover).Obj())
}

// A holder frozen in a pod: it acquired with a token bound to its pod and
// renews no more (as a dead process would not).
func frozenPodHolder(t *testing.T, p participant, lockName string) *lock.Grant {
	t.Helper()
	c, err := lock.New(p.cfg, lock.Config{Namespace: p.pod.Namespace, Name: lockName, Identity: podIdentity(p.pod, "frozen"),
		RenewInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	gr, err := c.TryAcquire(context.Background())
	if err != nil || gr == nil {
		t.Fatalf("the holder pod %s could not take %s: %v", p.pod.Name, lockName, err)
	}
	return gr
}

// nextWaiter starts an Acquire by p and returns the channel its grant (or nil
// after proofLease and more) arrives on.
func nextWaiter(t *testing.T, p participant, lockName string) <-chan *lock.Grant {
	t.Helper()
	c, err := lock.New(p.cfg, lock.Config{Namespace: p.pod.Namespace, Name: lockName, Identity: podIdentity(p.pod, "next")})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Grant, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*proofLease)
	t.Cleanup(cancel)
	go func() {
		gr, err := c.Acquire(ctx)
		if err != nil {
			gr = nil
		}
		got <- gr
	}()
	eventually(t, 5*time.Second, func(g Gomega) {
		g.Expect(lease.Queue(getLease(g, p.pod.Namespace, lockName))).NotTo(BeEmpty(), "the waiter's place")
	})
	return got
}

// writePodStatus writes pod's status as its kubelet would (the test
// control plane runs none; field manager kubelet): phase, and one state for
// every container.
func writePodStatus(t *testing.T, pod *corev1.Pod, phase corev1.PodPhase, state corev1.ContainerState, conditions ...corev1.PodCondition) {
	t.Helper()
	writePodStatusAs(t, "kubelet", pod, phase, state, conditions...)
}

// writePodStatusAs is writePodStatus by the field manager manager.
func writePodStatusAs(t *testing.T, manager string, pod *corev1.Pod, phase corev1.PodPhase, state corev1.ContainerState,
	conditions ...corev1.PodCondition) {
	t.Helper()
	ctx := context.Background()
	cur, err := clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading pod %s: %v", pod.Name, err)
	}
	cur.Status.Phase, cur.Status.Conditions = phase, conditions
	cur.Status.ContainerStatuses = nil
	for _, c := range cur.Spec.Containers {
		cur.Status.ContainerStatuses = append(cur.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, State: state})
	}
	if _, err := clientset.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{FieldManager: manager}); err != nil {
		t.Fatalf("writing the status of pod %s: %v", pod.Name, err)
	}
}

var (
	killed = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled",
		FinishedAt: metav1.Now()}}
	stillRunning = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
)

// Each proof of the design's table ends a frozen holder's grant at once: the
// next waiter holds, with the next token, well before the lease; the event
// and the metric name the proof.
func TestProvenDeadHolderFailsOverAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name, proof string
		die         func(t *testing.T, p participant)
	}{
		{"finished: Failed with every container terminated", "finished", func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodFailed, killed)
		}},
		{"deleted after it finished", "", func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodSucceeded, killed)
			p.deletePod(t)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := proofLock(t, "")
			holder := podParticipant(t, ns, "app", "holder")
			held := frozenPodHolder(t, holder, "billing")
			next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")

			died := time.Now()
			tc.die(t, holder)
			var gr *lock.Grant
			select {
			case gr = <-next:
			case <-time.After(proofBound):
			}
			took := time.Since(died)
			if gr == nil {
				t.Fatalf("the waiter did not hold %s within %s of its holder's proven death (lease %s)", "billing", proofBound, proofLease)
			}
			t.Logf("proof to the next holder's grant: %s (lease %s)", took.Round(time.Millisecond), proofLease)
			g := NewWithT(t)
			g.Expect(gr.Token()).To(Equal(held.Token()+1), "the next grant's fencing token")
			eventually(t, 3*time.Second, func(g Gomega) {
				reasons := eventReasons(g, ns, "billing")
				g.Expect(reasons).To(ContainElement(EventHolderProvenDead))
				g.Expect(reasons).NotTo(ContainElement("Expired"), "a proven death is not reported as a lapse")
				proof := tc.proof
				if proof == "" {
					proof = `(finished|deleted)`
				}
				g.Expect(scrape(g)).To(MatchRegexp(`frontdesk_proven_dead_releases_total\{namespace="` + ns + `",proof="` + proof + `"\} 1`))
			})
		})
	}
}

// EventHolderProvenDead is the reason of the event a proven death records
// (controllers.EventHolderProvenDead; the suite does not import the
// controllers package).
const EventHolderProvenDead = "HolderProvenDead"

// What is not proof waits out the lease: the holder keeps its grant, and
// nobody else is granted, for as long as a lease is far from over.
func TestWhatIsNotProofWaitsOutTheLease(t *testing.T) {
	gcMark := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC"}
	for _, tc := range []struct {
		name     string
		failover locksv1alpha1.Failover
		notProof func(t *testing.T, p participant)
	}{
		{"Failed with its container still running (the pod garbage collector, a lost node)", "", func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodFailed, stillRunning, gcMark)
		}},
		{"Failed and terminated, marked by the pod garbage collector", "", func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodFailed, killed, gcMark)
		}},
		{"Failed over the kubelet's terminated statuses by another manager (the pod garbage collector on an out-of-service node)", "",
			func(t *testing.T, p participant) {
				writePodStatus(t, p.pod, corev1.PodRunning, killed)
				writePodStatusAs(t, "kube-controller-manager", p.pod, corev1.PodFailed, killed)
			}},
		{"terminated as ContainerStatusUnknown (the kubelet's guess after its runtime lost the container)", "", func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodFailed, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137, Reason: "ContainerStatusUnknown", FinishedAt: metav1.Now()}})
		}},
		{"a container terminated in a pod still Running (a restart may follow)", "", func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodRunning, killed)
		}},
		{"a force deletion of a pod still running", "", func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodRunning, stillRunning)
			p.deletePod(t)
		}},
		{"a proof on a lock that fails over by lease only", locksv1alpha1.FailoverLease, func(t *testing.T, p participant) {
			writePodStatus(t, p.pod, corev1.PodFailed, killed)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := proofLock(t, tc.failover)
			holder := podParticipant(t, ns, "app", "holder")
			held := frozenPodHolder(t, holder, "billing")
			next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
			tc.notProof(t, holder)
			expectStillHeld(t, ns, "billing", held, next)
		})
	}
}

// expectStillHeld checks, for 3 s (a fifth of the lease), that held is
// still the lock's grant and that nobody else was granted.
func expectStillHeld(t *testing.T, ns, lockName string, held *lock.Grant, next <-chan *lock.Grant) {
	t.Helper()
	NewWithT(t).Consistently(func(g Gomega) {
		lk := getLock(g, ns, lockName)
		g.Expect(lk.Status.Holder).To(Equal(held.Holder()))
		g.Expect(lk.Status.FencingToken).To(Equal(held.Token()))
		g.Expect(next).NotTo(Receive(), "a waiter was granted the lock")
		g.Expect(eventReasons(g, ns, lockName)).NotTo(ContainElement(EventHolderProvenDead))
	}).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// A grant whose principal names no pod is never ended on a proof, even when
// a pod of the same ServiceAccount finishes: the grant was made with a
// token bound to no pod.
func TestAGrantOfNoPodIsNotEndedByAPodsDeath(t *testing.T) {
	ns := proofLock(t, "")
	other := podParticipant(t, ns, "app", "other")
	user := lockUserConfig(t, ns, "system:serviceaccount:"+ns+":app")
	c, err := lock.New(user, lock.Config{Namespace: ns, Name: "billing", Identity: podIdentity(other.pod, "unbound"), RenewInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	held, err := c.TryAcquire(context.Background())
	if err != nil || held == nil {
		t.Fatalf("taking the lock without a pod-bound token: %v", err)
	}
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
	writePodStatus(t, other.pod, corev1.PodFailed, killed)
	expectStillHeld(t, ns, "billing", held, next)
}

// No participant can forge a proof: neither a lock user with a pod-bound
// token nor the aggregated edit role may write a pod's status, so neither
// can make another's holder look dead. (Deleting the pod, which edit may,
// really kills it, gracefully; a force deletion is no proof, above.)
func TestParticipantsCannotForgeAProof(t *testing.T) {
	ns := proofLock(t, "")
	ctx := context.Background()
	victim := podParticipant(t, ns, "victim", "victim")
	held := frozenPodHolder(t, victim, "billing")
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")

	attacker := podParticipant(t, ns, "attacker", "attacker")
	editor := editConfig(t, ns, "editor")
	for name, cfg := range map[string]participant{"lock user (pod-bound token)": attacker,
		"edit (impersonated)": {name: "editor", cfg: editor}} {
		cs, err := kubernetes.NewForConfig(cfg.cfg)
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		forged := victim.pod.DeepCopy()
		forged.Status.Phase = corev1.PodFailed
		forged.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: forged.Spec.Containers[0].Image, State: killed}}
		_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, forged, metav1.UpdateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s wrote the victim pod's status: %v, want Forbidden", name, err)
		}
		_, err = cs.CoreV1().Pods(ns).Patch(ctx, victim.pod.Name, "application/merge-patch+json",
			[]byte(`{"status":{"phase":"Failed"}}`), metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s patched the victim pod's status: %v, want Forbidden", name, err)
		}
	}
	expectStillHeld(t, ns, "billing", held, next)
}

// editConfig binds what the aggregated edit ClusterRole is made of
// (system:aggregate-to-edit and system:aggregate-to-view, as the apiserver
// bootstraps them; no controller manager aggregates them here) to user in
// namespace and returns a config that impersonates that user, once the
// bindings let it delete pods.
func editConfig(t *testing.T, namespace, user string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	for _, role := range []string{"system:aggregate-to-edit", "system:aggregate-to-view"} {
		NewWithT(t).Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{GenerateName: user + "-", Namespace: namespace},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: user}},
		})).To(Succeed())
	}
	cfg := restConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	eventually(t, 5*time.Second, func(g Gomega) {
		can, err := canI(ctx, cfg, namespace, "delete", "pods")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(can).To(BeTrue())
	})
	return cfg
}
